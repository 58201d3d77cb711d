"""Turn run records into the papers' tables: ``python -m launch.report RUN_DIRS… [--wandb E/P]``.

Groups completed runs by task × backbone × variant and writes ``report.md`` (mean ± std of
the main metric over seeds, the number of seeds, the paper's number and gain beside ours),
the P4-style steps each variant needs to reach ``standard``'s final metric, PNG plots (the
metric over training per variant with a band over seeds; κ over training), and the list of
runs that failed or never finished, with their error line.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from .paper import P4_EPOCHS_TO_TARGET, PaperNumber, lookup
from .records import Run, read_runs, read_wandb

KAPPAS = ["W_Q", "W_K", "W_V", "X", "P", "A"]


def higher_is_better(metric: str) -> bool:
    return not any(word in metric for word in ("loss", "ppl", "perplexity", "error"))


@dataclass
class Cell:
    """One task × backbone × variant over its seeds."""

    task: str
    backbone: str
    attn: str
    metric: str
    values: list[float]
    paper: PaperNumber | None
    baseline_mean: float | None = None  # our `standard` on the same task and backbone

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


def table(runs: list[Run]) -> list[Cell]:
    """The cells of completed runs, each with the paper's number and our baseline's mean."""
    groups: dict[tuple[str, str, str], list[Run]] = defaultdict(list)
    for run in runs:
        if run.status == "completed" and run.metric in run.final:
            groups[run.key].append(run)
    cells = []
    for (task, backbone, attn), members in sorted(groups.items()):
        metric = members[0].metric
        cells.append(
            Cell(
                task,
                backbone,
                attn,
                metric,
                [r.final[metric] for r in members],
                lookup(task, backbone, attn, metric),
            )
        )
    baselines = {(c.task, c.backbone): c.mean for c in cells if c.attn == "standard"}
    for c in cells:
        c.baseline_mean = baselines.get((c.task, c.backbone))
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
    done = [r for r in runs if r.status == "completed" and (metric or r.metric) in r.final]
    out = []
    for task, backbone in sorted({(r.task, r.backbone) for r in done}):
        group = [r for r in done if (r.task, r.backbone) == (task, backbone)]
        base = [r for r in group if r.attn == "standard"]
        if not base:
            continue
        key = metric or base[0].metric
        target = statistics.fmean(r.final[key] for r in base)
        budget = statistics.median(max(r.series(key)[0], default=0) for r in base)
        for attn in sorted({r.attn for r in group}):
            members = [r for r in group if r.attn == attn]
            if attn == "standard":
                hits = [max(r.series(key)[0], default=0) for r in members]
            else:
                hits = [
                    s
                    for r in members
                    if (s := first_reaching(*r.series(key), target, higher_is_better(key))) is not None
                ]
            steps = statistics.median(hits) if hits else None
            per_epoch = members[0].steps_per_epoch
            out.append(
                Convergence(
                    task,
                    backbone,
                    attn,
                    steps,
                    len(hits),
                    len(members),
                    ratio=None if steps is None or not budget else steps / budget,
                    epochs=None if steps is None or not per_epoch else steps / per_epoch,
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
        "Main metric per task × backbone × variant: mean ± std over seeds (accuracies and COCO APs in %). "
        "*gain*: against our `standard` on the same task and backbone. *paper*: the number "
        "METHODS.md quotes and its gain over the same paper's baseline.",
        "",
        "| task | backbone | variant | metric | ours | n | gain | paper | paper gain | ours − paper |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for c in cells:
        p = c.paper
        paper = f"{fmt(p.value, c.metric)} ({p.source})" if p else "—"
        paper_gain = fmt(p.value - p.baseline, c.metric) if p and c.attn != "standard" else "—"
        diff = fmt(c.mean - p.value, c.metric) if p else "—"
        lines.append(
            f"| {c.task} | {c.backbone} | {c.attn} | {c.metric} | {fmt(c.mean, c.metric)} ± "
            f"{fmt(c.std, c.metric)} | {c.n} | {fmt(c.gain, c.metric)} | {paper} | {paper_gain} | {diff} |"
        )
    lines += [
        "",
        "## Steps to reach `standard`'s final metric (P4)",
        "",
        "Median over the seeds that reach it; the ratio is to `standard`'s budget. "
        "P4 reports cond_init at 0.70× the default's epochs on ImageNet.",
        "",
        "| task | backbone | variant | steps | epochs | reached | ratio | P4 ratio |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for v in conv:
        p4 = P4_EPOCHS_TO_TARGET.get(v.backbone, {}) if v.task == "imagenet" else {}
        p4_ratio = f"{p4[v.attn] / p4['standard']:.2f}" if v.attn in p4 else "—"
        steps = "not reached" if v.steps is None else f"{v.steps:g}"
        epochs = "—" if v.epochs is None else f"{v.epochs:.1f}"
        ratio = "—" if v.ratio is None else f"{v.ratio:.2f}"
        lines.append(
            f"| {v.task} | {v.backbone} | {v.attn} | {steps} | {epochs} | {v.reached}/{v.seeds} | "
            f"{ratio} | {p4_ratio} |"
        )
    failed = [r for r in runs if r.status != "completed"]
    lines += ["", f"## Runs that did not complete ({len(failed)})", ""]
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
    return "\n".join(lines) + "\n"


def plot(runs: list[Run], out: Path) -> list[Path]:
    """Per task × backbone: the main metric over training, and κ over training, per variant."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    done = [r for r in runs if r.rows and r.metric]
    for task, backbone in sorted({(r.task, r.backbone) for r in done}):
        group = [r for r in done if (r.task, r.backbone) == (task, backbone)]
        variants = sorted({r.attn for r in group})
        metric = group[0].metric
        fig, ax = plt.subplots(figsize=(6, 4))
        for attn in variants:
            _band(ax, [r.series(metric) for r in group if r.attn == attn], attn)
        ax.set(xlabel="step", ylabel=metric, title=f"{task} · {backbone}")
        ax.legend(fontsize=8)
        written.append(_save(fig, out / f"curves_{task}_{backbone}.png"))

        monitored = [k for k in KAPPAS if any(r.series(f"kappa/{k}/median", "monitor")[0] for r in group)]
        if monitored:
            fig, axes = plt.subplots(1, len(monitored), figsize=(3.2 * len(monitored), 3), squeeze=False)
            for ax, k in zip(axes[0], monitored, strict=True):
                for attn in variants:
                    _band(
                        ax, [r.series(f"kappa/{k}/median", "monitor") for r in group if r.attn == attn], attn
                    )
                ax.set(yscale="log", xlabel="step", title=f"median κ({k})")
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
