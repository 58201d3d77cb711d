"""``launch.analysis.report --to-wandb``: each compared run's W&B summary gets its experiment's
comparison, the same numbers results.json holds; a run without a W&B run is left alone."""

from __future__ import annotations

import json

from conftest import compose
from wandb_file import offline_run

from launch.analysis import report
from src.engine import train

TINY = ["trainer.max_steps=4", "trainer.val_every=2", "trainer.monitor_every=0", "trainer.progress=none"]
TINY += ["trainer.threads=1", "trainer.checkpoint_every=4", "trainer.test_after=null"]


def test_the_comparison_reaches_each_compared_runs_summary(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WANDB_MODE", "offline")
    sweep = tmp_path / "sweep"
    for attn in ("standard", "precond"):
        for seed in (0, 1, 2):
            logger = "logger=none" if (attn, seed) == ("precond", 2) else "logger=wandb"
            cfg = compose([*TINY, f"attn={attn}", f"seed={seed}", logger], tmp_path)
            train(cfg, sweep / attn / f"seed={seed}")
    assert report.main([str(sweep), "--out", str(tmp_path / "out"), "--to-wandb"]) == 0
    assert "comparisons added to 2 runs' summaries (1 without a W&B run)" in capsys.readouterr().err
    (row,) = [
        r
        for r in json.loads((tmp_path / "out" / "results.json").read_text())
        if r["kind"] == "group" and r["attn"] == "precond"
    ]
    for seed in (0, 1):
        folder = sweep / "precond" / f"seed={seed}"
        wandb_id = json.loads((folder / "identity.json").read_text())["wandb_id"]
        latest = sorted((folder / "wandb").glob(f"offline-run-*-{wandb_id}/run-{wandb_id}.wandb"))[-1]
        summary = offline_run(latest)[1]
        assert summary["vs/standard/effect"] == row["effect"] and summary["vs/standard/n_paired"] == 3
        assert (summary["vs/standard/ci_low"], summary["vs/standard/ci_high"]) == (
            row["ci_low"],
            row["ci_high"],
        )
        assert summary["vs/standard/verdict"] == row["verdict"]
    for seed in (0, 1, 2):  # the baseline's runs are compared with nothing: nothing sent
        folder = sweep / "standard" / f"seed={seed}"
        assert len(list((folder / "wandb").glob("offline-run-*"))) == 1
