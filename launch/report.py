"""Turn run records into the papers' tables: ``python -m launch.report RUN_DIRS… [--wandb E/P]``.

Groups completed runs by experiment, their identity without the seed (task, backbone, variant
and its options, and every other setting: run length, recipe, data), and writes ``report.md``
(mean ± std of the main metric over seeds, the number of seeds, the paper's number and gain
beside ours; the settings that tell experiments of one task and backbone apart), the P4-style
steps each variant needs to reach ``standard``'s final metric, PNG plots (the metric over
training per experiment with a band over seeds; κ over training), the runs that failed, failed
to start or never finished, with their error line, and the duplicates (two runs of one identity
and seed: counted once). Which way a metric is better comes from ``summary.json``'s
``metric_mode``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from .claims import CHECKED_BY_TESTS, Verdict, verdicts
from .paper import P4_EPOCHS_TO_TARGET, PaperNumber, lookup
from .records import Run, options, read_runs, read_wandb

KAPPAS = ["W_Q", "W_K", "W_V", "X", "P", "A"]


@dataclass
class Cell:
    """One experiment (a task × backbone × variant with all its settings) over its seeds."""

    task: str
    backbone: str
    attn: str
    metric: str
    values: list[float]
    paper: PaperNumber | None
    baseline_mean: float | None = None  # our `standard` in the same setting
    options: dict = field(default_factory=dict)  # what tells it apart from its neighbours
    context: str = ""  # :attr:`Run.context`: where its baseline is

    @property
    def label(self) -> str:
        return describe(self.options)

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.values)

    @property
    def std(self) -> float:
        return statistics.stdev(self.values) if self.n > 1 else 0.0

    @property
    def gain(self) -> float | None:
        return None if self.baseline_mean is None else self.mean - self.baseline_mean


def describe(settings: dict) -> str:
    """``lam=10, trainer.max_steps=100`` (a variant's own options without their ``attn.``)."""
    shown = {k: v for k, v in settings.items() if v is not None}  # None: a key this run's config lacks
    if not shown:
        return "—"
    return ", ".join(f"{k.removeprefix('attn.')}={v}" for k, v in shown.items())


def experiments(runs: list[Run]) -> tuple[dict[tuple, list[Run]], list[tuple[Run, Run]]]:
    """Completed runs grouped by (task, backbone, variant, experiment); and the duplicates left
    out, each as ``(kept, duplicate)``: same identity and seed, so the same run twice."""
    groups: dict[tuple, list[Run]] = defaultdict(list)
    duplicates = []
    for run in sorted(runs, key=lambda r: r.name):
        if run.status != "completed" or run.metric not in run.final:
            continue
        members = groups[(*run.key, run.experiment)]
        twin = next((m for m in members if m.seed == run.seed), None)
        if twin is not None:
            duplicates.append((twin, run))
        else:
            members.append(run)
    return groups, duplicates


def table(runs: list[Run]) -> list[Cell]:
    """The cells of completed runs, each with the paper's number and our baseline's mean."""
    groups, _ = experiments(runs)
    settings = options(runs)
    cells = []
    for (task, backbone, attn, experiment), members in sorted(groups.items(), key=lambda kv: kv[0][:3]):
        metric = members[0].metric
        cells.append(
            Cell(
                task,
                backbone,
                attn,
                metric,
                [r.final[metric] for r in members],
                lookup(task, backbone, attn, metric),
                options=settings.get(experiment, {}),
                context=members[0].context,
            )
        )
    baselines = {(c.task, c.backbone, c.context): c.mean for c in cells if c.attn == "standard"}
    for c in cells:
        c.baseline_mean = baselines.get((c.task, c.backbone, c.context))
    return cells


@dataclass
class Convergence:
    """Steps (median over seeds) a variant needs to reach ``standard``'s mean final metric."""

    task: str
    backbone: str
    attn: str
    steps: float | None  # None: no seed reached it
    reached: int
    seeds: int
    ratio: float | None
    epochs: float | None
    options: dict = field(default_factory=dict)


def first_reaching(steps: list[int], values: list[float], target: float, higher: bool) -> int | None:
    for s, v in zip(steps, values, strict=True):
        if (v >= target) if higher else (v <= target):
            return s
    return None


def convergence(runs: list[Run], metric: str | None = None) -> list[Convergence]:
    """P4's measure: the step at which each variant first reaches the baseline's final metric
    (the runs' main metric, or ``metric``, e.g. ``val/loss``).

    The baseline itself counts its whole budget (its last step), as P4's table does (300 of
    300 epochs); a variant's figure is the median over the seeds that reach the target.
    """
    groups, _ = experiments([r for r in runs if (metric or r.metric) in r.final])
    settings = options(runs)
    contexts: dict[tuple, list[list[Run]]] = defaultdict(list)  # the same setting, any variant
    for members in groups.values():
        first = members[0]
        contexts[(first.task, first.backbone, first.context)].append(members)
    out = []
    for (task, backbone, _), experiments_here in sorted(contexts.items(), key=lambda kv: kv[0][:2]):
        base = next((m for m in experiments_here if m[0].attn == "standard"), None)
        if base is None:
            continue
        key = metric or base[0].metric
        higher = base[0].higher_is_better if key == base[0].metric else "loss" not in key
        target = statistics.fmean(r.final[key] for r in base)
        budget = statistics.median(max(r.series(key)[0], default=0) for r in base)
        ordered = sorted(experiments_here, key=lambda m: (m[0].attn, describe(settings[m[0].experiment])))
        for members in ordered:
            if members is base:
                hits = [max(r.series(key)[0], default=0) for r in members]
            else:
                hits = [
                    s for r in members if (s := first_reaching(*r.series(key), target, higher)) is not None
                ]
            steps = statistics.median(hits) if hits else None
            per_epoch = members[0].steps_per_epoch
            out.append(
                Convergence(
                    task,
                    backbone,
                    members[0].attn,
                    steps,
                    len(hits),
                    len(members),
                    ratio=None if steps is None or not budget else steps / budget,
                    epochs=None if steps is None or not per_epoch else steps / per_epoch,
                    options=settings[members[0].experiment],
                )
            )
    return out


def fmt(value: float | None, metric: str) -> str:
    if value is None:
        return "—"
    if "acc" in metric or "mAP" in metric:  # fractions, printed as the papers do: in %
        return f"{100 * value:.2f}"
    return f"{value:.4g}"


def markdown(cells: list[Cell], conv: list[Convergence], runs: list[Run]) -> str:
    lines = [
        "# Results",
        "",
        "Main metric per experiment: mean ± std over seeds (accuracies and COCO APs in %). An experiment "
        "is a run's whole configuration but its seed; *settings* lists what tells it apart from the "
        "other experiments of its task and backbone. *gain*: against our `standard` in the same "
        "settings. *paper*: the number METHODS.md quotes and its gain over the same paper's baseline.",
        "",
        "| task | backbone | variant | settings | metric | ours | n | gain | paper | paper gain "
        "| ours − paper |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for c in cells:
        p = c.paper
        paper = f"{fmt(p.value, c.metric)} ({p.source})" if p else "—"
        paper_gain = fmt(p.value - p.baseline, c.metric) if p and c.attn != "standard" else "—"
        diff = fmt(c.mean - p.value, c.metric) if p else "—"
        lines.append(
            f"| {c.task} | {c.backbone} | {c.attn} | {c.label} | {c.metric} | {fmt(c.mean, c.metric)} ± "
            f"{fmt(c.std, c.metric)} | {c.n} | {fmt(c.gain, c.metric)} | {paper} | {paper_gain} | {diff} |"
        )
    lines += [
        "",
        "## Steps to reach `standard`'s final metric (P4)",
        "",
        "Median over the seeds that reach it; the ratio is to `standard`'s budget. "
        "P4 reports cond_init at 0.70× the default's epochs on ImageNet.",
        "",
        "| task | backbone | variant | settings | steps | epochs | reached | ratio | P4 ratio |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for v in conv:
        p4 = P4_EPOCHS_TO_TARGET.get(v.backbone, {}) if v.task == "imagenet" else {}
        p4_ratio = f"{p4[v.attn] / p4['standard']:.2f}" if v.attn in p4 else "—"
        steps = "not reached" if v.steps is None else f"{v.steps:g}"
        epochs = "—" if v.epochs is None else f"{v.epochs:.1f}"
        ratio = "—" if v.ratio is None else f"{v.ratio:.2f}"
        lines.append(
            f"| {v.task} | {v.backbone} | {v.attn} | {describe(v.options)} | {steps} | {epochs} | "
            f"{v.reached}/{v.seeds} | "
            f"{ratio} | {p4_ratio} |"
        )
    return "\n".join([*lines, *claims_section(verdicts(runs)), *not_counted(runs)]) + "\n"


def claims_section(found: list[Verdict]) -> list[str]:
    """The "Claims" section: every claim of :mod:`launch.claims` per task and reading, with our
    effect against ``standard`` (95% interval over paired seeds) and the verdict."""
    if not found:
        return []
    lines = [
        "",
        "## Claims",
        "",
        "Each paper claim per task and *reading* (the variant's options that tell its readings apart), "
        "never pooled: *ours* is `standard` → the reading (means over the seeds both have; κ as "
        "10^mean log10), *effect* the mean per-seed difference (κ in log10) with its 95% Student-t "
        "interval. *reproduced*: the interval excludes 0 on the paper's side; *contradicted*: on the "
        "other side; *inconclusive*: it contains 0. *entropy*: the reading's median attention entropy "
        "at init (1 uniform, 0 one-hot): κ(P) = 1 is what a collapsed attention scores, so read κ "
        "beside it.",
    ]
    for claim in dict.fromkeys(v.claim for v in found):
        lines += [
            "",
            f"### {claim.source} {claim.key.split('-', 1)[1]}: {claim.statement}",
            "",
            f"Paper: {claim.paper}. Measure: `{claim.measure}`.",
            "",
            "| task | variant | reading | n | ours | effect [95% CI] | entropy | verdict |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        lines += [_verdict_row(v) for v in found if v.claim == claim]
    if CHECKED_BY_TESTS:
        lines += ["", "Claims that need no training, checked by tests:", ""]
        lines += [f"- {t.source}: {t.statement}: {t.finding} (`{t.test}`)" for t in CHECKED_BY_TESTS]
    return lines


def _verdict_row(v: Verdict) -> str:
    measure = v.claim.measure
    if measure == "stages":
        ours = v.note
    else:
        ours = "—" if v.value is None else f"{_measured(v, v.baseline)} → {_measured(v, v.value)}"
    effect = "—" if v.effect is None else _signed(v, v.effect)
    if v.low is not None:
        effect += f" [{_signed(v, v.low)}, {_signed(v, v.high)}]"
    entropy = "—" if v.entropy is None else f"{v.entropy:.3f}"
    return (
        f"| {v.task} | {v.claim.variant} | {v.reading} | {v.n} | {ours} | {effect} | {entropy} "
        f"| **{v.verdict}** |"
    )


def _measured(v: Verdict, value: float | None) -> str:
    """A mean of the claim's measure: the metric as the tables print it, κ as a power of 10."""
    if value is None:
        return "—"
    if v.claim.measure.startswith("init:kappa"):
        return f"10^{value:.2f}"
    return fmt(value, v.metric) if v.claim.measure == "final" else f"{value:.2f}"


def _signed(v: Verdict, value: float) -> str:
    """A difference: in the metric's printed unit (accuracy points) for ``final``."""
    if v.claim.measure == "final":
        text = fmt(abs(value), v.metric)
        return ("−" if value < 0 else "+") + text
    return f"{value:+.3f}"


def not_counted(runs: list[Run]) -> list[str]:
    """The report's last sections: runs that did not complete, and duplicates counted once."""
    failed = [r for r in runs if r.status != "completed"]
    lines = ["", f"## Runs that did not complete ({len(failed)})", ""]
    if failed:
        lines += [
            "| run | task | backbone | variant | seed | status | error |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        lines += [
            f"| {r.name} | {r.task} | {r.backbone} | {r.attn} | {r.seed} | {r.status} | {r.error or ''} |"
            for r in failed
        ]
    else:
        lines.append("None.")
    _, duplicates = experiments(runs)
    if duplicates:
        heading = f"## Duplicate runs ({len(duplicates)}): the same experiment and seed, counted once"
        lines += ["", heading, ""]
        lines += [f"- {dup.name} repeats {kept.name} (seed {kept.seed})" for kept, dup in duplicates]
    return lines


def plot(runs: list[Run], out: Path) -> list[Path]:
    """Per task × backbone: the main metric over training, and κ over training, per experiment
    (its variant, and its settings where the experiments of that task and backbone differ)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    done = [r for r in runs if r.rows and r.metric and r.status != "unreadable"]
    settings = options(runs)

    def label(run: Run) -> str:
        extra = describe(settings.get(run.experiment, {}))
        return run.attn if extra == "—" else f"{run.attn} ({extra})"

    for task, backbone in sorted({(r.task, r.backbone) for r in done}):
        group = [r for r in done if (r.task, r.backbone) == (task, backbone)]
        labels = sorted({label(r) for r in group})
        metric = group[0].metric
        fig, ax = plt.subplots(figsize=(6, 4))
        for name in labels:
            _band(ax, [r.series(metric) for r in group if label(r) == name], name)
        ax.set(xlabel="step", ylabel=metric, title=f"{task} · {backbone}")
        ax.legend(fontsize=8)
        written.append(_save(fig, out / f"curves_{task}_{backbone}.png"))

        keys = [f"kappa/{k}/median" for k in KAPPAS]
        if any(r.series("kappa/P/median", "monitor")[0] for r in group):  # κ(P) = 1 when P collapses:
            keys.insert(keys.index("kappa/P/median") + 1, "entropy/P/median")  # its entropy beside it
        monitored = [k for k in keys if any(r.series(k, "monitor")[0] for r in group)]
        if monitored:
            fig, axes = plt.subplots(1, len(monitored), figsize=(3.2 * len(monitored), 3), squeeze=False)
            for ax, k in zip(axes[0], monitored, strict=True):
                for name in labels:
                    _band(ax, [r.series(k, "monitor") for r in group if label(r) == name], name)
                what = k.split("/")[1]
                if k.startswith("kappa/"):
                    ax.set(yscale="log", xlabel="step", title=f"median κ({what})")
                else:
                    ax.set(xlabel="step", ylim=(0, 1.05), title="median entropy(P) (1 uniform, 0 one-hot)")
            axes[0][0].legend(fontsize=7)
            fig.suptitle(f"{task} · {backbone}")
            written.append(_save(fig, out / f"kappa_{task}_{backbone}.png"))
    return written


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


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m launch.report", description=__doc__.splitlines()[0])
    parser.add_argument(
        "runs", nargs="*", type=Path, help="run folders or folders that hold them (multirun dirs)"
    )
    parser.add_argument("--wandb", metavar="ENTITY/PROJECT", help="read the runs of a W&B project as well")
    parser.add_argument(
        "--out", type=Path, help="where report.md and the plots go (default: <first RUN_DIR>/report)"
    )
    args = parser.parse_args(argv)
    if not args.runs and not args.wandb:
        parser.error("give run folders, --wandb ENTITY/PROJECT, or both")
    runs = read_runs(args.runs) + (read_wandb(args.wandb) if args.wandb else [])
    if not runs:
        print(
            f"error: no run folders (.hydra/config.yaml, or config.yaml beside metrics.jsonl) under "
            f"{' '.join(map(str, args.runs))}",
            file=sys.stderr,
        )
        return 2
    out = args.out or (args.runs[0] / "report" if args.runs else Path("report"))
    text = markdown(table(runs), convergence(runs), runs)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.md").write_text(text)
    plots = plot(runs, out)
    print(text)
    print(f"wrote {out / 'report.md'} and {len(plots)} plots", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
