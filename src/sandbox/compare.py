"""Two sandbox runs side by side: ``python -m src.sandbox.compare RUN_A RUN_B``.

For two run folders (say ``attn=standard`` and ``attn=precond`` on the same seed), one
figure: a row of layer panels per run, drawn from their snapshots at the same step (by
default the last step both have), and a row of curves with both runs overlaid (training
loss with its spikes, test accuracy, total gradient norm, the largest RMSNorm eigenvalue,
κ of the tokens). ``--gif`` also stacks the two runs' frames, step by step, into one
animation.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402

from src.command import command_parser, run_command  # noqa: E402
from src.engine.record.files import read_metrics  # noqa: E402
from src.errors import ConfigError  # noqa: E402

from .frames import PANEL_IN, cloud_panels, draw_curves, draw_layer, keys_with, series  # noqa: E402
from .page import write_gif  # noqa: E402
from .record import frame_path, planned_steps, run_title  # noqa: E402
from .snapshot import Snapshot, snapshot_path, snapshot_steps  # noqa: E402

CURVES = [
    ("training loss", ["train/loss"], True),
    ("test accuracy", ["val/acc"], False),
    ("total gradient norm", ["grad_norm/total"], True),
    ("RMSNorm Jacobian, largest eigenvalue", None, True),  # every norm_jacobian/ key
    ("κ of the embedded tokens", ["kappa/tokens/median"], True),
]


def common_steps(run_a: Path, run_b: Path) -> list[int]:
    """The steps both runs have a snapshot of."""
    return sorted(set(snapshot_steps(run_a / "sandbox")) & set(snapshot_steps(run_b / "sandbox")))


def compare_figure(run_a: Path, run_b: Path, out: Path, step: int | None = None, dpi: int = 80) -> Path:
    """Draw the side-by-side figure of two runs at ``step`` (default: their last common snapshot)."""
    runs = [Path(run_a), Path(run_b)]
    steps = common_steps(*runs)
    if not steps:
        raise ConfigError(f"{runs[0]} and {runs[1]} have no snapshot step in common (sandbox/snapshots/)")
    step = steps[-1] if step is None else step
    if step not in steps:
        raise ConfigError(f"no common snapshot at step {step}; common steps: {steps[0]} … {steps[-1]}")
    snaps = [Snapshot.load(snapshot_path(r / "sandbox", step)) for r in runs]
    rows = [read_metrics(r) for r in runs]
    titles = [run_title(r) for r in runs]
    layers = [cloud_panels(s) for s in snaps]
    cols = max(max(len(p) for p in layers), len(CURVES))
    fig, axes = plt.subplots(3, cols, figsize=(cols * PANEL_IN, 3 * PANEL_IN + 0.6), squeeze=False)
    try:
        for r, (snap, panels, title) in enumerate(zip(snaps, layers, titles, strict=True)):
            for c, (kind, name, options) in enumerate(panels):
                draw_layer(axes[r, c], snap, kind, name, options)
            for ax in axes[r, len(panels) :]:
                ax.axis("off")
            axes[r, 0].set_ylabel(title, fontsize=7)
        total = planned_steps(runs[0])
        for c, (title, keys, log) in enumerate(CURVES):
            ax = axes[2, c]
            for run_rows, label, style in zip(rows, ("A", "B"), ("-", "--"), strict=True):
                draw_curves(
                    ax,
                    run_rows,
                    keys or keys_with(run_rows, "norm_jacobian/"),
                    step,
                    title,
                    log,
                    total,
                    label,
                    style,
                )
                xs, ys = series(run_rows, "spike/loss", up_to=step)
                if c == 0 and len(xs):
                    ax.scatter(xs, ys, marker="v", s=14, color="tab:red" if label == "A" else "tab:purple")
            if title == "test accuracy":
                ax.set_ylim(0, 1.02)
        for ax in axes[2, len(CURVES) :]:
            ax.axis("off")
        fig.suptitle(f"A: {titles[0]}    B: {titles[1]}    step {step}", fontsize=10)
        fig.subplots_adjust(left=0.05, right=0.99, bottom=0.05, top=0.93, wspace=0.3, hspace=0.35)
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=dpi)
    finally:
        plt.close(fig)
    return out


def compare_gif(run_a: Path, run_b: Path, out: Path, ms_per_frame: int = 120) -> Path:
    """The two runs' frames at their common steps, A above B, as one GIF."""
    stacked = []
    tmp_dir = out.parent / (out.stem + "_frames")
    tmp_dir.mkdir(parents=True, exist_ok=True)
    for step in common_steps(Path(run_a), Path(run_b)):
        paths = [frame_path(Path(r) / "sandbox", step) for r in (run_a, run_b)]
        if not all(p.exists() for p in paths):
            continue
        a, b = (np.asarray(Image.open(p).convert("RGB")) for p in paths)
        width = max(a.shape[1], b.shape[1])
        pad = [np.pad(m, ((0, 0), (0, width - m.shape[1]), (0, 0)), constant_values=255) for m in (a, b)]
        path = tmp_dir / f"step_{step:07d}.png"
        Image.fromarray(np.concatenate(pad, axis=0)).save(path)
        stacked.append(path)
    if not stacked:
        raise ConfigError(f"{run_a} and {run_b} have no frame step in common (sandbox/frames/)")
    return write_gif(stacked, out, ms_per_frame)


def main(argv: list[str] | None = None) -> int:
    parser = command_parser(__spec__.name, __doc__)
    parser.add_argument("run_a", type=Path, help="a run folder (with sandbox/snapshots/)")
    parser.add_argument("run_b", type=Path, help="the run to set beside it")
    parser.add_argument("--step", type=int, default=None, help="the step to draw (default: last common)")
    parser.add_argument("--out", type=Path, default=Path("sandbox_compare.png"), help="the figure's path")
    parser.add_argument("--gif", type=Path, default=None, help="also write the stacked frames as this GIF")
    return run_command(parser, draw, argv)


def draw(args: argparse.Namespace) -> None:
    """The command's work: the figure, and the GIF where asked."""
    print(compare_figure(args.run_a, args.run_b, args.out, args.step))
    if args.gif is not None:
        print(compare_gif(args.run_a, args.run_b, args.gif))


if __name__ == "__main__":
    raise SystemExit(main())
