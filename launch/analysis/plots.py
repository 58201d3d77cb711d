"""The report's PNG plots: per task × backbone, the main metric and κ over training; per task, the
rows' effects against the baseline (a forest plot); per task × backbone, the paired differences
over training.

Each experiment is one line (mean over its seeds, a band from the lowest to the highest seed);
κ's panels add the attention entropy beside κ(P), which a collapsed attention drives to 1. The
baseline is drawn in :data:`BASELINE_COLOUR` in every plot, and a series of one point as a marker.
The forest plot (:func:`forest_figure`) draws each comparison of
:func:`launch.analysis.verdicts.effects` (the effect and its 95% interval, 0 and ±δ marked), the
numbers of report.md's Effects section; the difference curves (:func:`paired_differences`) the
mean per-seed difference reading − baseline at every step both arms logged (step 0 included where
the record has it: the monitor's quantities), with its 95% Student-t interval over the paired
seeds.
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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .records import Run, options, variant_label
from .results import describe, not_attn, printed_scale
from .verdicts import Verdict, effects, is_baseline, pairings

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
BASELINE_COLOUR = "black"  # the baseline's line (and the 0 of a difference) in every plot


def figures(runs: list[Run], baseline: str | None = None) -> list[tuple[str, Any]]:
    """``(file name, matplotlib Figure)`` per task × backbone: the main metric over training, and
    κ over training, per experiment (its variant with its options, and its other settings where
    the experiments of that task and backbone differ); ``baseline`` (``standard`` where None) in
    :data:`BASELINE_COLOUR`."""
    import matplotlib

    matplotlib.use("Agg")
    done = [r for r in runs if r.rows and r.metric and r.status != "unreadable"]
    label, baselines = labeller(runs, baseline or "standard")

    out = []
    for task, backbone in sorted({(r.task, r.backbone) for r in done}):
        group = [r for r in done if (r.task, r.backbone) == (task, backbone)]
        out.append(
            (f"curves_{task}_{backbone}.png", _metric_figure(group, label, baselines, f"{task} · {backbone}"))
        )
        monitored = [k for k in PANELS if any(r.series(k, "monitor")[0] for r in group)]
        if monitored:
            fig = _kappa_figure(group, label, baselines, monitored, f"{task} · {backbone}")
            out.append((f"kappa_{task}_{backbone}.png", fig))
    return out


def labeller(runs: list[Run], baseline: str) -> tuple[Callable[[Run], str], set[str]]:
    """A run's line label: its variant with its options, and its other settings where the
    experiments of its task and backbone differ; and the labels of ``baseline``'s runs (drawn in
    :data:`BASELINE_COLOUR`)."""
    settings = options(runs)

    def label(run: Run) -> str:
        extra = describe(not_attn(settings.get(run.experiment, {})))
        return variant_label(run) + ("" if extra == "—" else f" ({extra})")

    return label, {label(r) for r in runs if r.status != "unreadable" and is_baseline(r, baseline)}


def pngs(
    runs: list[Run], compared: list[Verdict] | None = None, baseline: str | None = None
) -> dict[str, bytes]:
    """``{file name: PNG content}`` of :func:`figures` and :func:`comparison_figures`: drawn in
    memory, so that nothing is written until the report writes all its files
    (:func:`launch.analysis.report.write_files`)."""
    made = figures(runs, baseline) + comparison_figures(runs, compared, baseline)
    return {name: _png(fig) for name, fig in made}


def comparison_figures(
    runs: list[Run], compared: list[Verdict] | None = None, baseline: str | None = None
) -> list[tuple[str, Any]]:
    """A forest plot per task of ``compared`` (:func:`launch.analysis.verdicts.effects` of
    ``runs`` against ``baseline`` where not given) and the paired differences over training per
    task × backbone (``forest_<task>.png``, ``differences_<task>_<backbone>.png``)."""
    import matplotlib

    matplotlib.use("Agg")
    baseline = baseline or "standard"
    readable = [r for r in runs if r.status != "unreadable"]
    if compared is None:
        compared = effects(readable, baseline)
    out = []
    for task in dict.fromkeys(v.task for v in compared):
        out.append((f"forest_{task}.png", forest_figure([v for v in compared if v.task == task])))
    label, baselines = labeller(readable, baseline)
    for task in sorted({r.task for r in readable}):
        by_backbone: dict[str, list[tuple[str, list[tuple[Run, Run]]]]] = {}
        for pair in pairings(None, [r for r in readable if r.task == task], baseline):
            seeds = {r.seed: r for r in pair.base}
            paired = [(r, seeds[r.seed]) for r in pair.members if r.seed in seeds]
            if paired:
                by_backbone.setdefault(paired[0][0].backbone, []).append((label(paired[0][0]), paired))
        for backbone, lines in sorted(by_backbone.items()):
            group = [label(r) for r in readable if (r.task, r.backbone) == (task, backbone)]
            colour = colours(group, baselines)
            fig = differences_figure(lines, baseline, f"{task} · {backbone}", colour)
            out.append((f"differences_{task}_{backbone}.png", fig))
    return out


@dataclass
class ForestRow:
    """One row of a forest plot, in the metric's printed unit (accuracy points)."""

    label: str
    effect: float | None
    low: float | None
    high: float | None
    margin: float | None


def forest_rows(found: list[Verdict]) -> list[ForestRow]:
    """The rows a forest plot draws, top to bottom: each comparison's effect, its 95% interval and
    δ, scaled as the tables print them (:func:`launch.analysis.results.printed_scale`)."""

    def scaled(v: Verdict, x: float | None) -> float | None:
        return None if x is None else x * printed_scale(v.metric)

    return [
        ForestRow(
            f"{v.variant} · {v.reading} (n={v.n})",
            scaled(v, v.effect),
            scaled(v, v.low),
            scaled(v, v.high),
            scaled(v, v.margin),
        )
        for v in found
    ]


def forest_figure(found: list[Verdict]) -> Any:
    """One task's comparisons: a dot at each effect with its 95% interval, the baseline's 0 as a
    line in :data:`BASELINE_COLOUR`, each row's ±δ as grey ticks where it has one."""
    import matplotlib.pyplot as plt

    rows = forest_rows(found)
    fig, ax = plt.subplots(figsize=(7, 1.2 + 0.45 * len(rows)))
    ys = list(range(len(rows), 0, -1))
    ax.axvline(0, color=BASELINE_COLOUR, lw=1, label=f"{found[0].baseline_label} (0)")
    drawn = [(y, r) for y, r in zip(ys, rows, strict=True) if r.effect is not None]
    if drawn:
        with_interval = [(y, r) for y, r in drawn if r.low is not None]
        xs = [r.effect for _, r in drawn]
        low = [r.effect - r.low if r.low is not None else 0.0 for _, r in drawn]
        high = [r.high - r.effect if r.high is not None else 0.0 for _, r in drawn]
        ax.errorbar(
            xs,
            [y for y, _ in drawn],
            xerr=[low, high],
            fmt="o",
            color="C0",
            capsize=3,
            label="effect, 95% interval" if with_interval else "effect",
        )
    margins = [(y, r.margin) for y, r in zip(ys, rows, strict=True) if r.margin is not None]
    for i, (y, margin) in enumerate(margins):
        ax.plot([-margin, margin], [y, y], "|", color="grey", markersize=14, label="±δ" if i == 0 else None)
    ax.set_yticks(ys, [textwrap.shorten(r.label, 60) for r in rows], fontsize=8)
    ax.set_ylim(0.4, len(rows) + 0.6)
    metric = found[0].metric
    unit = "points" if printed_scale(metric) != 1 else "its units"
    ax.set(xlabel=f"effect on {metric}: reading − {found[0].baseline_label} ({unit})", ylabel="reading")
    ax.set_title(
        f"{found[0].task}: effect against {found[0].baseline_label}\n"
        "(mean paired difference over seeds, 95% Student-t interval)"
    )
    _legend_below(fig, [ax])
    return fig


@dataclass
class Differences:
    """A reading's paired difference from its baseline over training: at each step both arms
    logged on every paired seed, the mean over the seeds and its 95% Student-t interval (None
    for one seed)."""

    steps: list[int]
    mean: list[float]
    low: list[float] | None
    high: list[float] | None
    n: int


def paired_differences(pairs: list[tuple[Run, Run]], key: str, split: str = "val") -> Differences | None:
    """``key``'s difference reading − baseline per seed pair ``(reading's run, baseline's run)``,
    at the steps every pair's both runs logged (step 0 included where they did), its mean and
    interval over the pairs (κ in log10, as the claims compare it); None where no step is common."""
    from scipy import stats

    def at(run: Run) -> dict[int, float]:
        steps, values = run.series(key, split)
        log = key.startswith("kappa/")
        return {
            s: (math.log10(v) if log else v) for s, v in zip(steps, values, strict=True) if not log or v > 0
        }

    per_seed = []
    for mine, theirs in pairs:
        a, b = at(mine), at(theirs)
        per_seed.append({s: a[s] - b[s] for s in a.keys() & b.keys()})
    common = sorted(set.intersection(*(set(d) for d in per_seed))) if per_seed else []
    if not common:
        return None
    columns = [[d[s] for d in per_seed] for s in common]
    mean = [statistics.fmean(c) for c in columns]
    n = len(per_seed)
    if n < 2:
        return Differences(common, mean, None, None, n)
    half = [stats.t.ppf(0.975, n - 1) * statistics.stdev(c) / math.sqrt(n) for c in columns]
    return Differences(
        common,
        mean,
        [m - h for m, h in zip(mean, half, strict=True)],
        [m + h for m, h in zip(mean, half, strict=True)],
        n,
    )


def differences_figure(
    lines: list[tuple[str, list[tuple[Run, Run]]]], baseline: str, title: str, colour: dict[str, str]
) -> Any:
    """The paired differences of each reading (``(label, seed pairs)``) from ``baseline`` over
    training: the main metric, then each monitor quantity logged, one panel each; ``colour``: each
    label's (:func:`colours`)."""
    import matplotlib.pyplot as plt

    first = lines[0][1][0][0]
    keys = [(first.metric, "val")] + [
        (k, "monitor") for k in PANELS if any(r.series(k, "monitor")[0] for _, ps in lines for r in ps[0])
    ]
    rows = math.ceil(len(keys) / COLUMNS)
    cols = min(len(keys), COLUMNS)
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols + 1, 3.6 * rows), squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax, (key, split) in zip(flat, keys, strict=False):
        ax.axhline(0, color=BASELINE_COLOUR, lw=1, label=f"{baseline} (0)")
        scale = printed_scale(key) if split == "val" else 1
        for name, pairs in lines:
            found = paired_differences(pairs, key, split)
            if found is not None:
                _difference_line(ax, found, name, colour[name], scale)
        what = "log10 " + key if key.startswith("kappa/") else key
        unit = " (points)" if scale != 1 else ""
        ax.set_title("\n".join(textwrap.wrap(f"Δ {what} ({split}){unit}", 42)), fontsize=9)
        ax.set(xlabel="optimizer step", ylabel=f"reading − {baseline}{unit}")
    for ax in flat[len(keys) :]:
        fig.delaxes(ax)
    fig.suptitle(f"{title}: paired difference from {baseline} (mean over seeds; band: 95% interval)")
    _legend_below(fig, flat[: len(keys)])
    return fig


def _difference_line(ax, found: Differences, name: str, colour: str, scale: float = 1) -> None:
    """One reading's mean difference (times ``scale``: accuracy in points), its band where there
    are two seeds or more, a marker where the series is one step (and its interval as a bar)."""
    mean = [scale * m for m in found.mean]
    marker = "o" if len(found.steps) == 1 else None
    ax.plot(found.steps, mean, color=colour, marker=marker, label=f"{name} (n={found.n})")
    if found.low is not None:
        low, high = [scale * x for x in found.low], [scale * x for x in found.high]
        ax.fill_between(found.steps, low, high, alpha=0.2, color=colour)
        if len(found.steps) == 1:
            ax.errorbar(
                found.steps, mean, yerr=[[mean[0] - low[0]], [high[0] - mean[0]]], color=colour, capsize=3
            )


def colours(names: list[str], baselines: set[str]) -> dict[str, str]:
    """Each line's colour: the baseline's :data:`BASELINE_COLOUR`, the others matplotlib's cycle
    in the order of their sorted names (the same reading the same colour in a task's curves and
    differences)."""
    others = sorted(set(names) - baselines)
    return {**{n: f"C{i % 10}" for i, n in enumerate(others)}, **dict.fromkeys(baselines, BASELINE_COLOUR)}


def _metric_figure(group: list[Run], label, baselines: set[str], title: str) -> Any:
    import matplotlib.pyplot as plt

    metric = group[0].metric
    fig, ax = plt.subplots(figsize=(7, 4.5))
    colour = colours([label(r) for r in group], baselines)
    for name in sorted(colour):
        _band(ax, [r.series(metric) for r in group if label(r) == name], name, colour[name])
    ax.set(xlabel="optimizer step", ylabel=f"{metric} (validation)")
    ax.set_title(f"{title}: {metric} over training\n(mean over seeds; band: lowest to highest seed)")
    _legend_below(fig, [ax])
    return fig


def _kappa_figure(group: list[Run], label, baselines: set[str], keys: list[str], title: str) -> Any:
    import matplotlib.pyplot as plt

    slots = panel_slots(keys)
    colour = colours([label(r) for r in group], baselines)
    rows = math.ceil((slots[-1] + 1) / COLUMNS)
    fig, axes = plt.subplots(rows, COLUMNS, figsize=(4.6 * COLUMNS, 3.6 * rows), squeeze=False)
    flat = [ax for row in axes for ax in row]
    used = [flat[slot] for slot in slots]
    for ax, key in zip(used, keys, strict=True):
        for name in sorted(colour):
            series = [r.series(key, "monitor") for r in group if label(r) == name]
            _band(ax, series, name, colour[name])
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


def _band(ax, series: list[tuple[list[int], list[float]]], label: str, colour: str) -> None:
    """Mean over seeds, with the band between the lowest and highest seed, at their common steps."""
    series = [s for s in series if s[0]]
    if not series:
        return
    common = sorted(set.intersection(*(set(steps) for steps, _ in series)))
    per_seed = [[dict(zip(steps, values, strict=True))[s] for s in common] for steps, values in series]
    columns = list(zip(*per_seed, strict=True))
    mean = [statistics.fmean(c) for c in columns]
    marker = "o" if len(common) == 1 else None  # one point: no line to see, so a marker
    (line,) = ax.plot(common, mean, label=f"{label} (n={len(series)})", color=colour, marker=marker)
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
