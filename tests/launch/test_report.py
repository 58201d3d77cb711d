"""The report on hand-made records with known numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from launch import report
from launch.records import read_runs, read_wandb

STEPS = list(range(100, 1001, 100))


def write_run(
    root: Path,
    attn: str,
    seed: int,
    curve: list[float] | None,
    status: str = "completed",
    error: str | None = None,
    task: str = "imagenet",
    backbone: str = "vit_base",
) -> Path:
    """A run folder as the suite writes it; ``curve`` is val/acc at STEPS (its last value is final)."""
    folder = root / task / backbone / attn / f"seed={seed}"
    folder.mkdir(parents=True)
    cfg = {
        "task": {"name": task, "metric": "val/acc"},
        "backbone": {"name": backbone},
        "attn": {"variant": attn},
        "seed": seed,
    }
    OmegaConf.save(OmegaConf.create(cfg), folder / "config.yaml")
    rows = [{"step": s, "split": "val", "val/acc": v} for s, v in zip(STEPS, curve or [], strict=False)]
    rows += [
        {"step": s, "split": "monitor", "kappa/W_Q/median": 3.0 - i / 10} for i, s in enumerate(STEPS[:3])
    ]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if status != "incomplete":
        summary = {
            "status": status,
            "metric": "val/acc",
            "steps_per_epoch": 10,
            "error": error,
            "final": {"val/acc": curve[-1]} if status == "completed" else {},
        }
        (folder / "summary.json").write_text(json.dumps(summary))
    return folder


@pytest.fixture
def runs_root(tmp_path) -> Path:
    ramp = lambda end, at: [min(end, end * (s / at)) for s in STEPS]  # noqa: E731  reaches `end` at step `at`
    for seed, final in enumerate([0.80, 0.81, 0.82]):
        write_run(tmp_path, "standard", seed, ramp(final, 1000))
    write_run(tmp_path, "cond_init", 0, [*[0.5] * 6, 0.81, 0.82, 0.83, 0.83])  # reaches 0.81 at step 700
    write_run(tmp_path, "cond_init", 1, [*[0.5] * 5, 0.81, 0.82, 0.84, 0.85, 0.85])  # at step 600
    write_run(tmp_path, "precond", 0, None, status="failed", error="RuntimeError: planted failure")
    write_run(tmp_path, "precond", 1, [0.3, 0.4], status="incomplete")
    return tmp_path


def test_means_stds_and_gains_are_right(runs_root):
    cells = {c.attn: c for c in report.table(read_runs([runs_root]))}
    assert set(cells) == {"standard", "cond_init"}  # failed and incomplete runs are not averaged
    std = cells["standard"]
    assert (std.n, std.mean, std.std) == (3, pytest.approx(0.81), pytest.approx(0.01))
    ci = cells["cond_init"]
    assert (ci.n, ci.mean, ci.std) == (2, pytest.approx(0.84), pytest.approx(0.0141421356))
    assert ci.gain == pytest.approx(0.03)
    assert (ci.paper.value, ci.paper.baseline, ci.paper.source) == (0.815, pytest.approx(0.803), "P4")


def test_steps_to_reach_the_baseline_are_right(runs_root):
    conv = {c.attn: c for c in report.convergence(read_runs([runs_root]))}
    assert conv["standard"].steps == 1000 and conv["standard"].ratio == 1.0
    ci = conv["cond_init"]
    assert (ci.steps, ci.reached, ci.seeds, ci.ratio, ci.epochs) == (650, 2, 2, 0.65, 65.0)


def test_the_report_lists_failed_and_missing_runs(runs_root, capsys):
    assert report.main([str(runs_root), "--out", str(runs_root / "out")]) == 0
    text = (runs_root / "out" / "report.md").read_text()
    assert (
        "| imagenet | vit_base | cond_init | val/acc | 84.00 ± 1.41 | 2 | 3.00 | 81.50 (P4) | 1.20 | 2.50 |"
        in text
    )
    assert "| imagenet | vit_base | cond_init | 650 | 65.0 | 2/2 | 0.65 | 0.70 |" in text
    assert "## Runs that did not complete (2)" in text
    assert "RuntimeError: planted failure" in text and "last logged step 300" in text  # its monitor rows
    for name in ("curves_imagenet_vit_base.png", "kappa_imagenet_vit_base.png"):
        assert (runs_root / "out" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_no_runs_is_an_error(tmp_path, capsys):
    assert report.main([str(tmp_path)]) == 2
    assert "no run folders" in capsys.readouterr().err


class FakeWandbRun:
    def __init__(self, attn, seed, final, state="finished"):
        self.id, self.state = f"{attn}-{seed}", state
        self.config = {
            "task": {"name": "digits", "metric": "val/acc"},
            "backbone": {"name": "vit_digits"},
            "attn": {"variant": attn},
            "seed": seed,
        }
        self.summary = {"final/val/acc": final} if state == "finished" else {}

    def scan_history(self):
        return [{"_step": 10, "val/acc": 0.5}, {"_step": 20, "kappa/W_Q/median": 2.0}]


class FakeApi:
    def runs(self, path):
        assert path == "me/project"
        return [
            FakeWandbRun("standard", 0, 0.9),
            FakeWandbRun("standard", 1, 0.92),
            FakeWandbRun("spectral", 0, 0, "crashed"),
        ]


def test_runs_can_come_from_wandb():
    runs = read_wandb("me/project", api=FakeApi())
    (cell,) = report.table(runs)
    assert cell.mean == pytest.approx(0.91) and cell.n == 2
    crashed = [r for r in runs if r.status != "completed"]
    assert [(r.attn, r.status) for r in crashed] == [("spectral", "failed")]
    assert runs[0].series("kappa/W_Q/median", "monitor") == ([20], [2.0])
