"""Drawing a frame: every layer's 2-D cloud, the query's attention, and the curves so far.

A frame is one PNG per snapshot. Panels, left to right and top to bottom:

* each **token cloud** ``(B, N, D)`` (embedded tokens, normed tokens, a block's output),
  coloured by token value, filled markers for the first ``k`` positions (those that
  matter), crosses for the others, a star for the query token of the multi-head model,
  and P5's learned query drawn as an arrow on the normed tokens;
* the **attention** of the query over the positions (mean over the probe batch, per
  head), the first ``k`` positions shaded;
* each **sequence cloud** ``(B, D)`` (the pooled token, the query token) twice: coloured
  by the partial sum ``x_1 + … + x_k`` and by the target; the last one over the decision
  regions of the tied readout;
* the **curves** up to the frame's step, from ``metrics.jsonl``: training and test loss
  (spikes marked), test accuracy, gradient norm of each module, the largest eigenvalue of
  each RMSNorm's Jacobian, and κ and attention entropy from the conditioning monitor.

Clouds wider than two dimensions are drawn in the plane of their two principal directions.
Every panel has a title and labelled axes (time in optimizer steps, log scales said so), text
legible at the task's default ``dpi`` (64), and the curves' legends below the panels.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import matplotlib

from src.engine.record import atomic

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib import ticker  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402

from .snapshot import Snapshot  # noqa: E402

COLUMNS = 5
PANEL_IN = 3.2
FONTS = {"axes.titlesize": 10, "axes.labelsize": 9, "xtick.labelsize": 8, "ytick.labelsize": 8}
FONTS |= {"legend.fontsize": 7.5, "figure.titlesize": 12}  # points; at dpi 64, 10 pt is about 9 pixels
TOKEN_POINTS = 1500  # token-cloud points drawn at most (a fixed subsample of the probe)
KAPPA_KEYS = ("kappa/tokens/median", "kappa/X/median", "kappa/W_V/median", "kappa/W_Q/median")
YLABELS = {  # a curve panel's title -> its y axis
    "loss (train, test)": "cross-entropy",
    "test accuracy": "accuracy",
    "gradient norm of each module": "‖∇‖",
    "RMSNorm Jacobian, largest eigenvalue": "λ_max",
    "κ (conditioning monitor)": "κ = σ_max / σ_min",
    "attention entropy": "entropy(P): 1 uniform, 0 one-hot",
}


def planar(points: np.ndarray) -> np.ndarray:
    """``(n, D)`` points as ``(n, 2)``: themselves for ``D = 2``, else their top-2 principal coordinates."""
    if points.shape[-1] == 2:
        return points
    if points.shape[-1] == 1:
        return np.concatenate([points, np.zeros_like(points)], axis=-1)
    centred = points - points.mean(0)
    _, _, vt = np.linalg.svd(centred, full_matrices=False)
    return centred @ vt[:2].T


def draw_token_cloud(ax: Axes, snap: Snapshot, name: str, query_token: bool) -> None:
    """A ``(B, N, D)`` cloud, coloured by token value; ``query_token``: position 0 is a query token."""
    cloud = snap.clouds[name]
    offset = 1 if query_token else 0
    tokens = snap.tokens  # (B, L)
    batch, length = tokens.shape
    positions = np.broadcast_to(np.arange(length), (batch, length))
    flat = planar(cloud.reshape(-1, cloud.shape[-1])).reshape(batch, -1, 2)  # (B, N, 2)
    points = flat[:, offset:].reshape(-1, 2)
    values, positions = tokens.reshape(-1), positions.reshape(-1)
    keep = np.linspace(0, len(points) - 1, min(TOKEN_POINTS, len(points))).astype(int)
    cmap = plt.get_cmap("tab10")
    for relevant, marker in ((False, "x"), (True, "o")):
        sel = keep[(positions[keep] < snap.k) == relevant]
        ax.scatter(
            points[sel, 0],
            points[sel, 1],
            c=cmap(values[sel] % 10),
            marker=marker,
            s=14 if relevant else 10,
            alpha=0.5,
            linewidths=0.8,
        )
    if query_token:
        ax.scatter(flat[:, 0, 0], flat[:, 0, 1], marker="*", s=60, c="k", alpha=0.6)
    if name == "normed" and snap.query is not None and snap.query.shape[0] == 2:
        lim = np.abs(points).max() or 1.0
        q = snap.query / (np.linalg.norm(snap.query) or 1.0) * lim
        ax.annotate("", xy=q, xytext=(0, 0), arrowprops={"arrowstyle": "->", "color": "k", "lw": 1.5})
        ax.text(*q, " q", fontsize=7)
    ax.set_title(f"{name} tokens (o: first k, x: others)")
    ax.set_aspect("equal", adjustable="datalim")
    label_plane(ax, cloud.shape[-1])


def label_plane(ax: Axes, width: int) -> None:
    """Name a cloud's axes: its own coordinates in 2-D, else its principal directions."""
    names = ("dim 1", "dim 2") if width <= 2 else ("principal direction 1", "principal direction 2")
    ax.set(xlabel=names[0], ylabel=names[1])


def draw_sequence_cloud(ax: Axes, snap: Snapshot, name: str, by: str, regions: bool) -> None:
    """A ``(B, D)`` cloud coloured ``by`` partial sum or target, over the readout's decision regions."""
    points = planar(snap.clouds[name])
    if regions and snap.readout is not None and snap.clouds[name].shape[-1] == 2:
        pad = 0.15 * (np.ptp(points, axis=0).max() or 1.0)
        (x0, y0), (x1, y1) = points.min(0) - pad, points.max(0) + pad
        gx, gy = np.meshgrid(np.linspace(x0, x1, 120), np.linspace(y0, y1, 120))
        grid = np.stack([gx.ravel(), gy.ravel()], axis=1)
        labels = (grid @ snap.readout.T).argmax(1).reshape(gx.shape)
        ax.contourf(
            gx, gy, labels, levels=np.arange(snap.readout.shape[0] + 1) - 0.5, cmap="tab10", alpha=0.15
        )
        ax.set_xlim(x0, x1)
        ax.set_ylim(y0, y1)
    if by == "partial sum":  # each cluster labelled with its partial sum, at its centre
        top = max(int(snap.partial_sums.max()), 1)
        ax.scatter(
            points[:, 0], points[:, 1], c=snap.partial_sums, cmap="viridis", vmin=0, vmax=top, s=10, alpha=0.7
        )
        for value in np.unique(snap.partial_sums):
            centre = points[snap.partial_sums == value].mean(0)
            ax.text(*centre, str(int(value)), fontsize=7, ha="center", va="center", weight="bold")
    else:
        ax.scatter(points[:, 0], points[:, 1], c=plt.get_cmap("tab10")(snap.targets % 10), s=10, alpha=0.7)
    ax.set_title(f"{name} by {by}")
    label_plane(ax, snap.clouds[name].shape[-1])


def draw_attention(ax: Axes, snap: Snapshot, name: str) -> None:
    """Mean attention of the query over the positions, one bar group per head."""
    attn = snap.attention[name]  # (B, H, N)
    mean = attn.mean(0)  # (H, N)
    heads, n = mean.shape
    offset = n - snap.tokens.shape[1]  # 1 when the query token is position 0
    labels = (["q"] if offset else []) + [str(i + 1) for i in range(snap.tokens.shape[1])]
    width = 0.8 / heads
    for h in range(heads):
        ax.bar(np.arange(n) + (h - (heads - 1) / 2) * width, mean[h], width=width, label=f"head {h}")
    ax.axvspan(offset - 0.5, offset + snap.k - 0.5, color="tab:green", alpha=0.12)
    ax.set_xticks(np.arange(n), labels)
    ax.set_ylim(0, 1)
    ax.set_title(f"{name}: attention of the query")
    ax.set(xlabel="position (shaded: the first k)", ylabel="attention weight")
    if heads > 1:
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.28), ncol=heads)


def series(
    rows: Iterable[dict[str, Any]], key: str, up_to: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """``(steps, values)`` of ``key`` over the record's rows (finite values, steps ``≤ up_to``)."""
    pairs = [
        (r["step"], r[key])
        for r in rows
        if key in r and isinstance(r[key], (int, float)) and (up_to is None or r["step"] <= up_to)
    ]
    pairs = [(s, v) for s, v in pairs if math.isfinite(v)]
    if not pairs:
        return np.zeros(0), np.zeros(0)
    steps, values = zip(*pairs, strict=True)
    return np.asarray(steps), np.asarray(values, dtype=float)


def keys_with(rows: list[dict[str, Any]], prefix: str) -> list[str]:
    """Every key of the record that starts with ``prefix``, in first-seen order."""
    seen: dict[str, None] = {}
    for r in rows:
        for key in r:
            if key.startswith(prefix):
                seen.setdefault(key)
    return list(seen)


def draw_curves(
    ax: Axes,
    rows: list[dict[str, Any]],
    keys: list[str],
    step: int,
    title: str,
    log: bool = True,
    total: int | None = None,
    label: str | None = None,
    style: str = "-",
    legend_below: bool = False,
) -> None:
    """The named curves up to ``step`` (a vertical line marks it), on a shared x range ``[0, total]``,
    the y axis named after ``title`` (:data:`YLABELS`); ``legend_below``: the legend under the
    panel, off the lines (the caller leaves room), else in its upper right corner."""
    prefixes, drawn = {key.split("/", 1)[0] for key in keys}, False
    for key in keys:
        xs, ys = series(rows, key, up_to=step)
        if len(xs):
            short = key.split("/", 1)[1] if len(prefixes) == 1 and "/" in key else key
            ax.plot(xs, ys, style, lw=0.9, label=f"{label} {short}" if label else short)
            drawn = True
    if log and drawn:
        ax.set_yscale("log")
        ax.yaxis.set_minor_formatter(ticker.NullFormatter())  # minor labels: slow and crowded
        ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:.0e}"))  # no mathtext: fast
    ax.axvline(step, color="k", lw=0.6, alpha=0.5)
    if total:
        ax.set_xlim(0, total)
    ax.set_title(title)
    ylabel = YLABELS.get(title, title)
    ax.set(xlabel="step", ylabel=f"{ylabel} (log scale)" if log and drawn else ylabel)
    if drawn:
        _legend(ax, legend_below)


def _legend(ax: Axes, below: bool) -> None:
    count = len(ax.get_legend_handles_labels()[1])
    if not count:
        return
    under = {"loc": "upper center", "bbox_to_anchor": (0.5, -0.22), "ncol": min(count, 2)}
    ax.legend(**(under if below else {"loc": "upper right"}))


def mark_spikes(ax: Axes, rows: list[dict[str, Any]], step: int, legend_below: bool = False) -> None:
    xs, ys = series(rows, "spike/loss", up_to=step)
    if len(xs):
        ax.scatter(xs, ys, marker="v", color="tab:red", s=16, zorder=3, label="spike")
        _legend(ax, legend_below)


STAGE_COLOURS = {"plateau": "0.6", "rise": "tab:green", "fall": "tab:red"}


def mark_stages(ax: Axes, rows: list[dict[str, Any]], step: int, test_size: int) -> list:
    """Shade the stages of the test accuracy up to ``step`` (:func:`.stages.accuracy_stages`:
    plateaus grey, rises green, falls red) behind the panel's curves; the phases drawn."""
    from .stages import accuracy_stages

    xs, ys = series(rows, "val/acc", up_to=step)
    if len(xs) < 2:
        return []
    phases = accuracy_stages(xs, ys, test_size).phases
    labelled: set[str] = set()
    for phase in phases:
        label = phase.kind if phase.kind not in labelled else None
        labelled.add(phase.kind)
        ax.axvspan(
            phase.start, phase.end, color=STAGE_COLOURS[phase.kind], alpha=0.15, lw=0, label=label, zorder=0
        )
    return phases


def cloud_panels(snap: Snapshot) -> list[tuple[str, str, dict[str, Any]]]:
    """``(kind, name, options)`` for every layer panel of ``snap``, in layer order."""
    query_token = any(a.shape[-1] == snap.tokens.shape[1] + 1 for a in snap.attention.values())
    panels: list[tuple[str, str, dict[str, Any]]] = []
    names = list(snap.clouds)
    for name in names:
        if snap.clouds[name].ndim == 3:
            panels.append(("tokens", name, {"query_token": query_token}))
            if name in snap.attention:
                panels.append(("attention", name, {}))
            elif name == "normed" and "attn" in snap.attention:
                panels.append(("attention", "attn", {}))
        else:
            last = name == names[-1]
            panels.append(("sequence", name, {"by": "partial sum", "regions": last}))
            panels.append(("sequence", name, {"by": "target", "regions": last}))
    return panels


def draw_layer(ax: Axes, snap: Snapshot, kind: str, name: str, options: dict[str, Any]) -> None:
    if kind == "tokens":
        draw_token_cloud(ax, snap, name, **options)
    elif kind == "attention":
        draw_attention(ax, snap, name)
    else:
        draw_sequence_cloud(ax, snap, name, **options)


def curve_panels(rows: list[dict[str, Any]]) -> list[tuple[str, list[str], bool]]:
    """``(title, keys, log scale)`` of the curve panels the record can fill."""
    kappas = [k for k in KAPPA_KEYS if any(k in r for r in rows)]
    return [
        ("loss (train, test)", ["train/loss", "val/loss"], True),
        ("test accuracy", ["val/acc"], False),
        ("gradient norm of each module", keys_with(rows, "grad_norm/"), True),
        ("RMSNorm Jacobian, largest eigenvalue", keys_with(rows, "norm_jacobian/"), True),
        ("κ (conditioning monitor)", kappas, True),
        ("attention entropy", ["entropy/P/median"], False),
    ]


def render_frame(
    snap: Snapshot,
    rows: list[dict[str, Any]],
    path: Path,
    title: str,
    total: int | None,
    dpi: int = 64,
    test_size: int | None = None,
) -> None:
    """Draw the frame of ``snap`` with the record ``rows`` up to its step, to the PNG ``path``: the
    layer panels, then the curves (their legends below them), in :data:`FONTS`. With
    ``test_size``, the loss and accuracy panels shade the stages found so far, and the loss
    panel marks the spikes."""
    with plt.rc_context(FONTS):
        layers, curves = cloud_panels(snap), curve_panels(rows)
        nrows = math.ceil((n := len(layers) + len(curves)) / COLUMNS)
        fig, axes = plt.subplots(nrows, COLUMNS, figsize=(COLUMNS * PANEL_IN, nrows * PANEL_IN * 1.2 + 0.3))
        flat = list(np.ravel(axes))
        try:
            for ax, (kind, name, options) in zip(flat, layers, strict=False):
                draw_layer(ax, snap, kind, name, options)
            for ax, (ctitle, keys, log) in zip(flat[len(layers) :], curves, strict=False):
                draw_curves(ax, rows, keys, snap.step, ctitle, log=log, total=total, legend_below=True)
                if test_size and (ctitle.startswith("loss") or ctitle == "test accuracy"):
                    mark_stages(ax, rows, snap.step, test_size)
                    _legend(ax, True)
                if ctitle.startswith("loss"):
                    mark_spikes(ax, rows, snap.step, legend_below=True)
                if ctitle in ("test accuracy", "attention entropy"):
                    ax.set_ylim(0, 1.02)
            for ax in flat[n:]:
                ax.axis("off")
            fig.suptitle(f"{title}   step {snap.step}")
            fig.subplots_adjust(left=0.05, right=0.99, bottom=0.1, top=0.93, wspace=0.35, hspace=0.8)
            path.parent.mkdir(parents=True, exist_ok=True)
            with atomic.writing(path) as handle:
                fig.savefig(handle, dpi=dpi, format=path.suffix.lstrip(".") or None)
        finally:
            plt.close(fig)
