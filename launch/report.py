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

This module writes the document and is the command; what it prints comes from its neighbours:
the experiments' numbers (:func:`table`, :func:`convergence`) from :mod:`launch.results`, the
claims' verdicts from :mod:`launch.verdicts`, the plots from :mod:`launch.plots`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .claims import CHECKED_BY_TESTS
from .paper import P4_EPOCHS_TO_TARGET
from .plots import plot
from .records import Run, read_runs, read_wandb
from .results import Cell, Convergence, convergence, describe, experiments, table
from .verdicts import Verdict, verdicts


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
        "settings. *paper*: the number docs/methods.md quotes and its gain over the same paper's baseline.",
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
