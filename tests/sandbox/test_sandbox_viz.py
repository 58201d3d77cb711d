"""The visual sandbox: snapshots, frames, the page and GIF of a run, two runs side by side, and resume."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
from conftest import compose, one_error_line
from hydra.utils import instantiate
from PIL import Image

from src.engine import train
from src.engine.loop.seeding import seed_everything
from src.engine.record import checkpoint
from src.engine.record.files import read_metrics
from src.models.sandbox import ClusteringHead, RMSNorm
from src.sandbox.compare import compare_figure, compare_gif, main
from src.sandbox.frames import planar
from src.sandbox.record import redraw
from src.sandbox.snapshot import Snapshot, take_snapshot

SHORT = [
    "task=modadd",
    "trainer.max_steps=40",
    "trainer.val_every=20",
    "trainer.monitor_every=20",
    "trainer.checkpoint_every=20",
    "task.train_size=256",
    "task.test_size=128",
    "task.sandbox.probe_size=64",
    "task.sandbox.grad_every=5",
]


def run(tmp_path, name, *overrides):
    summary = train(compose([*SHORT, *overrides], tmp_path), tmp_path / name)
    return summary, tmp_path / name


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """``attn=standard`` and ``attn=precond`` on the reference model, same seed: frames at 0, 20, 40."""
    root = tmp_path_factory.mktemp("two_runs")
    return [run(root, variant, f"attn={variant}") for variant in ("standard", "precond")]


def page_frames(sandbox_dir) -> list[str]:
    return json.loads(
        re.search(r"const frames = (\[.*?\]);", (sandbox_dir / "index.html").read_text()).group(1)
    )


def test_planar_keeps_2d_clouds_and_the_distances_of_a_planar_cloud():
    rng = np.random.default_rng(0)
    flat = rng.normal(size=(50, 2))
    assert planar(flat) is flat
    basis, _ = np.linalg.qr(rng.normal(size=(5, 2)))  # a plane in R^5
    lifted = flat @ basis.T + 3.0
    dist = np.linalg.norm(flat[:, None] - flat[None], axis=-1)
    projected = planar(lifted)
    np.testing.assert_allclose(np.linalg.norm(projected[:, None] - projected[None], axis=-1), dist, atol=1e-9)


def test_a_snapshot_round_trips_through_its_file(tmp_path):
    torch.manual_seed(0)
    x = torch.randint(0, 2, (8, 12))
    snap = take_snapshot(ClusteringHead(2, 12), x, x[:, :5].sum(1) % 2, x[:, :5].sum(1), k=5, step=7)
    snap.save(tmp_path / "s.npz")
    back = Snapshot.load(tmp_path / "s.npz")
    assert (back.step, back.k, list(back.clouds), list(back.attention)) == (
        7,
        5,
        ["embedded", "normed", "attention output", "output"],
        ["attn"],
    )
    for name in snap.clouds:
        np.testing.assert_array_equal(back.clouds[name], snap.clouds[name])
    np.testing.assert_array_equal(back.query, snap.query)


@pytest.mark.parametrize("backbone", ["sandbox", "sandbox_multihead"])
def test_a_run_writes_a_frame_per_validation_the_page_and_the_gif(tmp_path, backbone, two_runs):
    if backbone == "sandbox":
        summary, run_dir = two_runs[0]
    else:
        summary, run_dir = run(tmp_path, "run", f"backbone={backbone}")
    sandbox = run_dir / "sandbox"
    assert page_frames(sandbox) == [f"frames/step_{s:07d}.png" for s in (0, 20, 40)]  # 0: the init
    assert all((sandbox / f).exists() for f in page_frames(sandbox))
    gif = Image.open(sandbox / "training.gif")
    assert gif.n_frames == 3 and gif.size == Image.open(sandbox / "frames/step_0000040.png").size
    # The last snapshot is the trained model's: a fresh trace of the checkpointed weights gives
    # the same clouds, and its readout is the tied embedding.
    snap = Snapshot.load(sandbox / "snapshots" / "step_0000040.npz")
    model = instantiate(compose([*SHORT, f"backbone={backbone}"], tmp_path).backbone.model, _convert_="all")
    model.load_state_dict(checkpoint.load(run_dir / "checkpoints" / "last.pt")["model"])
    probe = (torch.from_numpy(a) for a in (snap.tokens, snap.targets, snap.partial_sums))
    again = take_snapshot(model, *probe, k=5, step=40)
    for name in snap.clouds:
        np.testing.assert_allclose(again.clouds[name], snap.clouds[name], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(snap.readout, model.token_emb.weight.detach().numpy())
    # Frame 0 is the initialization: the model the run's seed builds, before any step.
    cfg = compose([*SHORT, f"backbone={backbone}"], tmp_path)
    seed_everything(cfg.seed)
    initial = instantiate(cfg.backbone.model, _convert_="all")
    first = Snapshot.load(sandbox / "snapshots" / "step_0000000.npz")
    np.testing.assert_array_equal(first.readout, initial.token_emb.weight.detach().numpy())
    # Every grad_every steps: each module's gradient norm and each RMSNorm's top eigenvalue.
    rows = read_metrics(run_dir)
    grad_rows = [r for r in rows if "grad_norm/total" in r]
    assert [r["step"] for r in grad_rows] == list(range(5, 41, 5))
    norms = {f"norm_jacobian/{n}" for n, m in model.named_modules() if isinstance(m, RMSNorm)}
    assert all({k for k in r if k.startswith("norm_jacobian/")} == norms for r in grad_rows)
    assert summary["steps"] == 40


def test_two_runs_side_by_side(tmp_path, two_runs, capsys):
    (_, a), (_, b) = two_runs
    figure = compare_figure(a, b, tmp_path / "cmp.png")
    assert Image.open(figure).size[0] > Image.open(a / "sandbox/frames/step_0000040.png").size[0] // 2
    gif = Image.open(compare_gif(a, b, tmp_path / "cmp.gif"))
    frame_a, frame_b = (Image.open(r / "sandbox/frames/step_0000040.png") for r in (a, b))
    assert gif.n_frames == 3 and gif.size[1] == frame_a.size[1] + frame_b.size[1]
    capsys.readouterr()
    assert main([str(a), str(b), "--step", "30", "--out", str(tmp_path / "x.png")]) == 2
    out = capsys.readouterr()
    assert one_error_line(out.err).startswith("error: no common snapshot at step 30;") and out.out == ""
    (b / "sandbox" / "frames" / "step_0000020.png").unlink()
    page = redraw(b)  # drawn again from the snapshots alone
    assert page_frames(page.parent) == [f"frames/step_{s:07d}.png" for s in (0, 20, 40)]
    assert (b / "sandbox" / "frames" / "step_0000020.png").exists()


def test_the_frames_shade_the_stages_the_statistic_finds():
    """A staircase (chance to step 400, a rise to 500, 100% after) is shaded plateau, rise,
    plateau over exactly the spans :func:`accuracy_stages` reports; a one-point curve, nothing."""
    import matplotlib.pyplot as plt

    from src.sandbox.frames import mark_stages
    from src.sandbox.stages import accuracy_stages

    rng = np.random.default_rng(0)
    steps = list(range(0, 1001, 25))
    acc = [0.5 if s <= 400 else 1.0 if s >= 500 else 0.5 + (s - 400) / 200 for s in steps]
    acc = [min(1.0, a + rng.normal(0, 0.003)) for a in acc]
    rows = [{"step": s, "split": "val", "val/acc": a} for s, a in zip(steps, acc, strict=True)]
    fig, ax = plt.subplots()
    phases = mark_stages(ax, rows, step=1000, test_size=2048)
    assert [p.kind for p in phases] == ["plateau", "rise", "plateau"]
    assert phases == accuracy_stages(steps, acc, 2048).phases
    spans = [(round(p.get_x()), round(p.get_x() + p.get_width())) for p in ax.patches]
    assert spans == [(round(p.start), round(p.end)) for p in phases]
    assert mark_stages(plt.subplots()[1], rows[:1], step=1000, test_size=2048) == []
    plt.close("all")
