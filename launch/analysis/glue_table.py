"""The report's GLUE section: each variant's GLUE tasks side by side and their GLUE average.

Runs of ``task=glue_<t>`` (and the embedded ``glue_tiny_<t>``) are grouped by suite (``glue``,
``glue_tiny``), backbone and variant; a cell is a task's main metric over seeds (MNLI: matched /
mismatched accuracy), in %. The average is :func:`tasks.glue.metrics.glue_average`, the Cramming
code's (the one the papers report): per seed over the terms that seed has for every task of the
group, then mean ± std over those seeds; the terms it took are named, so an average of two generated
tasks never passes for GLUE's. The papers' average stands beside ours for ``crammed_bert``
(:mod:`launch.analysis.paper`); their per-task numbers are in the results table above it.
"""

from __future__ import annotations

import re
import statistics
from collections import defaultdict

from .paper import lookup
from .records import Run, variant_label

#: GLUE's tasks in the order of the GLUE paper's table, with their column titles.
TITLES = {
    "cola": "CoLA",
    "sst2": "SST-2",
    "mrpc": "MRPC",
    "stsb": "STS-B",
    "qqp": "QQP",
    "mnli": "MNLI m/mm",
    "qnli": "QNLI",
    "rte": "RTE",
    "wnli": "WNLI",
}
TASK_NAME = re.compile(rf"^(glue(?:_tiny)?)_({'|'.join(TITLES)})$")
#: The record's key of each metric name of :data:`tasks.glue.metrics.AVERAGE_TERMS`.
RECORD_KEY = {"matthews": "val/matthews", "accuracy": "val/acc", "accuracy_mm": "val/acc_mm"}
RECORD_KEY |= {"f1": "val/f1", "pearson": "val/pearson", "spearman": "val/spearman"}


def glue_runs(runs: list[Run]) -> dict[tuple[str, str, str], dict[str, dict[int, Run]]]:
    """Completed GLUE runs: ``(suite, backbone, variant) -> task -> seed -> run``."""
    groups: dict[tuple[str, str, str], dict[str, dict[int, Run]]] = defaultdict(lambda: defaultdict(dict))
    for run in sorted(runs, key=lambda r: r.name):
        found = TASK_NAME.match(run.task)
        if run.status == "completed" and found and run.metric in run.final:
            suite, task = found.groups()
            groups[(suite, run.backbone, variant_label(run))][task].setdefault(run.seed, run)
    return groups


def seed_averages(tasks: dict[str, dict[int, Run]]) -> tuple[list[float], list[str]]:
    """The GLUE average of every seed that has all the group's tasks, and the terms it takes."""
    from tasks.glue.metrics import AVERAGE_TERMS, glue_average

    terms = [(t, m) for t, m in AVERAGE_TERMS if t in tasks]
    seeds = set.intersection(*(set(by_seed) for by_seed in tasks.values())) if tasks else set()
    averages = []
    for seed in sorted(seeds):
        results: dict[str, dict[str, float]] = defaultdict(dict)
        for t, m in terms:
            value = tasks[t][seed].final.get(RECORD_KEY[m])
            if value is not None:
                results[t][m] = value
        if sum(len(r) for r in results.values()) == len(terms):  # this seed has every term
            averages.append(glue_average(results)[0])
    return averages, [f"{t}:{m}" for t, m in terms]


def cell(by_seed: dict[int, Run], task: str) -> str:
    """A task's main metric over seeds in %, ``mean ± std``; MNLI ``matched / mismatched``."""
    keys = ["val/acc", "val/acc_mm"] if task == "mnli" else [next(iter(by_seed.values())).metric]
    parts = []
    for key in keys:
        values = [100 * r.final[key] for r in by_seed.values() if key in r.final]
        if values:
            spread = f" ± {statistics.stdev(values):.1f}" if len(values) > 1 else ""
            parts.append(f"{statistics.fmean(values):.1f}{spread}")
    return " / ".join(parts) or "—"


def glue_section(runs: list[Run]) -> list[str]:
    """The report's GLUE section (no lines when there are no GLUE runs)."""
    groups = glue_runs(runs)
    if not groups:
        return []
    present = [t for t in TITLES if any(t in tasks for tasks in groups.values())]
    lines = [
        "",
        "## GLUE",
        "",
        "Development sets, in %, mean ± std over seeds: each task's main metric (CoLA Matthews, MRPC and "
        "QQP F1, STS-B Pearson, MNLI matched / mismatched accuracy, the others accuracy). *average*: the "
        "Cramming code's GLUE average (the papers'), per seed over the *terms* listed, then over the seeds "
        "that have every task of the row (*n*); WNLI is not in it. *paper*: the papers' average.",
        "",
        "| suite | backbone | variant | " + " | ".join(TITLES[t] for t in present) + " | average | n | terms "
        "| paper |",
        "| --- " * (len(present) + 7) + "|",
    ]
    for (suite, backbone, variant), tasks in sorted(groups.items()):
        averages, terms = seed_averages(tasks)
        average = "—"
        if averages:
            spread = f" ± {100 * statistics.stdev(averages):.1f}" if len(averages) > 1 else ""
            average = f"{100 * statistics.fmean(averages):.1f}{spread}"
        attn = next(iter(next(iter(tasks.values())).values())).attn
        mine = suite == "glue" and variant == attn  # the papers' average: GLUE's nine tasks, default options
        paper = lookup("glue", backbone, attn, "glue/average") if mine else None
        cells = [cell(tasks[t], t) if t in tasks else "—" for t in present]
        lines.append(
            f"| {suite} | {backbone} | {variant} | " + " | ".join(cells) + f" | {average} | {len(averages)} "
            f"| {', '.join(terms)} | {f'{100 * paper.value:.1f} ({paper.source})' if paper else '—'} |"
        )
    return lines
