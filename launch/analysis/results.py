"""Completed runs as experiments: the results table's cells and P4's steps to ``standard``.

An experiment is a run's identity without its seed (task, backbone, variant and its options,
and every other setting: run length, recipe, data). :func:`experiments` groups completed runs
so, counting a duplicate (two runs of one identity and seed) once; :func:`table` gives each
experiment's main metric over its seeds beside the paper's number and our ``standard`` in the
same setting; :func:`convergence` the steps each variant needs to reach ``standard``'s final
metric. These are numbers only: :mod:`launch.analysis.report` prints them, :mod:`launch.analysis.plots` draws
the curves, and ``python -m launch.tools.bench --quality`` reuses :func:`convergence`.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections import defaultdict
from dataclasses import dataclass, field

from .paper import PaperNumber, lookup
from .records import Run, options, variant_label
from .time_to_quality import arm_median


@dataclass
class Cell:
    """One experiment (a task × backbone × variant with all its settings) over its seeds.

    ``values`` are from one split, ``split``: every seed's test number where every seed has one
    (``eval-test.json``), else every seed's final validation number (``note`` then says how many
    had a test number): a cell never averages across splits."""

    task: str
    backbone: str
    attn: str
    metric: str  # the key its values were logged as: test/acc, val/acc
    values: list[float]
    paper: PaperNumber | None
    baseline_mean: float | None = None  # our `standard` in the same setting and split
    options: dict = field(default_factory=dict)  # what tells it apart from its neighbours
    context: str = ""  # :attr:`Run.context`: where its baseline is
    split: str = "val"
    seeds: list[int] = field(default_factory=list)
    note: str = ""
    variant: str = ""  # the variant with its non-default options: ``spectral mode=svd``
    steps: int | None = None  # the run length (its first seed's)
    epochs: float | None = None

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
    def std(self) -> float | None:
        """The sample standard deviation; None for one seed (no spread to speak of)."""
        return statistics.stdev(self.values) if self.n > 1 else None

    @property
    def gain(self) -> float | None:
        return None if self.baseline_mean is None else self.mean - self.baseline_mean


def fmt(value: float | None, metric: str) -> str:
    """A number as the tables print it: accuracies and APs in %, "—" for none."""
    if value is None:
        return "—"
    if printed_scale(metric) != 1:
        return f"{printed_scale(metric) * value:.2f}"
    return f"{value:.4g}"


def printed_scale(metric: str) -> float:
    """What a value of ``metric`` is multiplied by as printed: accuracies and APs are fractions,
    printed as the papers do, in % (100); the rest as they are (1)."""
    return 100 if "acc" in metric or "mAP" in metric else 1


def describe(settings: dict) -> str:
    """``lam=10, trainer.max_steps=100`` (a variant's own options without their ``attn.``)."""
    shown = {k: v for k, v in settings.items() if v is not None}  # None: a key this run's config lacks
    if not shown:
        return "—"
    return ", ".join(f"{k.removeprefix('attn.')}={v}" for k, v in shown.items())


def not_attn(settings: dict) -> dict:
    """The settings the variant's label does not already say (all but ``attn.…``)."""
    return {k: v for k, v in settings.items() if not k.startswith("attn.")}


def experiments(runs: list[Run]) -> tuple[dict[tuple, list[Run]], list[tuple[Run, Run]]]:
    """Completed runs grouped by (task, backbone, variant, experiment); and the duplicates left
    out, each as ``(kept, duplicate)``: same identity and seed, and the same numbers
    (:func:`flag_disagreements` takes out those that differ), so the same run twice; the one kept
    is the one with a test number, where only one has it, else the first by folder."""
    groups: dict[tuple, list[Run]] = defaultdict(list)
    duplicates = []
    for run in sorted(runs, key=lambda r: r.name):
        if run.status != "completed" or run.metric not in run.final:
            continue
        members = groups[(*run.key, run.experiment)]
        twin = next((m for m in members if m.seed == run.seed), None)
        if twin is None:
            members.append(run)
        elif tested(run) and not tested(twin):
            members[members.index(twin)] = run
            duplicates.append((run, twin))
        else:
            duplicates.append((twin, run))
    return groups, duplicates


def tested(run: Run) -> bool:
    """Whether the number the report uses of ``run`` is a test number."""
    return run.reported is not None and run.reported.split == "test"


def flag_disagreements(runs: list[Run]) -> list[Run]:
    """``runs`` with the completed runs of one experiment and seed whose numbers differ (their final
    validation value of the main metric, or their test numbers where both have one) marked
    ``disagrees``, each saying with which run and both numbers: two records of the same identity
    and seed are the same run twice, so where they differ at least one is not what it says, and
    neither is counted (nor chosen by its folder's name). Records that agree stay ``completed``
    (:func:`experiments` counts them once)."""
    by_seed: dict[tuple, list[Run]] = defaultdict(list)
    for run in runs:
        if run.status == "completed" and run.metric in run.final:
            by_seed[(*run.key, run.experiment, run.seed)].append(run)
    flagged: dict[int, str] = {}
    for members in by_seed.values():
        for i, one in enumerate(members):
            for other in members[i + 1 :]:
                found = differing(one, other)
                if found:
                    for a, b in ((one, other), (other, one)):
                        flagged.setdefault(
                            id(a), f"the same experiment and seed as {b.name}, other numbers: {found}"
                        )
    return [
        dataclasses.replace(r, status="disagrees", error=flagged[id(r)]) if id(r) in flagged else r
        for r in runs
    ]


def differing(one: Run, other: Run) -> str:
    """How the numbers of two records of one experiment and seed differ (``""``: they agree)."""
    key = one.metric
    if one.final.get(key) != other.final.get(key):
        return f"{key} {one.final.get(key)!r} vs {other.final.get(key)!r}"
    mine, theirs = one.reported, other.reported
    if mine and theirs and mine.split == theirs.split == "test" and mine.value != theirs.value:
        return f"{mine.key} {mine.value!r} vs {theirs.value!r}"
    return ""


def one_split(members: list[Run]) -> tuple[str, str, list[float], str]:
    """``(split, key, values, note)`` of an experiment's seeds: test where all have a test number,
    else validation for all, never a mix."""
    numbers = [r.reported for r in members]
    tested = sum(1 for x in numbers if x is not None and x.split == "test")
    if tested == len(members):
        return "test", numbers[0].key, [x.value for x in numbers], ""
    note = f"test on {tested} of {len(members)} seeds only: val for all" if tested else ""
    return "val", members[0].metric, [r.final[r.metric] for r in members], note


def table(runs: list[Run]) -> list[Cell]:
    """The cells of completed runs, each with the paper's number and our baseline's mean."""
    groups, _ = experiments(runs)
    settings = options(runs)
    cells = []
    for (task, backbone, attn, experiment), members in sorted(groups.items(), key=lambda kv: kv[0][:3]):
        split, key, values, note = one_split(members)
        first = members[0]
        cells.append(
            Cell(
                task,
                backbone,
                attn,
                key,
                values,
                lookup(task, backbone, attn, first.metric),
                options=not_attn(settings.get(experiment, {})),
                context=first.context,
                split=split,
                seeds=[r.seed for r in members],
                note=note,
                variant=variant_label(first),
                steps=first.steps,
                epochs=first.epochs,
            )
        )
    baselines = {(c.task, c.backbone, c.context, c.split): c.mean for c in cells if c.attn == "standard"}
    for c in cells:
        c.baseline_mean = baselines.get((c.task, c.backbone, c.context, c.split))
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
    variant: str = ""  # :func:`variant_label`


def first_reaching(steps: list[int], values: list[float], target: float, higher: bool) -> int | None:
    for s, v in zip(steps, values, strict=True):
        if (v >= target) if higher else (v <= target):
            return s
    return None


def convergence(runs: list[Run], metric: str | None = None) -> list[Convergence]:
    """P4's measure: the step at which each variant first reaches the baseline's final metric
    (the runs' main metric, or ``metric``, e.g. ``val/loss``).

    The baseline itself counts its whole budget (its last step), as P4's table does (300 of
    300 epochs); a variant's figure is the Kaplan–Meier median over its seeds, a seed that never
    reaches the target censored at its last logged step (counted, not dropped; None where the
    median is not reached: :mod:`launch.analysis.time_to_quality`).
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
                steps = statistics.median(hits) if hits else None
            else:
                arrivals = [(first_reaching(*r.series(key), target, higher), r) for r in members]
                hits = [s for s, _ in arrivals if s is not None]
                seeds = [
                    (s, True) if s is not None else (max(r.series(key)[0], default=0), False)
                    for s, r in arrivals
                ]
                steps = arm_median(seeds).steps if seeds else None
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
                    options=not_attn(settings[members[0].experiment]),
                    variant=variant_label(members[0]),
                )
            )
    return out
