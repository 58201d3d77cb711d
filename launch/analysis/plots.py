"""The report's PNG plots: per task × backbone, the main metric and κ over training.

Each experiment is one line (mean over its seeds, a band from the lowest to the highest seed);
κ's panels add the attention entropy beside κ(P), which a collapsed attention drives to 1.
Every panel is named and defined in its title (the monitor's quantities,
:mod:`src.conditioning.monitor`, docs/methods.md#condition-numbers), every axis labelled (log
scales said so), time in optimizer steps, and the legend sits outside the panels, below them.
:func:`figures` builds the figures (the tests read them), :func:`pngs` renders them as PNG bytes,
which :mod:`launch.analysis.report` writes with its other files, all whole or none. Apart from
:mod:`launch.analysis.report` because they need matplotlib, imported only when drawing.
"""

from __future__ import annotations

import io
import math
import statistics
import textwrap
from typing import Any

from .records import Run, options, variant_label
from .results import describe, not_attn

LOG = "κ (log scale)"
# key -> (title: the quantity named and defined, y label); κ(M) = σ_max / σ_min
PANELS = {
    "kappa/W_Q/median": ("κ(W_Q): condition number of each head's query weight (D×d)", LOG),
    "kappa/W_K/median": ("κ(W_K): condition number of each head's key weight (D×d)", LOG),
    "kappa/W_V/median": ("κ(W_V): condition number of each head's value weight (D×d)", LOG),
    "kappa/tokens/median": ("κ(tokens): condition number of the embedded tokens entering layer 1", LOG),
    "kappa/X/median": ("κ(X): condition number of the tokens entering attention (after the norm)", LOG),
    "kappa/A/median": ("κ(A): condition number of each head's output (before the output projection)", LOG),
    "kappa/P/median": ("κ(P): condition number of the attention matrix (softmax probabilities)", LOG),
    "entropy/P/median": ("entropy(P): row entropy over log(#keys); 1 uniform, 0 one-hot", "entropy (0 to 1)"),
}
COLUMNS = 3
LABEL_WIDTH = 40  # characters of a legend line; a longer label wraps


def figures(runs: list[Run]) -> list[tuple[str, Any]]:
    """``(file name, matplotlib Figure)`` per task × backbone: the main metric over training, and
    κ over training, per experiment (its variant with its options, and its other settings where
    the experiments of that task and backbone differ)."""
    import matplotlib

    matplotlib.use("Agg")
    done = [r for r in runs if r.rows and r.metric and r.status != "unreadable"]
    settings = options(runs)

    def label(run: Run) -> str:
        extra = describe(not_attn(settings.get(run.experiment, {})))
        return variant_label(run) + ("" if extra == "—" else f" ({extra})")

    out = []
    for task, backbone in sorted({(r.task, r.backbone) for r in done}):
        group = [r for r in done if (r.task, r.backbone) == (task, backbone)]
        out.append((f"curves_{task}_{backbone}.png", _metric_figure(group, label, f"{task} · {backbone}")))
        monitored = [k for k in PANELS if any(r.series(k, "monitor")[0] for r in group)]
        if monitored:
            fig = _kappa_figure(group, label, monitored, f"{task} · {backbone}")
            out.append((f"kappa_{task}_{backbone}.png", fig))
    return out


def pngs(runs: list[Run]) -> dict[str, bytes]:
    """``{file name: PNG content}`` of :func:`figures`: drawn in memory, so that nothing is written
    until the report writes all its files (:func:`launch.analysis.report.write_files`)."""
    return {name: _png(fig) for name, fig in figures(runs)}


def _metric_figure(group: list[Run], label, title: str) -> Any:
    import matplotlib.pyplot as plt

    metric = group[0].metric
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name in sorted({label(r) for r in group}):
        _band(ax, [r.series(metric) for r in group if label(r) == name], name)
    ax.set(xlabel="optimizer step", ylabel=f"{metric} (validation)")
    ax.set_title(f"{title}: {metric} over training\n(mean over seeds; band: lowest to highest seed)")
    _legend_below(fig, [ax])
    return fig


def _kappa_figure(group: list[Run], label, keys: list[str], title: str) -> Any:
    import matplotlib.pyplot as plt

    slots = panel_slots(keys)
    rows = math.ceil((slots[-1] + 1) / COLUMNS)
    fig, axes = plt.subplots(rows, COLUMNS, figsize=(4.6 * COLUMNS, 3.6 * rows), squeeze=False)
    flat = [ax for row in axes for ax in row]
    used = [flat[slot] for slot in slots]
    for ax, key in zip(used, keys, strict=True):
        for name in sorted({label(r) for r in group}):
            _band(ax, [r.series(key, "monitor") for r in group if label(r) == name], name)
        what, ylabel = PANELS[key]
        ax.set_title("\n".join(textwrap.wrap(what, 42)), fontsize=9)
        ax.set(xlabel="optimizer step", ylabel=ylabel)
        if key.startswith("kappa/"):
            ax.set_yscale("log")
        else:
            ax.set_ylim(0, 1.05)
    for ax in flat:
        if ax not in used:
            fig.delaxes(ax)
    fig.suptitle(f"{title}: conditioning monitor, median over the model's heads and layers")
    _legend_below(fig, used)
    return fig


def panel_slots(keys: list[str]) -> list[int]:
    """The grid slot of each panel, in order, with entropy(P) kept in κ(P)'s row: a κ(P) that
    would end a row moves to the next one."""
    slots, slot = [], 0
    for i, key in enumerate(keys):
        beside = key == "kappa/P/median" and keys[i + 1 : i + 2] == ["entropy/P/median"]
        if beside and slot % COLUMNS == COLUMNS - 1:
            slot += 1
        slots.append(slot)
        slot += 1
    return slots


def _legend_below(fig, axes: list) -> None:
    """One legend for the figure, below its panels (outside every axes) and inside the figure:
    labels wrapped at :data:`LABEL_WIDTH` characters, as many columns as the figure's width holds,
    the figure made taller by the legend's height, and constrained layout placing the panels
    above it (``loc="outside lower center"``)."""
    handles, labels = axes[0].get_legend_handles_labels()
    if not handles:
        return
    labels = ["\n".join(textwrap.wrap(label, LABEL_WIDTH)) for label in labels]
    fig.set_layout_engine("constrained")
    renderer = fig.canvas.get_renderer()
    for ncol in range(min(len(labels), 3), 0, -1):
        legend = fig.legend(handles, labels, loc="outside lower center", ncol=ncol, fontsize=8)
        box = legend.get_window_extent(renderer)
        if box.width <= 0.98 * fig.bbox.width or ncol == 1:
            break
        legend.remove()
    fig.set_figheight(fig.get_figheight() + box.height / fig.dpi)


def _band(ax, series: list[tuple[list[int], list[float]]], label: str) -> None:
    """Mean over seeds, with the band between the lowest and highest seed, at their common steps."""
    series = [s for s in series if s[0]]
    if not series:
        return
    common = sorted(set.intersection(*(set(steps) for steps, _ in series)))
    per_seed = [[dict(zip(steps, values, strict=True))[s] for s in common] for steps, values in series]
    columns = list(zip(*per_seed, strict=True))
    mean = [statistics.fmean(c) for c in columns]
    (line,) = ax.plot(common, mean, label=f"{label} (n={len(series)})")
    if len(series) > 1:
        ax.fill_between(
            common, [min(c) for c in columns], [max(c) for c in columns], alpha=0.2, color=line.get_color()
        )


def _png(fig) -> bytes:
    """``fig`` as PNG bytes; the figure is closed."""
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight", pad_inches=0.1)
    plt.close(fig)
    return buffer.getvalue()
