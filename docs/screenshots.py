"""Screenshots of the built docs site, for a person to look at: ``make docs-check``.

    python docs/screenshots.py SITE_DIR OUT_DIR

writes ``OUT_DIR/landing.png`` (the first screen of the landing page) and ``OUT_DIR/long.png``
(the whole of the longest page, Tasks and data layouts) with a headless Chromium: Debian's
``chromium-headless-shell`` (``apt-get install chromium-headless-shell``) or ``chromium``.
Playwright's own browser download is not needed. What to look for: the navigation on the left,
the page's table of contents on the right, tables with their header row, code blocks highlighted.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

BROWSERS = ("chromium-headless-shell", "chromium", "chromium-browser", "google-chrome")
PAGES = {"landing": ("index.html", 1280, 900), "long": ("tasks/index.html", 1280, 9000)}


def browser() -> str:
    """The first headless-capable Chromium on PATH, or exit 2 naming how to get one."""
    found = next((shutil.which(name) for name in BROWSERS if shutil.which(name)), None)
    if found is None:
        sys.exit(
            "error: no Chromium found (looked for " + ", ".join(BROWSERS) + "); "
            "apt-get install chromium-headless-shell"
        )
    return found


def screenshot(exe: str, page: Path, out: Path, width: int, height: int) -> None:
    """One PNG of ``page`` at ``width`` × ``height`` CSS pixels."""
    subprocess.run(
        [
            exe,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            f"--window-size={width},{height}",
            f"--screenshot={out}",
            page.resolve().as_uri(),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )


def main(site: Path, out: Path) -> list[Path]:
    if not (site / "index.html").is_file():
        sys.exit(f"error: {site}/index.html not found; build the site first with `make docs`")
    out.mkdir(parents=True, exist_ok=True)
    exe = browser()
    written = []
    for name, (path, width, height) in PAGES.items():
        png = out / f"{name}.png"
        screenshot(exe, site / path, png, width, height)
        written.append(png)
        print(f"wrote {png}")
    return written


if __name__ == "__main__":
    main(
        Path(sys.argv[1] if len(sys.argv) > 1 else "site"),
        Path(sys.argv[2] if len(sys.argv) > 2 else "outputs/docs-screenshots"),
    )
