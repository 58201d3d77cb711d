"""The docs follow the registry and build: the variants table of docs/variants.md (every option),
the README's status table and docs/methods.md name each registered variant (a variant registered
but not documented, or documented but gone, fails here, naming it), and the mkdocs site builds
with --strict (a broken link, a missing anchor or a page left out of the nav fails)."""

from __future__ import annotations

import dataclasses
import html
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest
from conftest import ROOT

from src import attention


def variant_rows(path: str, heading: str) -> dict[str, str]:
    """``{variant: its row}`` from the first table (``| variant |``) under ``heading`` in ``path``."""
    lines = (ROOT / path).read_text().split(heading, 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| variant |"))
    end = next(i for i in range(start, len(lines)) if not lines[i].startswith("|"))
    rows = lines[start + 2 : end]  # below the header and its separator
    return {re.match(r"\| `([a-z_0-9]+)`", row).group(1): row for row in rows}


def test_the_variants_table_has_one_row_per_registered_variant_with_its_options():
    rows = variant_rows("docs/variants.md", "## The attention variants")
    assert list(rows) == list(attention.VARIANTS)
    for name, cls in attention.VARIANTS.items():
        for option in dataclasses.fields(cls):
            assert f"`{option.name}`" in rows[name], (
                f"docs/variants.md: {name}'s row does not name option {option.name}"
            )


def test_the_readme_status_table_has_one_row_per_registered_variant():
    rows = variant_rows("README.md", "## Variants and what our readings found")
    assert list(rows) == list(attention.VARIANTS)


def test_the_readme_is_a_landing_page_with_the_commands_on_its_first_screen():
    lines = (ROOT / "README.md").read_text().splitlines()
    first_screen = "\n".join(lines[:40])
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; move sections to docs/"
    for command in ("make install && make run", "make test", "python -m src.run task=coco attn=precond"):
        assert command in first_screen, f"README's first 40 lines lack {command!r}"


def test_the_docs_site_builds_strict(tmp_path):
    """``mkdocs build --strict``: a broken link or anchor, or a page outside the nav, fails."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    warnings = [line for line in done.stderr.splitlines() if not line.startswith("INFO")]
    assert done.returncode == 0, "\n".join(warnings)
    api = (tmp_path / "site" / "api" / "index.html").read_text()
    for name in ("src.attention.apply", "src.engine.task.Task", "src.engine.task.Task.train_loss"):
        assert f'id="{name}"' in api, f"docs/api.md does not render {name}"
    site = tmp_path / "site"
    for page in site.rglob("*.html"):  # offline: every script, style, font and image is the site's own
        loads = r'<(?:script|img)[^>]*\bsrc="([^"]+)"|<link[^>]*\bhref="([^"]+)"'
        fetched = re.findall(loads, page.read_text())
        remote = [url for pair in fetched for url in pair if re.match(r"(https?:)?//", url)]
        assert not remote, f"{page.relative_to(site)} loads {remote[0]} from another host"
    home = html.unescape(re.sub(r"<[^>]+>", "", (site / "index.html").read_text()))
    readme = (ROOT / "README.md").read_text()
    for name in ("families", "variants", "verdicts"):  # the README's tables, included (docs/index.md)
        section = readme.split(f"[start:{name}]", 1)[1].split(f"[end:{name}]", 1)[0]
        for row in (line for line in section.splitlines() if line.startswith("| ") and "| --- |" not in line):
            for cell in row.strip("| ").split(" | "):
                text = re.sub(r"`|\*\*", "", cell)
                assert text in home, f"the home page lacks the README's {name} cell {text!r}"


def test_methods_has_a_section_per_variant_and_the_code_cites_it():
    methods = (ROOT / "docs" / "methods.md").read_text()
    headings = set(re.findall(r"^## (\S+)", methods, flags=re.M))
    assert set(attention.VARIANTS) <= headings
    citing = [p for p in (ROOT / "src").rglob("*.py") if "docs/methods.md" in p.read_text()]
    stale = [
        str(p)
        for p in [
            *ROOT.glob("src/**/*.py"),
            *ROOT.glob("tasks/**/*.py"),
            *ROOT.glob("launch/**/*.py"),
            *ROOT.glob("conf/**/*.yaml"),
        ]
        if re.search(r"(?<!docs/)\bMETHODS\.md", p.read_text())
    ]
    assert citing and not stale, f"cite docs/methods.md, not METHODS.md: {stale}"


@pytest.mark.slow
def test_the_site_screenshots_show_the_landing_page_and_a_long_page(tmp_path):
    """``make docs-check``'s screenshots: two PNGs of the requested size, not blank (a page that
    failed to load is one colour). Looking at them stays a person's job (docs/index.md says what
    to look for)."""
    screenshots = pytest.importorskip("docs.screenshots", reason="docs/screenshots.py")
    if not any(shutil.which(name) for name in screenshots.BROWSERS):
        pytest.skip("no Chromium here: apt-get install chromium-headless-shell")
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "-q", "--site-dir", str(site)],
        cwd=ROOT,
        env=env,
        check=True,
        timeout=120,
    )
    from PIL import Image

    for png, (_, width, height) in zip(
        screenshots.main(site, tmp_path / "png"), screenshots.PAGES.values(), strict=True
    ):
        image = Image.open(png).convert("RGB")
        assert image.size == (width, height)
        assert len(image.getcolors(maxcolors=1 << 20) or range(1 << 20)) > 50, f"{png} is blank"


RUNNABLE = "<!-- runnable: tests/test_docs.py runs this block as shown -->"


def runnable_blocks() -> list[tuple[str, str]]:
    """``(page:line, code)`` of every python block marked :data:`RUNNABLE` under docs/."""
    blocks = []
    for page in sorted((ROOT / "docs").glob("*.md")):
        lines = page.read_text().splitlines()
        for i, line in enumerate(lines):
            if line.strip() == RUNNABLE:
                assert lines[i + 1] == "```python", f"{page.name}:{i + 1}: the mark is above no python block"
                end = lines.index("```", i + 2)
                blocks.append((f"{page.name}:{i + 2}", "\n".join(lines[i + 2 : end])))
    return blocks


def test_the_docs_python_snippets_marked_runnable_run_as_shown():
    """Each marked block runs in a fresh namespace, imports included (one interpreter, so torch
    loads once); a block that needs a name it does not import, or whose assert fails, names its
    page and line."""
    blocks = runnable_blocks()
    assert {where.split(":")[0] for where, _ in blocks} >= {"extending.md", "variants.md"}
    driver = textwrap.dedent(
        """
        import json, sys, traceback
        failed = []
        for where, code in json.load(sys.stdin):
            try:
                exec(compile(code, where, "exec"), {"__name__": "__snippet__"})
            except BaseException:
                failed.append(where + ": " + traceback.format_exc(limit=-1).strip().splitlines()[-1])
        print("\\n".join(failed))
        """
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "-c", driver],
        input=json.dumps(blocks),
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "", done.stdout
