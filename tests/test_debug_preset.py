"""``debug=fdr``: a few steps of every phase, in a folder of its own, with no checkpoint, so that
the same command without it starts afresh (lightning-hydra-template's ``debug=fdr``)."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import compose, run_cli
from smoke.lra import SMALL_LISTOPS, TINY

from src.engine import train
from src.engine.record import checkpoint
from src.engine.record.files import read_metrics


def splits_by_step(run: Path) -> dict[str, list[int]]:
    rows = read_metrics(run)
    return {split: [r["step"] for r in rows if r["split"] == split] for split in ("train", "val", "monitor")}


def test_fdr_runs_every_phase_writes_no_checkpoint_and_the_real_run_starts_at_step_0(tmp_path):
    command = ["trainer.max_steps=3", "trainer.threads=1"]  # run with and without debug=fdr
    debug = run_cli(["debug=fdr", *command], cwd=tmp_path)
    assert debug.returncode == 0, debug.stderr
    (summary,) = (tmp_path / "outputs" / "debug").glob("*/digits/vit_digits/precond/seed=0,*/summary.json")
    run = summary.parent
    assert json.loads(summary.read_text())["steps"] == 3
    assert splits_by_step(run) == {"train": [1, 2, 3], "val": [0, 1, 2, 3], "monitor": [0, 1, 2, 3]}
    assert not list((tmp_path / "outputs").rglob("*.pt")) and not (tmp_path / "outputs" / "runs").exists()

    real = run_cli(command, cwd=tmp_path)
    assert real.returncode == 0, real.stderr
    said = real.stdout + real.stderr
    assert " · fresh · " in said and "resum" not in said
    (summary,) = (tmp_path / "outputs" / "runs").glob("**/summary.json")
    assert json.loads(summary.read_text())["steps"] == 3
    assert checkpoint.load(summary.parent / "checkpoints" / "last.pt")["loop"]["step"] == 3


def test_fdr_tests_the_weights_in_memory_where_the_task_tests_after_training(tmp_path):
    cfg = compose(
        [
            "debug=fdr",
            "task=lra_listops_small",
            *TINY,
            *SMALL_LISTOPS,
            f"paths.data_dir={tmp_path / 'data'}",
            "trainer.test_after=best",
        ],  # fmt: skip
        tmp_path,
    )
    summary = train(cfg, tmp_path / "run")
    result = json.loads((tmp_path / "run" / "eval-test.json").read_text())
    assert summary["test"] == result["metrics"] and result["checkpoint_step"] == 2
    assert result["samples"] == cfg.task.eval_batch_size  # eval_batches=1
    assert "in memory" in result["checkpoint_file"] and not list(tmp_path.rglob("*.pt"))
