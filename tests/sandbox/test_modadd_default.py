"""The default command of the sandbox reaches 100% test accuracy and leaves its pictures, and a
real browser shows its page (slow: minutes; the browser test needs a Chromium on PATH)."""

from __future__ import annotations

import json
import shutil
import subprocess

import numpy as np
import pytest
from conftest import run_cli
from PIL import Image

LAST_FRAME = "frames/step_0012800.png"


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    """``python -m src.run task=modadd`` once: its summary and its sandbox folder."""
    cwd = tmp_path_factory.mktemp("modadd_default")
    result = run_cli(["task=modadd"], cwd=cwd, timeout=1800)
    assert result.returncode == 0, result.stderr[-2000:]
    (summary_path,) = cwd.glob("outputs/runs/modadd/sandbox/standard/seed=*/summary.json")
    return json.loads(summary_path.read_text()), summary_path.parent / "sandbox"


@pytest.mark.slow
@pytest.mark.minutes(2)
def test_the_default_sandbox_run_reaches_full_test_accuracy_and_draws_every_frame(default_run):
    summary, sandbox = default_run
    assert summary["final"]["val/acc"] == 1.0 and summary["steps"] == 200 * 64
    assert len(list((sandbox / "frames").glob("step_*.png"))) == 41  # the initialization and 40 validations
    assert Image.open(sandbox / "training.gif").n_frames == 41
    assert LAST_FRAME in (sandbox / "index.html").read_text()


def colour_counts(image: Image.Image) -> dict[tuple[int, ...], int]:
    """How many pixels of each RGB colour ``image`` has."""
    colours, counts = np.unique(np.asarray(image.convert("RGB")).reshape(-1, 3), axis=0, return_counts=True)
    return {tuple(c): int(n) for c, n in zip(colours.tolist(), counts, strict=True)}


def drawn_share(frame: Image.Image, shot: Image.Image) -> float:
    """The share of ``frame``'s non-white pixels whose colour ``shot`` has at least as often: 1.0
    when the frame is drawn pixel for pixel in the screenshot (the page shows it at its natural
    size), low when it failed to load (the page's text and the GIF's palette colours remain)."""
    wanted = {c: n for c, n in colour_counts(frame).items() if c != (255, 255, 255)}
    have = colour_counts(shot)
    return sum(min(n, have.get(c, 0)) for c, n in wanted.items()) / sum(wanted.values())


@pytest.mark.slow
def test_a_browser_shows_the_pages_last_frame_pixel_for_pixel(default_run, tmp_path):
    """The page in headless Chromium (docs/tasks.md's check): its script ran (the slider's label
    names the last frame) and the screenshot holds that frame's pixels; the same page with its
    frames' paths broken does not (the measure can fail)."""
    screenshots = pytest.importorskip("docs.screenshots", reason="docs/screenshots.py")
    if not any(shutil.which(name) for name in screenshots.BROWSERS):
        pytest.skip("no Chromium here: apt-get install chromium-headless-shell")
    exe = screenshots.browser()
    _, sandbox = default_run
    page = sandbox / "index.html"
    dom = subprocess.run(
        [exe, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", page.resolve().as_uri()],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    assert f'<span id="label">{LAST_FRAME}</span>' in dom

    broken = sandbox / "broken.html"
    broken.write_text(page.read_text().replace("frames/step_", "missing/step_"))
    shares = {}
    for name in (page, broken):
        png = tmp_path / f"{name.stem}.png"
        screenshots.screenshot(exe, name, png, 1280, 1400)
        shares[name.stem] = drawn_share(Image.open(sandbox / LAST_FRAME), Image.open(png))
    assert shares["index"] > 0.99 and shares["broken"] < 0.5, shares
