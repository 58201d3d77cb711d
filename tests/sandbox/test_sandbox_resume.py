"""A sandbox run stopped mid-way and rerun ends as the uninterrupted run does: metrics (spikes and
gradient norms included), weights and snapshots, bit for bit; and so do P5's statistics read from
them (the stages of the accuracy curve, the clustering-head series)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import compose
from test_spikes import plant_spike

from src.engine import train
from src.engine.record import checkpoint
from src.engine.record.files import read_metrics
from src.sandbox.clustering import clustering_series
from src.sandbox.snapshot import Snapshot
from src.sandbox.stages import accuracy_stages
from tasks.modadd import SparseModularAddition

OVERRIDES = [
    "task=modadd",
    "trainer.max_steps=60",
    "trainer.val_every=20",
    "trainer.monitor_every=20",
    "trainer.checkpoint_every=20",
    "task.train_size=512",
    "task.test_size=128",
    "task.sandbox.probe_size=32",
    "task.sandbox.grad_every=7",  # a window that straddles the checkpoint at step 40
    "task.sandbox.spike_window=30",
    "task.sandbox.gif=false",
]


def comparable(run_dir) -> list[dict]:
    rows = read_metrics(run_dir)
    return [{k: v for k, v in r.items() if k != "throughput"} for r in rows]


def test_a_stopped_and_rerun_sandbox_run_ends_bit_identical(tmp_path, monkeypatch):
    plant_spike(monkeypatch, at=50, factor=1e4)  # a spike after the resume, judged on pre-resume losses
    whole = tmp_path / "whole"
    train(compose(OVERRIDES, tmp_path), whole)

    stopped = tmp_path / "stopped"
    original = SparseModularAddition.after_backward

    def dies_at_step_45(self, model, step, loss):
        if step == 45:
            raise RuntimeError("stopped")
        return original(self, model, step, loss)

    monkeypatch.setattr(SparseModularAddition, "after_backward", dies_at_step_45)
    with pytest.raises(RuntimeError, match="stopped"):
        train(compose(OVERRIDES, tmp_path), stopped)
    assert checkpoint.load(stopped / "checkpoints" / "last.pt")["loop"]["step"] == 40
    monkeypatch.setattr(SparseModularAddition, "after_backward", original)
    train(compose(OVERRIDES, tmp_path), stopped)

    assert comparable(whole) == comparable(stopped)
    assert any("spike/loss" in r for r in comparable(whole))
    a, b = (checkpoint.load(r / "checkpoints" / "last.pt")["model"] for r in (whole, stopped))
    assert all(torch.equal(a[k], b[k]) for k in a)
    for step in (0, 20, 40, 60):
        sa, sb = (
            Snapshot.load(r / "sandbox" / "snapshots" / f"step_{step:07d}.npz") for r in (whole, stopped)
        )
        assert all(np.array_equal(sa.clouds[n], sb.clouds[n]) for n in sa.clouds)

    def statistics(run_dir):
        rows = [r for r in read_metrics(run_dir) if r.get("split") == "val" and "val/acc" in r]
        found = accuracy_stages([r["step"] for r in rows], [r["val/acc"] for r in rows], 128)
        return found, clustering_series(run_dir / "sandbox")

    recorded = [json.loads((r / "summary.json").read_text())["statistics"] for r in (whole, stopped)]
    assert recorded[0] == recorded[1] and recorded[0]["stages/plateaus"] >= 1
    assert {"cluster/attn/clustering", "cluster/attn/emerged"} <= set(recorded[0])
    (stages_a, series_a), (stages_b, series_b) = statistics(whole), statistics(stopped)
    assert recorded[0]["stages/plateaus"] == stages_a.plateaus
    assert stages_a == stages_b and stages_a.phases
    assert series_a == series_b and series_a[0] == [0, 20, 40, 60]
