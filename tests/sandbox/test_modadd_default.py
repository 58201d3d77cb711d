"""The default command of the sandbox reaches 100% test accuracy and leaves its pictures (slow: minutes)."""

from __future__ import annotations

import json

import pytest
from conftest import run_cli
from PIL import Image


@pytest.mark.slow
def test_the_default_sandbox_run_reaches_full_test_accuracy_and_draws_every_frame(tmp_path):
    result = run_cli(["task=modadd"], cwd=tmp_path, timeout=1800)
    assert result.returncode == 0, result.stderr[-2000:]
    (summary_path,) = tmp_path.glob("outputs/runs/modadd/sandbox/standard/seed=*/summary.json")
    summary = json.loads(summary_path.read_text())
    assert summary["final"]["val/acc"] == 1.0 and summary["steps"] == 200 * 64
    sandbox = summary_path.parent / "sandbox"
    assert len(list((sandbox / "frames").glob("step_*.png"))) == 41  # the initialization and 40 validations
    assert Image.open(sandbox / "training.gif").n_frames == 41
    assert "frames/step_0012800.png" in (sandbox / "index.html").read_text()
