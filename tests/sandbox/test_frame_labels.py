"""A sandbox frame says what it shows: every panel titled, every axis labelled, legends off the
panels, text legible at the task's default dpi. Drawn from a hand-made snapshot (no training)."""

from __future__ import annotations

import numpy as np
import pytest

from src.sandbox import frames
from src.sandbox.snapshot import Snapshot

DPI = 64  # conf/task/modadd.yaml's task.sandbox.dpi
MIN_TEXT_PX = 8  # below this a title is hard to read on a screen


@pytest.fixture
def frame(tmp_path, monkeypatch):
    """The figure ``render_frame`` draws (kept from being closed), and the PNG it wrote."""
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 5, size=(8, 4))
    snap = Snapshot(
        step=30,
        tokens=tokens,
        targets=tokens[:, :2].sum(1) % 5,
        partial_sums=tokens[:, :2].sum(1),
        k=2,
        clouds={"embedded": rng.normal(size=(8, 4, 2)), "pooled": rng.normal(size=(8, 2))},
        attention={"embedded": rng.dirichlet(np.ones(4), size=(8, 2))},
        readout=rng.normal(size=(5, 2)),
    )
    rows = [
        {"step": s, "train/loss": 2.0 / s, "grad_norm/attn": 1.0, "grad_norm/mlp": 0.5} for s in (10, 20, 30)
    ]
    rows += [
        {"step": s, "val/loss": 1.5 / s, "val/acc": s / 40, "kappa/X/median": 3.0, "entropy/P/median": 0.8}
        for s in (10, 20, 30)
    ]
    kept = []
    monkeypatch.setattr(frames.plt, "close", kept.append)
    frames.render_frame(snap, rows, tmp_path / "step.png", "modadd · sandbox", total=40, dpi=DPI)
    return kept[0], tmp_path / "step.png"


def test_every_panel_is_titled_and_labelled_and_legible(frame):
    fig, png = frame
    assert png.read_bytes()[:4] == b"\x89PNG"
    fig.set_dpi(DPI)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    shown = [ax for ax in fig.axes if ax.axison]
    curves = {ax.get_title() for ax in shown if ax.get_xlabel() == "step"}
    assert {"loss (train, test)", "test accuracy", "attention entropy"} <= curves
    for ax in shown:
        assert ax.get_title() and ax.get_xlabel() and ax.get_ylabel()
        assert ("log scale" in ax.get_ylabel()) == (ax.get_yscale() == "log")
        assert ax.title.get_window_extent(renderer).height >= MIN_TEXT_PX


def test_no_legend_lies_over_a_panel(frame):
    fig, _ = frame
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    shown = [ax for ax in fig.axes if ax.axison]
    legends = [ax.get_legend() for ax in shown if ax.get_legend() is not None]
    assert len(legends) >= 3  # loss, accuracy, gradient norms, κ, entropy
    for legend in legends:
        box = legend.get_window_extent(renderer)
        assert not any(box.overlaps(ax.get_window_extent(renderer)) for ax in shown)
