"""The entry point end to end, in fresh processes: the record, multirun,
DDP, and bad input (resume after SIGKILL: tests/test_reliability.py)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import QUIET, ROOT, run_cli

from src.engine.record import checkpoint
from src.engine.record.files import read_metrics

RUNS = Path("runs/digits/vit_digits/precond/seed=0")
SUMMARY_KEYS = {"task", "backbone", "attn", "seed", "steps", "metric", "final", "best", "wall_s"}


def only_run(root: Path) -> Path:
    (summary,) = root.glob("**/summary.json")
    return summary.parent


def test_a_short_run_writes_the_full_record(tmp_path):
    result = run_cli(
        ["trainer.max_steps=20", "trainer.val_every=10", "trainer.monitor_every=10"], cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    overrides = "trainer.max_steps=20,trainer.monitor_every=10,trainer.val_every=10"
    run = tmp_path / "outputs" / RUNS.with_name(f"seed=0,{overrides}")
    summary = json.loads((run / "summary.json").read_text())
    assert SUMMARY_KEYS <= set(summary) and summary["steps"] == 20 and summary["attn"] == "precond"
    assert set(summary["final"]) == {"val/acc", "val/loss"} and summary["metric"] == "val/acc"
    rows = read_metrics(run)
    assert all({"step", "split"} <= set(r) for r in rows)
    assert [r["step"] for r in rows if r["split"] == "val"] == [0, 10, 20]  # 0: trainer.val_at_start
    assert [r["step"] for r in rows if r["split"] == "monitor"] == [0, 10, 20]  # 0: the state at init
    assert all("kappa/W_Q/median" in r and "entropy/P/median" in r for r in rows if r["split"] == "monitor")
    train = [r for r in rows if r["split"] == "train"]
    assert "train/loss" in train[0] and "lr" in train[0]
    config = (run / "config.yaml").read_text()
    assert "max_steps: 20" in config and "${" not in config  # resolved
    saved = checkpoint.load(run / "checkpoints" / "last.pt")  # weights_only
    assert saved["loop"]["step"] == 20 and "model" in saved


@pytest.mark.slow
@pytest.mark.minutes(0.8)
def test_the_default_command_reaches_90_percent_within_five_minutes(tmp_path):
    """README: `python -m src.run` with no overrides (outputs go where OUTPUT_DIR says)."""
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "src.run"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT), "OUTPUT_DIR": str(tmp_path / "out")},
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "out" / RUNS / "summary.json").read_text())
    assert summary["attn"] == "precond" and summary["final"]["val/acc"] > 0.90
    assert time.monotonic() - started < 300


@pytest.mark.slow
@pytest.mark.minutes(0.6)
def test_a_multirun_over_every_variant_leaves_one_record_each(tmp_path):
    from src import attention

    result = run_cli(["-m", "attn=glob(*,exclude=compose)", "trainer.max_steps=50"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    summaries = [
        json.loads(p.read_text()) for p in (tmp_path / "outputs" / "multirun").glob("**/summary.json")
    ]
    assert sorted(s["attn"] for s in summaries) == sorted(attention.VARIANTS)
    assert all(s["steps"] == 50 for s in summaries)


def comparable(run: Path) -> list[dict]:
    rows = read_metrics(run)
    return [{k: v for k, v in r.items() if k != "throughput"} for r in rows]


@pytest.mark.slow
@pytest.mark.minutes(0.6)
def test_two_ddp_processes_keep_the_global_batch_of_one(tmp_path):
    """The same command on 2 processes trains the same run as on 1: the global batch 32 as 2 x 16,
    the same steps per epoch, the same loss curve (within float tolerance), the same identity.
    The two processes are two *nodes* of one process each (``torchrun --nnodes 2``, node ranks 0
    and 1, a static rendezvous at 127.0.0.1): the multi-node path, on one host."""
    common = [
        "trainer.max_steps=20",
        "trainer.log_every=1",
        "trainer.device=cpu",
        "trainer.val_every=20",
        "task.batch_size=32",
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WANDB_MODE": "disabled"}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    nodes = [
        subprocess.Popen(
            [
                *(sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "1"),
                *("--node_rank", str(rank), "--master_addr", "127.0.0.1", "--master_port", str(port)),
                *("-m", "src.run", *common, "paths.output_dir=ddp", *QUIET),
            ],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    outputs = [node.communicate(timeout=600) for node in nodes]
    for node, (_, err) in zip(nodes, outputs, strict=True):
        assert node.returncode == 0, err[-3000:]
    assert "· fresh · batch 32 = 2 processes × 16 · " in "".join(out + err for out, err in outputs)
    single = run_cli([*common, "paths.output_dir=single"], cwd=tmp_path)
    assert single.returncode == 0, single.stderr

    def curve(root):
        return [r["train/loss"] for r in comparable(only_run(tmp_path / root)) if r["split"] == "train"]

    two, one = curve("ddp"), curve("single")
    assert len(two) == len(one) == 20
    torch.testing.assert_close(torch.tensor(two), torch.tensor(one), rtol=1e-4, atol=1e-5)  # stated tolerance
    summaries = {
        root: json.loads((only_run(tmp_path / root) / "summary.json").read_text())
        for root in ("ddp", "single")
    }
    assert summaries["ddp"]["world_size"] == 2
    assert summaries["ddp"]["batch"] == {"global_batch": 32, "per_process": 16, "world": 2, "accumulate": 1}
    assert summaries["single"]["batch"] == {
        "global_batch": 32,
        "per_process": 32,
        "world": 1,
        "accumulate": 1,
    }
    assert summaries["ddp"]["steps_per_epoch"] == summaries["single"]["steps_per_epoch"]
    assert only_run(tmp_path / "ddp").relative_to(tmp_path / "ddp") == only_run(
        tmp_path / "single"
    ).relative_to(tmp_path / "single")  # the same folder name: the number of processes is not part of the run
