"""Turn run records into the papers' tables: ``python -m launch.analysis.report RUN_DIRS… [--wandb E/P]``.

Groups completed runs by experiment, their identity without the seed (task, backbone, variant
and its options, and every other setting: run length, recipe, data), and writes ``report.md``
(mean ± std of the main metric over seeds, the number of seeds, the paper's number and gain
beside ours; the settings that tell experiments of one task and backbone apart), every
experiment's paired effect against the baseline in its setting (``standard``, or ``--baseline``;
its 95% interval, paired seeds and verdict, against ``--margin``'s δ or the claim's:
:func:`launch.analysis.verdicts.effects`, with a forest plot per task and the paired differences
over training), the P4-style
steps each variant needs to reach ``standard``'s final metric, PNG plots (the metric over
training per experiment with a band over seeds; κ over training), the runs that failed, failed
to start, never finished or cannot be read (``unreadable``: a damaged or foreign record, a file
that is not a regular one or larger than its limit, a number outside its metric's range; one row
each with its reason; the report goes on with the others), with their error line, the records
of one identity and seed whose numbers differ (``disagrees``: both shown, neither counted,
:func:`launch.analysis.results.flag_disagreements`), the debug runs (``debug=fdr``: listed, never counted)
and the duplicates (two runs of one identity and seed, the same numbers: counted once). Every
file is read within its bounds (:mod:`src.engine.record.bounded`). Which way a metric is better
comes from ``summary.json``'s ``metric_mode``. Each number says its split: a run's test number
(``eval-test.json`` of the record's own configuration) where every seed of its experiment has
one, else the validation value. Beside the document, ``results.csv`` and ``results.json`` carry
the same rows: one per run and one per experiment (:func:`export_rows`).

Every file is written whole or not at all, and all of them or none: each goes to a temporary
file beside its place, and only once every one is written are they renamed into place
(:func:`write_files`). A write that fails is one ``error: cannot write <path> (<reason>; N MB
free on its disk)`` line and exit status 2, the earlier report left as it was.

This module writes the documents and is the command; what it prints comes from its neighbours:
the experiments' numbers (:func:`table`, :func:`convergence`) from :mod:`launch.analysis.results`, the
claims' verdicts and their section from :mod:`launch.analysis.verdicts`, the GLUE section (each variant's GLUE
tasks and their average) from :mod:`launch.analysis.glue_table`, the plots from :mod:`launch.analysis.plots`.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

from src.command import command_parser, run_command
from src.engine.record import atomic
from src.engine.record.bounded import limit_of, open_file
from src.engine.record.files import RecordError, write_failure
from src.engine.record.lock import OutputLock, RunFolderBusy
from src.errors import SuiteError

from .claims import parse_margins
from .exports import claim_export_rows, export_rows, exports
from .glue_table import glue_section
from .paper import P4_EPOCHS_TO_TARGET, lookup, reported_by
from .plots import pngs
from .records import Run, read_runs, read_wandb, variant_label
from .results import (
    Cell,
    Convergence,
    convergence,
    describe,
    experiments,
    flag_disagreements,
    fmt,
    table,
)
from .settle import STATE, Plan, read_plan
from .stats import Levels
from .to_wandb import send_comparisons
from .verdict_row import lines
from .verdicts import Verdict, claims_section, effects, effects_section, is_baseline, verdicts


def markdown(
    cells: list[Cell],
    conv: list[Convergence],
    runs: list[Run],
    margins: dict[str, float] | None = None,
    settled: list[tuple[Path, Plan, dict[str, Levels]]] = (),
    compared: list[Verdict] | None = None,
    examples: dict[str, int] | None = None,
    found: list[Verdict] | None = None,
) -> str:
    """The whole report: the results table, every row's effect against the baseline
    (``compared``, :func:`comparisons`; against ``standard`` where not given), P4's steps, the
    claims (``margins``: the user's δ by claim; ``settled``: the plans of sweeps settled by
    :mod:`launch.analysis.settle`, whose looks' levels their rows are read at), the runs not
    counted; ``examples``: ``{task: its evaluation set's size}``, counted as a sample in every
    interval of that task (``--examples``); ``found``: the claims' verdicts, where already computed."""
    if compared is None:
        compared = comparisons(of_experiments(runs), margins, settled, examples=examples)
    lines = [
        "# Results",
        "",
        "Main metric per experiment: mean ± std over seeds (accuracies and COCO APs in %; — for the "
        "spread of one seed). An experiment is a run's whole configuration but its seed: *variant* "
        "with its options that are not defaults, *steps* its length, *settings* what else tells it "
        "apart from the other experiments of its task and backbone. *split*: where *ours* is from: "
        "`test` when every seed has a test number (`python -m src.eval RUN split=test`), else the "
        "final `val` value of every seed (never a mix). *gain*: against our `standard` in the same "
        "settings and split. *paper*: the number docs/methods.md quotes (the papers report test "
        "numbers: *ours − paper* from `val` says so) and its gain over the same paper's baseline.",
        "",
        "| task | backbone | variant | settings | steps | split | metric | ours | n | gain | paper "
        "| paper gain | ours − paper |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    lines += [_cell_row(row) for c in cells for row in (c, *_rows_it_stands_for(c))]
    lines += effects_section(compared, compared[0].baseline_label if compared else "standard")
    lines += _steps_section(conv)
    rules = [f"`{root}`: {plan.describe()}." for root, plan, _ in settled]
    if found is None:
        found = verdicts(
            of_experiments(runs), margins=margins, levels=settled_levels(settled), examples=examples
        )
    sections = [*glue_section(of_experiments(runs)), *claims_section(found, rules), *not_counted(runs)]
    return "\n".join([*lines, *sections]) + "\n"


def _steps_section(conv: list[Convergence]) -> list[str]:
    """P4's section: each experiment's Kaplan–Meier median steps to ``standard``'s final validation
    metric, against ``standard``'s budget and P4's own ratio."""
    lines = [
        "",
        "## Steps to reach `standard`'s final validation metric (P4)",
        "",
        "From the validation curves (split `val`). Kaplan–Meier median over the seeds (a seed that "
        "never reaches it is censored at its last step, not dropped; *not reached* where the median "
        "is not); the ratio is to `standard`'s budget. The claims' verdict on it is P4-speed's "
        "(time to a target with an interval, in the Claims section). "
        "P4 reports cond_init at 0.70× the default's epochs on ImageNet.",
        "",
        "| task | backbone | variant | settings | steps | epochs | reached | ratio | P4 ratio |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    shared = [(v, row) for v in conv for row in (v.backbone, *reported_by(v.task, v.backbone))]
    for v, row in shared:
        p4 = P4_EPOCHS_TO_TARGET.get(row, {}) if v.task == "imagenet" else {}
        p4_ratio = f"{p4[v.attn] / p4['standard']:.2f}" if v.attn in p4 else "—"
        steps = "not reached" if v.steps is None else f"{v.steps:g}"
        epochs = "—" if v.epochs is None else f"{v.epochs:.1f}"
        ratio = "—" if v.ratio is None else f"{v.ratio:.2f}"
        backbone = v.backbone if row == v.backbone else f"{row} ({v.backbone} runs)"
        lines.append(
            f"| {v.task} | {backbone} | {v.variant} | {describe(v.options)} | {steps} | {epochs} | "
            f"{v.reached}/{v.seeds} | "
            f"{ratio} | {p4_ratio} |"
        )
    return lines


def settled_levels(settled: list[tuple[Path, Plan, dict[str, Levels]]]) -> dict[str, Levels]:
    """``{experiment: levels}`` of the settled sweeps' looks (:mod:`launch.analysis.settle`)."""
    return {e: lv for _, _, by_experiment in settled for e, lv in by_experiment.items()}


def comparisons(
    runs: list[Run],
    margins: dict[str, float] | None = None,
    settled: list[tuple[Path, Plan, dict[str, Levels]]] = (),
    baseline: str | None = None,
    examples: dict[str, int] | None = None,
) -> list[Verdict]:
    """Every experiment of ``runs`` against ``baseline`` (``standard`` where None) in its setting,
    read at its settled sweep's levels where it has one (:func:`launch.analysis.verdicts.effects`):
    what report.md, results.csv, results.json and the forest plots show, computed once. A
    ValueError when ``baseline`` is named and no run is of it."""
    if baseline and not any(is_baseline(r, baseline) for r in runs if r.status != "unreadable"):
        named = sorted({variant_label(r) for r in runs if r.status != "unreadable"})
        raise ValueError(f"--baseline {baseline}: no run of it (runs of: {', '.join(named)})")
    return effects(runs, baseline or "standard", margins, settled_levels(settled), examples)


def _rows_it_stands_for(c: Cell) -> list[Cell]:
    """The cell again for each other paper row its runs stand for
    (:data:`launch.analysis.paper.REPORTED_FROM`: DeiT-B's from the ViT-B runs), with that row's paper
    number, its backbone named ``deit_base (vit_base runs)``."""
    return [
        dataclasses.replace(
            c, backbone=f"{row} ({c.backbone} runs)", paper=lookup(c.task, row, c.attn, c.metric)
        )
        for row in reported_by(c.task, c.backbone)
    ]


def _cell_row(c: Cell) -> str:
    """One experiment's row of the results table."""
    p = c.paper
    paper = f"{fmt(p.value, c.metric)} ({p.source})" if p else "—"
    paper_gain = fmt(p.value - p.baseline, c.metric) if p and c.attn != "standard" else "—"
    diff = fmt(c.mean - p.value, c.metric) if p else "—"
    if p and c.split != "test":
        diff += " (val vs test)"
    length = "—" if c.steps is None else f"{c.steps}" + ("" if c.epochs is None else f" ({c.epochs:.3g} ep)")
    split = f"{c.split} ({c.note})" if c.note else c.split
    ours = f"{fmt(c.mean, c.metric)} ± {fmt(c.std, c.metric)}"
    return (
        f"| {c.task} | {c.backbone} | {c.variant} | {c.label} | {length} | {split} | {c.metric} | {ours} "
        f"| {c.n} | {fmt(c.gain, c.metric)} | {paper} | {paper_gain} | {diff} |"
    )


#: Statuses of runs that are not counted although they ran: each has its own section.
SET_APART = ("debug", "disagrees")


def of_experiments(runs: list[Run]) -> list[Run]:
    """``runs`` but the debug runs (``debug=fdr``): a few steps to try the code are no experiment's
    run, so they take no part in its table, claims, plots or the settings that tell experiments
    apart (the report lists them on their own, :func:`not_counted`)."""
    return [r for r in runs if r.status != "debug"]


def not_counted(runs: list[Run]) -> list[str]:
    """The report's last sections: runs that did not complete, records of one experiment and seed
    whose numbers disagree (neither counted), debug runs (not an experiment's), and duplicates
    counted once."""
    failed = [r for r in runs if r.status != "completed" and r.status not in SET_APART]
    lines = ["", f"## Runs that did not complete ({len(failed)})", ""]
    if failed:
        lines += [
            "| run | task | backbone | variant | seed | status | error |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        lines += [
            "| "
            + " | ".join(cell(x) for x in (r.name, r.task, r.backbone, r.attn, r.seed, r.status, r.error))
            + " |"
            for r in failed
        ]
    else:
        lines.append("None.")
    disagreeing = sorted(
        (r for r in runs if r.status == "disagrees"), key=lambda r: (r.experiment, r.seed, r.name)
    )
    if disagreeing:
        lines += [
            "",
            f"## Records that disagree ({len(disagreeing)}): the same experiment and seed, other numbers; "
            "none of them counted",
            "",
            "Two records of one identity and seed are the same run twice: where their numbers differ, at "
            "least one is not what it says. Move aside the one that is not the run's record (or rerun the "
            "seed in a folder of its own) and report again.",
            "",
            "| run | task | backbone | variant | seed | metric | final | test | how they differ |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for r in disagreeing:
            test = r.reported.value if r.reported and r.reported.split == "test" else None
            cells = (
                r.name,
                r.task,
                r.backbone,
                r.attn,
                r.seed,
                r.metric,
                r.final.get(r.metric or ""),
                test,
                r.error,
            )
            lines.append("| " + " | ".join(cell(x) for x in cells) + " |")
    debug = [r for r in runs if r.status == "debug"]
    if debug:
        lines += ["", f"## Debug runs ({len(debug)}): not counted", ""]
        lines += [f"- {r.name} ({r.task} · {r.backbone} · {r.attn}, seed {r.seed}): {r.error}" for r in debug]
    _, duplicates = experiments(runs)
    if duplicates:
        heading = f"## Duplicate runs ({len(duplicates)}): the same experiment and seed, counted once"
        lines += ["", heading, ""]
        lines += [f"- {dup.name} repeats {kept.name} (seed {kept.seed})" for kept, dup in duplicates]
    return lines


def cell(value: Any) -> str:
    """``value`` as one cell of a markdown table: one line, its ``|`` escaped, "" for None."""
    return "" if value is None else " ".join(str(value).split()).replace("|", "\\|")


def write_files(out: Path, files: dict[str, bytes]) -> list[Path]:
    """Write ``files`` (name: content) into ``out``, all of them whole or none
    (:func:`atomic.write_together`: each to a temporary file beside its place, fsynced, then, once
    every one is written, each renamed into place and the folder fsynced). A
    :class:`RecordError` (``cannot write <path> (<reason>; N MB free on its disk)``) when ``out``
    cannot be made or a file cannot be written; the files already there are then left as they were
    (only a rename failing midway, the folder vanishing under it, would leave some renamed)."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise RecordError(write_failure(out, error)) from error
    lock = OutputLock(out, "python -m launch.analysis.report")  # two reports into one --out: the second is
    try:  # refused, never a folder of both reports' files (or a file torn between them)
        lock.acquire()
    except RunFolderBusy as busy:
        raise RecordError(str(busy)) from None
    paths = {out / name: content for name, content in files.items()}
    try:
        atomic.write_together(paths)
    except OSError as error:  # it names the file it was writing
        raise RecordError(write_failure(Path(error.filename or out), error)) from error
    finally:
        lock.release()
    return list(paths)


def seed_sets(
    roots: list[Path], margins: dict[str, float] | None = None
) -> tuple[list[str], dict[str, bytes]]:
    """P5's seed sets under ``roots`` (:func:`launch.analysis.seed_sets.report_section`), then P5's
    claims judged from them (:mod:`launch.analysis.seed_verdicts`; ``margins`` as :func:`build`'s)."""
    from launch.analysis.seed_sets import load_sets, report_section

    from .seed_verdicts import read_memories, section, seed_verdicts

    sets, unreadable = load_sets(roots)
    memories, unread_memories = read_memories(roots)
    lines, pngs = report_section(sets, unreadable + unread_memories)
    return lines + section(seed_verdicts(sets, memories=memories, margins=margins)), pngs


def main(argv: list[str] | None = None) -> int:
    """Write the report; one ``error:`` line and 2 on bad input, before anything is written."""
    return run_command(command_line(), write_report, argv)


def command_line() -> argparse.ArgumentParser:
    """The command line (see the module's docstring)."""
    parser = command_parser(__spec__.name, __doc__)
    parser.add_argument(
        "runs", nargs="*", type=Path, help="run folders or folders that hold them (multirun dirs)"
    )
    parser.add_argument("--wandb", metavar="ENTITY/PROJECT", help="read the runs of a W&B project as well")
    parser.add_argument(
        "--out", type=Path, help="where report.md and the plots go (default: <first RUN_DIR>/report)"
    )
    parser.add_argument(
        "--margin",
        action="append",
        default=[],
        metavar="CLAIM=DELTA",
        help="a claim's smallest effect of interest, in its measure's units (P2-image=0.01), or a bare "
        "DELTA for every comparison no claim names (0.01: one point of accuracy); repeatable",
    )
    parser.add_argument(
        "--examples",
        action="append",
        default=[],
        metavar="TASK=N",
        help="count TASK's evaluation set of N examples as a sample as well as the seeds, in every "
        "interval of that task (digits=360: small sets' binomial noise); repeatable",
    )
    parser.add_argument(
        "--baseline",
        metavar="VARIANT",
        help="what every row is compared with: a variant with its options that are not defaults, as "
        "the table names it ('spectral mode=svd'; default: standard)",
    )
    parser.add_argument(
        "--to-wandb",
        action="store_true",
        help="add each compared experiment's effect, interval, n and verdict to its runs' W&B summaries "
        "(vs/<baseline>/…; runs that logged to W&B, resumed by their id)",
    )
    parser.add_argument(
        "--print",
        action="store_true",
        help="print the whole report.md (default: one line per comparison, then where the report is)",
    )
    return parser


def write_report(args: argparse.Namespace) -> None:
    """The command's work: the arguments checked, the runs read, the report written and printed."""
    margins, settled = checked_arguments(args)
    examples = evaluation_sizes(args.examples)
    runs = flag_disagreements(read_runs(args.runs) + (read_wandb(args.wandb) if args.wandb else []))
    seed_lines, seed_pngs = seed_sets(args.runs, margins)
    if not runs and seed_lines:  # only seed sets (python -m src.sandbox.seeds): their section alone
        write_seed_report(args.out or args.runs[0] / "report", seed_lines, seed_pngs)
        return
    if not runs:
        raise SuiteError(
            f"no run folders (.hydra/config.yaml, or config.yaml beside metrics.jsonl) under "
            f"{' '.join(map(str, args.runs))}"
        )
    out = args.out or (args.runs[0] / "report" if args.runs else Path("report"))
    text, compared, plots = write(out, runs, margins, settled, args.baseline, examples, seed_lines, seed_pngs)
    if args.to_wandb:
        sent, without = send_comparisons(of_experiments(runs), compared)
        print(
            f"W&B: comparisons added to {sent} runs' summaries ({without} without a W&B run)", file=sys.stderr
        )
    print(text if args.print else lines(compared))
    say_written(out, runs, plots)


def write(
    out: Path,
    runs: list[Run],
    margins: dict[str, float],
    settled: list[tuple[Path, Plan, dict[str, Levels]]],
    baseline: str | None = None,
    examples: dict[str, int] | None = None,
    seed_lines: list[str] = (),
    seed_pngs: dict[str, bytes] | None = None,
) -> tuple[str, list[Verdict], int]:
    """report.md, results.csv/json, claims.csv/json and the plots of ``runs`` into ``out`` (all or none);
    the report's text, its comparisons (:func:`comparisons`) and the number of plots."""
    counted = of_experiments(runs)
    try:
        compared = comparisons(counted, margins, settled, baseline, examples)
    except ValueError as error:
        raise SuiteError(str(error)) from error
    found = verdicts(counted, margins=margins, levels=settled_levels(settled), examples=examples)
    text = markdown(table(counted), convergence(counted), runs, margins, settled, compared, examples, found)
    text += "\n".join(seed_lines) + ("\n" if seed_lines else "")
    plots = {**pngs(counted, compared, baseline), **(seed_pngs or {})}
    files = exports(export_rows(runs, compared), claim_export_rows(found, counted))
    write_files(out, {"report.md": text.encode(), **files, **plots})
    return text, compared, len(plots)


def checked_arguments(args: argparse.Namespace) -> tuple[dict[str, float], list]:
    """The claims' margins and the settled sweeps' plans, every state file read within its limit;
    a :class:`SuiteError` for a bad ``--margin`` or state file, or no runs to read at all."""
    try:
        margins = parse_margins(args.margin, any_row=True)
        for root in args.runs:  # read_plan reads it by name: a regular file within its limit first
            state = root / STATE
            if state.exists() or state.is_symlink():
                open_file(state, limit_of(state), within=root).close()
        settled = [(root, *plan) for root in args.runs if (plan := read_plan(root))]
    except ValueError as error:
        raise SuiteError(str(error)) from error
    if not args.runs and not args.wandb:
        raise SuiteError(
            "give run folders, --wandb ENTITY/PROJECT, or both (python -m launch.analysis.report --help)"
        )
    return margins, settled


def evaluation_sizes(items: list[str]) -> dict[str, int]:
    """``--examples TASK=N`` as ``{task: N}`` (an evaluation set of N examples, counted as a sample
    in that task's intervals); a :class:`SuiteError` naming the item that is not one."""
    sizes = {}
    for item in items:
        task, _, size = item.partition("=")
        if not task or not size.isdigit() or int(size) < 1:
            raise SuiteError(f"--examples {item}: give TASK=N, N the evaluation set's size (digits=360)")
        sizes[task] = int(size)
    return sizes


def write_seed_report(out: Path, seed_lines: list[str], seed_pngs: dict[str, bytes]) -> None:
    """The report of seed sets alone (``python -m src.sandbox.seeds``'s folders): their section."""
    text = "# Results\n" + "\n".join(seed_lines) + "\n"
    write_files(out, {"report.md": text.encode(), **seed_pngs})
    print(text)
    print(f"wrote {out / 'report.md'} and {len(seed_pngs)} plots", file=sys.stderr)


def say_written(out: Path, runs: list[Run], plots: int) -> None:
    """The closing line on stderr: what was written, and the run folders left out and why."""
    unreadable = sum(1 for r in runs if r.status == "unreadable")
    disagreeing = sum(1 for r in runs if r.status == "disagrees")
    print(
        f"wrote {out / 'report.md'}, results.csv/json and claims.csv/json, {plots} plots"
        + (f"; {unreadable} unreadable run folder(s), listed in the report" if unreadable else "")
        + (
            f"; {disagreeing} records that disagree, none counted, listed in the report"
            if disagreeing
            else ""
        ),
        file=sys.stderr,
    )


if __name__ == "__main__":
    raise SystemExit(main())
