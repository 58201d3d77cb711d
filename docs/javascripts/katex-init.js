// Renders the math that pymdownx.arithmatex (generic mode) leaves as \( … \) and \[ … \] in
// span/div.arithmatex, with the KaTeX vendored under javascripts/katex/: no CDN at view time.
// document$ is mkdocs-material's page observable (it fires on every page, instant loading or not).
document$.subscribe(({ body }) => {
  for (const element of body.querySelectorAll(".arithmatex")) {
    renderMathInElement(element, {
      delimiters: [
        { left: "\\(", right: "\\)", display: false },
        { left: "\\[", right: "\\]", display: true },
      ],
      throwOnError: false,
    });
  }
});
