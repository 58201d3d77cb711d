"""The claims' verdicts from run records: :func:`verdicts` and the measures it compares.

:mod:`launch.analysis.claims` holds the claims as data; this module judges them, so that the list of
claims reads on its own and the statistics live in one place. :func:`verdicts` turns completed
runs into one :class:`Verdict` per claim, task and *reading* (a variant with all its options: an
experiment in :mod:`launch.analysis.records`' sense), never pooled over readings:

* the effect is ``variant − standard`` per seed, paired by seed within one setting (the same
  identity but the variant), its mean and a 95% Student-t interval over the seeds
  (``n − 1`` degrees of freedom; no interval below two seeds);
* *reproduced*: the interval excludes 0 on the paper's side; *contradicted*: it excludes 0 on
  the other side; *equivalent*: the claim declares a margin δ and the 90% interval lies inside
  ±δ (the two one-sided tests: no effect as large as the paper's); *inconclusive*: none of these
  (:mod:`launch.analysis.stats`). κ effects are in log10 (a factor of 10 is 1);
* a claim's readings on one task are one family: the verdict is also given with Holm-adjusted
  p-values (``adjusted``), and a verdict that holds only unadjusted is marked so in the report;
* the report gives each row's minimum detectable effect at 80% power with the seeds it has, and
  the seeds a test of δ would need, both at the level the row is tested at
  (:func:`launch.analysis.stats.tested_at`: its look's level over its Holm family's size);
* a *non-inferiority* claim (``Claim.kind``, "at least as good") is tested one-sided against
  −δ: *reproduced* (not worse) when the effect is above −δ, *contradicted* (worse) when it is
  below −δ, no *equivalent*;
* ``examples``: an option (off by default) that counts the evaluation set's examples as a sample
  as well as the seeds, for a ``final`` accuracy (:func:`launch.analysis.stats.example_variance`).

Measures (a claim's ``measure``):

``final``            the run's main metric at the end (``summary.json``'s ``final``);
``init:<key>``       a monitor quantity before the first step (the trainer logs it at step 0);
``time_to_target``   P4's speed: each seed's steps to a target (``Claim.target_fraction`` of
                     ``standard``'s mean final metric), censored where never reached; the row is the
                     ratio of the arms' Kaplan–Meier medians with a paired bootstrap over seeds
                     (:mod:`launch.analysis.time_to_quality`), not a mean of per-seed differences;
``stages``           P5's two stages, read from ``standard``'s own validation accuracy by a
                     penalised changepoint segmentation, no hand-picked threshold
                     (:mod:`src.sandbox.stages`): for a seed that leaves its first plateau and
                     ends the rise after it, the first plateau minus that rise, over the run's
                     length; two stages show as a plateau longer than the rise (> 0). A seed that
                     never leaves its plateau is censored: counted, and in the note's
                     Kaplan–Meier median of the first plateau, not in the mean.

Each measure is registered by name (:mod:`launch.analysis.measures`: ``final``, ``monitor:``,
``time_to_target`` and ``stages`` here) and :func:`verdicts` dispatches through the registry; the
row, its Holm adjustment and its renderer are :mod:`launch.analysis.verdict_row`'s. The report
renders the verdicts as its *Claims* section (:func:`claims_section`).

A comparison no claim makes is the same row without its claim: :func:`effects` compares every
experiment but the baseline's (``standard``, or the one the report's ``--baseline`` names) with the
baseline in its setting, paired by seed as the claims' rows are (:func:`pairings`), tested by the
same paired t-test in the metric's own direction (*better*, *worse*, *equivalent* against δ,
*inconclusive*), a task's rows one Holm family (:func:`adjust`); :func:`effects_section` renders
them with the claims' row (:func:`launch.analysis.verdict_row.row`).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from src.sandbox.stages import Stages, accuracy_stages, plateau_km_median
from src.sandbox.stages import stages as curve_stages

from . import reading_files, stats
from . import time_to_quality as ttq
from .claims import ANY_ROW, CHECKED_BY_TESTS, CLAIMS, Claim
from .measures import COMPARED as COMPARED  # where it was before (launch.ask and its test read it here)
from .measures import Evidence, lookup, register
from .records import Run, options, variant_label
from .results import describe, not_attn, tested
from .verdict_row import CLAIM_COLUMNS, TABLE, Verdict, adjust, row, signed

#: The points of training a monitor measure is read at, each its own family: before the first
#: step, the mean over the monitor steps strictly between the first and the last, and the last.
WHEN = ("at init", "during training", "at the end")


def monitor_point(run: Run, key: str, when: str) -> float | None:
    """A monitor quantity at one of :data:`WHEN` (κ in log10; None where the run has no such
    point: ``during training`` needs a monitor step strictly inside the run)."""
    steps = sorted({r["step"] for r in run.rows if r.get("split") == "monitor" and r.get(key) is not None})
    if when == "at init":
        return monitor_at(run, key, 0)
    if not steps or steps[-1] == 0:
        return None
    if when == "at the end":
        return monitor_at(run, key, steps[-1])
    inside = [v for s in steps[1:-1] if s > 0 and (v := monitor_at(run, key, s)) is not None]
    return statistics.fmean(inside) if inside else None


def monitor_at(run: Run, key: str, step: int = 0) -> float | None:
    """A monitor quantity at ``step`` (κ in log10)."""
    row = next((r for r in run.rows if r.get("split") == "monitor" and r.get("step") == step), None)
    value = None if row is None else row.get(key)
    if value is None:
        return None
    return math.log10(value) if key.startswith("kappa/") and value > 0 else float(value)


def run_stages(run: Run) -> Stages | None:
    """The stages of a run's validation curve (:mod:`src.sandbox.stages`); an accuracy measured on
    ``task.test_size`` examples is segmented on the arcsine scale with that test set's noise floor."""
    steps, values = run.series(run.metric)
    if not steps:
        return None
    test_size = run.identity.config.get("task", {}).get("test_size")
    if test_size and run.metric.endswith("acc"):
        return accuracy_stages(steps, values, int(test_size))
    return curve_stages(steps, values, higher_is_better=run.higher_is_better)


def stages(run: Run) -> float | None:
    """P5's first plateau minus the rise after it, over the run's length, for a seed that leaves
    its plateau and ends that rise (else ``None``: censored)."""
    found = run_stages(run)
    if found is None or found.censored or found.first_rise is None or found.rise_censored:
        return None
    steps, _ = run.series(run.metric)
    return (found.first_plateau - found.first_rise) / steps[-1]


def verdicts(
    runs: list[Run],
    claims: list[Claim] = CLAIMS,
    margins: dict[str, float] | None = None,
    levels: dict[str, stats.Levels] | None = None,
    examples: dict[str, int] | None = None,
    on: str = "auto",
) -> list[Verdict]:
    """Every claim on every task it names, for every reading of its variant found in ``runs``;
    ``margins`` (``{claim key: δ}``) replaces the claims' own; ``levels`` (``{experiment hash:
    levels}``, from a settled sweep's looks) the fixed levels of the rows of those readings;
    ``examples`` (``{task: its evaluation set's size}``): count those examples as a sample in a
    ``final`` accuracy's interval (None, the default, and a task not named: the set is the
    task). ``on``: a ``final`` claim's numbers are test numbers where every run of its row has one
    (``auto``) or always final validation values (``val``: :func:`split_of`). Each claim's readings
    on one task are a family, adjusted together (:func:`adjust`)."""
    readable = [r for r in runs if r.status != "unreadable"]  # an unreadable folder has no reading
    out = []
    for claim in claims:
        judge = lookup(claim.measure).runs  # the registry: launch.analysis.measures
        if judge is None:  # read from seed sets only (launch/analysis/seed_verdicts.py)
            continue
        margin = (margins or {}).get(claim.key, claim.margin)
        for task in claim.tasks:
            here = [r for r in readable if r.task == task]
            evidence = Evidence(task, here, margin, (examples or {}).get(task), on)
            for found in judge(claim, evidence):
                for v in found:
                    v.levels = (levels or {}).get(v.experiment, stats.FIXED)
                for stage in dict.fromkeys(v.stage for v in found):  # a confirm stage: one planned test
                    out += adjust([v for v in found if v.stage == stage])
    return out


@register("final", "runs")
def final_verdicts(claim: Claim, evidence: Evidence) -> list[list[Verdict]]:
    """``final``: the runs' main metric, a test number where every run of a row has one; the
    claim's readings on the task one family."""
    return [_paired(claim, evidence, lambda run, split: _final(run, split), metric=True)]


@register("monitor:", "runs")
def monitor_verdicts(claim: Claim, evidence: Evidence) -> list[list[Verdict]]:
    """``monitor:<key>``: a monitor quantity (κ in log10) at each point of :data:`WHEN`, each
    point its own family."""
    key = claim.measure.removeprefix("monitor:")
    return [
        _paired(claim, evidence, lambda run, split, when=when: monitor_point(run, key, when), when=when)
        for when in WHEN
    ]


def reading_labels(runs: list[Run]) -> dict[str, str]:
    """``{experiment: "lam=10.0, targets=q"}``: the ``attn`` options that tell a variant's readings
    apart (:func:`launch.analysis.records.options` among that variant's experiments; ``default`` where a
    variant has one reading)."""
    labels = {}
    for variant in {r.attn for r in runs}:
        for experiment, settings in options([r for r in runs if r.attn == variant]).items():
            shown = [f"{k.removeprefix('attn.')}={v}" for k, v in settings.items() if k.startswith("attn.")]
            labels[experiment] = ", ".join(shown) or "default"
    return labels


def counted(run: Run) -> bool:
    """A run a verdict uses: completed, with its main metric."""
    return run.status == "completed" and run.metric in run.final


def budget_of(run: Run) -> str:
    """What ``run`` was trained for, from its identity and summary: its steps, else epochs, then the
    other of the two where the summary knows an epoch's steps, the samples it saw (steps × global
    batch) and, for a language model, the tokens (``""`` if it has no length)."""
    config = run.identity.config
    trainer, task = config.get("trainer", {}) or {}, config.get("task", {}) or {}
    steps, epochs = trainer.get("max_steps"), trainer.get("max_epochs")
    per_epoch = run.steps_per_epoch
    if not steps and epochs and per_epoch:
        steps = epochs * per_epoch
    if not steps:
        return f"{epochs:g} epochs" if epochs else ""
    parts = [f"{steps:,} steps" if trainer.get("max_steps") else f"{epochs:g} epochs ({steps:,} steps)"]
    if trainer.get("max_steps") and per_epoch:
        parts.append(f"{steps / per_epoch:.1f} epochs")
    batch = task.get("batch_size")
    if isinstance(batch, int):
        samples = steps * batch * int(trainer.get("accumulate") or 1)
        seq = task.get("seq_len") if task.get("input") == "causal_lm" else None
        parts.append(f"{samples * seq:,} tokens" if isinstance(seq, int) else f"{samples:,} samples")
    return " · ".join(parts)


def left_out(runs: list[Run], paired: set[int]) -> str:
    """The runs of a row not in its pairs, named: failed or unfinished ones, and seeds without a
    partner (never dropped without a word)."""
    out = [f"{r.attn} seed {r.seed} {r.status}" for r in runs if not counted(r)]
    out += [f"{r.attn} seed {r.seed} unpaired" for r in runs if counted(r) and r.seed not in paired]
    return "; ".join(sorted(set(out)))


@dataclass
class Pairing:
    """One reading of a claim's variant and ``standard`` in the same setting: every run of each
    (``everyone``, ``every_base``) and the ones a verdict counts (``members``, ``base``)."""

    experiment: str
    label: str
    everyone: list[Run]
    every_base: list[Run]
    members: list[Run]
    base: list[Run]

    def place(self, v: Verdict, claim: Claim) -> Verdict:
        """Give ``v`` what ties it to its runs: experiments, stage, budget, reading file and role."""
        first = self.everyone[0]
        v.experiment, v.baseline_experiment = self.experiment, self.every_base[0].experiment
        v.stage = first.identity.config.get("stage") or ""
        v.budget = budget_of(first)
        v.reading_file = reading_files.matching(first) or ""
        v.role = "confirm" if v.stage else "primary" if v.reading_file == claim.primary else "exploratory"
        if v.stage:
            v.reading += f" ({v.stage})"
        return v


def pairings(claim: Claim | None, every: list[Run], baseline: str = "standard") -> list[Pairing]:
    """The claim's variant's readings found in ``every`` (no claim: every experiment but the
    baseline's), each with its baseline in its setting: the same identity but the variant and its
    options (:attr:`Run.context`), the baseline being ``standard`` or the variant with options
    that ``baseline`` names (``spectral mode=svd``). A reading without a completed baseline
    beside it has nothing to be compared with."""
    by_experiment: dict[str, list[Run]] = defaultdict(list)
    for r in every:
        by_experiment[r.experiment].append(r)
    baselines = {m[0].context: m for m in by_experiment.values() if is_baseline(m[0], baseline)}
    labels = reading_labels(every)
    out = []
    for experiment, everyone in sorted(by_experiment.items(), key=lambda kv: labels[kv[0]]):
        every_base = baselines.get(everyone[0].context)
        skip = is_baseline(everyone[0], baseline) if claim is None else everyone[0].attn != claim.variant
        if skip or every_base is None:
            continue
        members, base = [r for r in everyone if counted(r)], [r for r in every_base if counted(r)]
        if base:
            out.append(Pairing(experiment, labels[experiment], everyone, every_base, members, base))
    return out


def is_baseline(run: Run, baseline: str) -> bool:
    """Whether ``run`` is of the baseline ``baseline`` names: a variant with the options that are
    not its defaults (``standard``, ``spectral mode=svd``: :func:`launch.analysis.records.variant_label`)."""
    return run.attn == baseline.split(" ", 1)[0] and variant_label(run) == baseline


def effects(
    runs: list[Run],
    baseline: str = "standard",
    margins: dict[str, float] | None = None,
    levels: dict[str, stats.Levels] | None = None,
    examples: dict[str, int] | None = None,
    on: str = "auto",
) -> list[Verdict]:
    """Every experiment of ``runs`` but the baseline's, against the baseline in its setting (the
    same task, backbone, budget and every other setting: :func:`pairings`), one claimless
    :class:`Verdict` each: the mean per-seed difference of the main metric over the seeds both
    have, its 95% interval and the verdict (*better*, *worse*, *equivalent* inside ±δ,
    *inconclusive*) in the metric's own direction. Both arms' numbers are test numbers where
    every seed of both has one, else final validation values (``on="val"``: always validation, as
    the settle loop's looks read, :func:`split_of`). δ: ``margins``'
    (:func:`launch.analysis.claims.parse_margins`) of the claim that names the row (a ``final``
    claim on the variant and task, against ``standard``), else the claim's own δ, else the one
    given for every row (:data:`launch.analysis.claims.ANY_ROW`).
    ``levels`` and ``examples``: as :func:`verdicts`'. A task's rows are one Holm family
    (:func:`adjust`)."""
    readable = [r for r in runs if r.status != "unreadable"]
    out = []
    for task in sorted({r.task for r in readable}):
        here = [r for r in readable if r.task == task]
        settings = options(here)
        size = (examples or {}).get(task)
        pairs = pairings(None, here, baseline)
        found = [_effect(p, baseline, margins or {}, settings, size, on) for p in pairs]
        for v in found:
            v.levels = (levels or {}).get(v.experiment, stats.FIXED)
        out += adjust(found)
    return out


def naming_claim(run: Run, baseline: str) -> Claim | None:
    """The claim whose ``final`` measure compares ``run``'s variant with ``standard`` on its task."""
    if baseline != "standard":
        return None
    return next(
        (c for c in CLAIMS if c.measure == "final" and c.variant == run.attn and run.task in c.tasks), None
    )


def _effect(
    pair: Pairing,
    baseline: str,
    margins: dict[str, float],
    settings: dict[str, dict],
    examples: int | None = None,
    on: str = "auto",
) -> Verdict:
    """One comparison of :func:`effects`: the pair's reading against its baseline; ``settings``:
    what tells the task's experiments apart (:func:`launch.analysis.records.options`), its reading
    with the backbone (and where δ comes from, when a claim gives it); ``examples``: the task's
    evaluation set's size, counted as a sample (:func:`_example_var`); ``on``: the split it reads
    (:func:`split_of`)."""
    members, base, first = pair.members, pair.base, pair.everyone[0]
    split = split_of(members + base, on)
    mine, theirs = ({r.seed: _final(r, split) for r in arm} for arm in (members, base))
    seeds = sorted(set(mine) & set(theirs))
    diffs = [mine[s] - theirs[s] for s in seeds]
    sign = 1 if base[0].higher_is_better else -1
    claim = naming_claim(first, baseline)
    own = margins.get(claim.key, claim.margin) if claim else None
    margin = own if own is not None else margins.get(ANY_ROW)
    counted = _example_var(examples, base[0], mine, theirs, seeds)  # 0 without ``examples``
    test = stats.paired_test(diffs, sign, margin, example_var=counted)
    shown = describe(not_attn(settings.get(pair.experiment, {})))
    whence = [f"δ {claim.key}'s"] if own is not None else []
    reading = " · ".join([first.backbone] + ([] if shown == "—" else [shown]) + whence)
    return Verdict(
        None,
        first.task,
        reading,
        len(seeds),
        statistics.fmean(theirs[s] for s in seeds) if seeds else None,
        statistics.fmean(mine[s] for s in seeds) if seeds else None,
        test.mean if test else (diffs[0] if diffs else None),
        None if test is None else test.low,
        None if test is None else test.high,
        _entropy(members),
        claimed_sign=sign,
        metric=base[0].reported.key if split == "test" else base[0].metric or "",
        test=test,
        margin=margin,
        budget=budget_of(first),
        not_counted=left_out(pair.everyone + pair.every_base, set(seeds)),
        experiment=pair.experiment,
        baseline_experiment=pair.every_base[0].experiment,
        variant=variant_label(first),
        baseline_label=baseline,
    )


def _final(run: Run, split: str) -> float | None:
    """``run``'s number on ``split``: its test number, or its final validation value."""
    return run.reported.value if split == "test" else run.final.get(run.metric)


def split_of(runs: list[Run], on: str = "auto") -> str:
    """The split a row's numbers come from: ``test`` where every one of ``runs`` has its test
    number and ``on`` is ``auto`` (the report), else ``val`` (``on="val"``: the settle loop, whose
    looks choose how many seeds to run and must not see the test split)."""
    if on not in ("auto", "val"):
        raise ValueError(f"split {on!r} is not auto or val")
    return "test" if on == "auto" and runs and all(tested(r) for r in runs) else "val"


def _paired(
    claim: Claim,
    evidence: Evidence,
    value: Callable[[Run, str], float | None],
    when: str = "",
    metric: bool = False,
) -> list[Verdict]:
    """The claim against ``standard`` in the same setting, one verdict per reading, from each
    run's ``value`` (of the run and the split it reads); runs that did not complete are named in
    the row, not counted. ``when``: for a monitor measure, the point of training it is read at
    (:data:`WHEN`); ``metric``: the value is the runs' main metric, read on the split
    :func:`split_of` gives for ``evidence.on`` and with ``evidence.examples`` (the task's evaluation
    set's size) counted as a sample (:func:`_example_var`); else on validation, seeds alone."""
    out = []
    examples = evidence.examples if metric else None
    for pair in pairings(claim, evidence.runs):
        everyone, every_base, members, base = pair.everyone, pair.every_base, pair.members, pair.base
        split = split_of(members + base, evidence.on) if metric else "val"
        mine = {r.seed: value(r, split) for r in members}
        theirs = {r.seed: value(r, split) for r in base}
        seeds = sorted(s for s in mine if mine[s] is not None and theirs.get(s) is not None)
        no_value = [
            f"{r.attn} seed {r.seed} has no value {when or claim.measure}"
            for r in members + base
            if value(r, split) is None
        ]
        diffs = [mine[s] - theirs[s] for s in seeds]
        sign = (
            -1
            if claim.better == "lower" or (claim.better == "metric" and not base[0].higher_is_better)
            else 1
        )
        counted = _example_var(examples, base[0], mine, theirs, seeds)
        test = _test(claim, diffs, sign, evidence.margin, counted)
        low, high = (None, None) if test is None else (test.low, test.high)
        verdict = Verdict(
            claim,
            evidence.task,
            pair.label + (f" · {when}" if when else ""),
            len(seeds),
            statistics.fmean(theirs[s] for s in seeds) if seeds else None,
            statistics.fmean(mine[s] for s in seeds) if seeds else None,
            statistics.fmean(diffs) if diffs else None,
            low,
            high,
            _entropy(members),
            claimed_sign=sign,
            metric=base[0].reported.key if split == "test" else base[0].metric or "",
            test=test,
            margin=evidence.margin,
            not_counted="; ".join(filter(None, [left_out(everyone + every_base, set(seeds)), *no_value])),
        )
        out.append(pair.place(verdict, claim))
    return out


def _test(
    claim: Claim, diffs: list[float], sign: int, margin: float | None, example_var: float
) -> stats.PairedTest | None:
    """The paired test a claim's kind asks for: superiority with TOST against ±δ, or
    non-inferiority, one-sided against −δ (no equivalence)."""
    if claim.kind == "non-inferiority":
        if margin is None:
            raise ValueError(f"claim {claim.key}: a non-inferiority claim needs its margin δ")
        return stats.paired_test(diffs, sign, None, bound=-margin, example_var=example_var)
    return stats.paired_test(diffs, sign, margin, example_var=example_var)


def _example_var(
    examples: int | None, base: Run, mine: dict[int, float], theirs: dict[int, float], seeds: list[int]
) -> float:
    """The variance an evaluation set of ``examples`` adds to a mean difference of accuracies
    (0 without ``examples``, or for a metric that is not an accuracy in [0, 1])."""
    if not examples or not seeds or not base.metric.endswith("acc"):
        return 0.0
    variant, baseline = (statistics.fmean(arm[s] for s in seeds) for arm in (mine, theirs))
    if not (0 <= variant <= 1 and 0 <= baseline <= 1):
        return 0.0
    return stats.example_variance(variant, baseline, examples)


@register("time_to_target", "runs", unit="ratio")
def to_target_verdicts(claim: Claim, evidence: Evidence) -> list[list[Verdict]]:
    """P4's speed, one verdict per reading: the ratio ``reading / standard`` of the Kaplan–Meier
    median steps to the target, over the seeds both arms have (:mod:`launch.analysis.time_to_quality`);
    *inconclusive*, with the reason in the row, where a median is not reached."""
    out = []
    for pair in pairings(claim, evidence.runs):
        everyone, every_base, members, base = pair.everyone, pair.every_base, pair.members, pair.base
        fraction = claim.target_fraction or 1.0
        goal = ttq.target([r.final[r.metric] for r in base], base[0].higher_is_better, fraction)
        mine = {r.seed: ttq.steps_to_target(r, goal) for r in members}
        theirs = {r.seed: ttq.steps_to_target(r, goal) for r in base}
        seeds = sorted(s for s in mine if mine[s] is not None and theirs.get(s) is not None)
        arms = [ttq.arm_median([arm[s] for s in seeds]) if seeds else None for arm in (theirs, mine)]
        ratio = (
            ttq.median_ratio([theirs[s] for s in seeds], [mine[s] for s in seeds]) if len(seeds) > 1 else None
        )
        verdict = Verdict(
            claim,
            evidence.task,
            pair.label,
            len(seeds),
            arms[0] and arms[0].steps,
            arms[1] and arms[1].steps,
            None if ratio is None else ratio.ratio,
            None if ratio is None else ratio.low,
            None if ratio is None else ratio.high,
            _entropy(members),
            claimed_sign=-1,
            metric=base[0].metric or "",
            not_counted=left_out(everyone + every_base, set(seeds)),
        )
        pair.place(verdict, claim)
        verdict.note = _speed_note(claim, goal, fraction, base[0], arms, ratio, seeds)
        if ratio is not None:  # the bootstrap's p-values, in the shape three_way and Holm read
            nan = float("nan")  # no t-test spread: no MDE, no seeds for δ
            verdict.test = stats.PairedTest(
                len(seeds), ratio.ratio, nan, ratio.low, ratio.high, ratio.p_for, ratio.p_against, None
            )
        out.append(verdict)
    return [out]


def _speed_note(
    claim: Claim,
    goal: float,
    fraction: float,
    base: Run,
    arms: list[ttq.Median | None],
    ratio: ttq.Ratio | None,
    seeds: list[int],
) -> str:
    """The target and each arm's median [interval] (censored seeds), or why no ratio was formed."""
    factor = fraction if base.higher_is_better else 2 - fraction
    reach = "≥" if base.higher_is_better else "≤"
    text = f"target {base.metric} {reach} {goal:.4g} ({factor:g} × standard's mean final)"
    if arms[0] is None:
        return f"{text}: no seed of both arms"
    text += f": standard {arms[0]} → {claim.variant} {arms[1]}"
    if ratio is None:
        missing = [
            name for name, arm in zip(("standard", claim.variant), arms, strict=True) if arm.steps is None
        ]
        why = (
            f"{' and '.join(missing)}'s median not reached"
            if missing
            else "fewer than two seeds"
            if len(seeds) < 2
            else "standard's median is step 0"
        )
        text += f"; no ratio: {why}"
    return text


@register("stages", "runs")
def stages_verdicts(claim: Claim, evidence: Evidence) -> list[list[Verdict]]:
    """P5's two stages on ``standard``'s own seeds (one-sample: the plateau minus the rise)."""
    by_experiment: dict[str, list[Run]] = defaultdict(list)
    for r in evidence.runs:
        if r.attn == claim.variant:
            by_experiment[r.experiment].append(r)
    out = []
    for everyone in by_experiment.values():
        members = [r for r in everyone if counted(r)]
        values = [v for r in members if (v := stages(r)) is not None]
        test = stats.paired_test(values)
        low, high = (None, None) if test is None else (test.low, test.high)
        found = [f for r in members if (f := run_stages(r)) is not None]
        median = plateau_km_median(found)
        note = (
            f"{len(values)} of {len(members)} seeds leave the first plateau and end the rise; "
            f"{sum(f.censored for f in found)} never leave it (censored); Kaplan–Meier median "
            f"first plateau {'not reached' if median is None else f'{median:.0f} steps'}"
        )
        mean = statistics.fmean(values) if values else None
        entropy = _entropy(members)
        verdict = Verdict(claim, evidence.task, "—", len(values), None, mean, mean, low, high, entropy, note)
        verdict.test = test
        verdict.budget = budget_of(everyone[0])
        verdict.not_counted = left_out(everyone, {r.seed for r in members})
        verdict.experiment = everyone[0].experiment
        verdict.reading_file, verdict.role = "standard", "primary"  # P5 is about standard itself
        out.append(verdict)
    return [out]


def _entropy(members: list[Run]) -> float | None:
    values = [v for r in members if (v := monitor_at(r, "entropy/P/median")) is not None]
    return statistics.fmean(values) if values else None


# -- the report's Claims section ------------------------------------------------------------


#: What the Claims section's columns and verdicts mean (its opening paragraph).
CLAIMS_EXPLAINED = (
    "Each paper claim per task and *reading* (the variant's options that tell its readings apart), "
    "never pooled: *ours* is `standard` → the reading (means over the seeds both have; `final` "
    "is the main metric's test number where every run of the row has one (the *metric* column "
    "says `test/…`), else its final validation value; κ as "
    "10^mean log10), *effect* the mean per-seed difference (κ in log10) with its 95% Student-t "
    "interval. *reproduced*: the interval excludes 0 on the paper's side; *contradicted*: on the "
    "other side; *equivalent*: the 90% interval lies inside ±δ, the claim's smallest effect of "
    "interest (no effect as large as the paper's); *inconclusive*: none of these. *Holm*: the "
    "verdict with the p-values adjusted over the claim's readings on the task (a verdict that "
    "holds only unadjusted is marked †). *budget*: what the runs trained for; *n*: the paired "
    "seeds, and the runs left out named (failed, unfinished, unpaired). *MDE*: the smallest "
    "effect these seeds detect with 80% power, from the paired differences' spread, at the level "
    "the row is tested at, printed beside it: its look's one-sided level (2.5% fixed, or a settled "
    "sweep's look) over m, the rows of its Holm family (Holm's first step, α/m: a conservative "
    "planning level, since Holm's later steps depend on the data); *seeds for δ*: how many a test "
    "of δ would need at 80% power at that level (a settled sweep's: at its last look's). "
    'A *non-inferiority* claim ("at least as good") is tested one-sided against −δ: '
    "*reproduced* (not worse): the effect is above −δ (the 95% interval's lower end above −δ); "
    "*contradicted* (worse): below −δ; no *equivalent*; its MDE is the smallest δ its test has "
    "80% power for at a true effect of 0. *time_to_target* (P4's speed): *ours* is the target "
    "and each arm's Kaplan–Meier median steps to it [95% interval] with the seeds censored (never "
    "reached it), the effect the ratio of the medians with a paired bootstrap's interval (a bound "
    "of 0 or ∞: resamples in which standard's, or the reading's, median is never reached). "
    "*reading*: the `conf/reading/` file the runs match, **primary** where it is the claim's "
    "reading chosen from the paper's text before any run (its row is the claim's answer); the "
    "others are exploratory, and ‡ marks a verdict that holds only for an exploratory reading "
    "(quote it only after a confirm stage on fresh seeds, `(confirm)` rows). κ claims are read "
    "at init, during training (the mean over the inner monitor steps) and at the end, each "
    "point its own family. "
    "*entropy*: the reading's median attention entropy "
    "at init (1 uniform, 0 one-hot): κ(P) = 1 is what a collapsed attention scores, so read κ "
    "beside it."
)


def claims_section(found: list[Verdict], stopping: list[str] = ()) -> list[str]:
    """The "Claims" section: every claim of :mod:`launch.analysis.claims` per task and reading, with our
    effect against ``standard`` (95% interval over paired seeds) and the verdict; ``stopping``: the
    rules of sweeps whose seeds were added until settled (:mod:`launch.analysis.settle`)."""
    if not found:
        return []
    lines = [
        "",
        "## Claims",
        "",
        CLAIMS_EXPLAINED,
    ]
    if stopping:
        lines += [
            "",
            "Seeds added until settled (`python -m launch.analysis.settle`); each row is read at the "
            "levels of the look its seeds reached, not at the fixed ones:",
            "",
            *(f"- {rule}" for rule in stopping),
        ]
    for claim in dict.fromkeys(v.claim for v in found):
        lines += [
            "",
            f"### {claim.source} {claim.key.split('-', 1)[1]}: {claim.statement}",
            "",
            f"Paper: {claim.paper}. Measure: `{claim.measure}`. {_kind(claim)}δ: {_margin(claim, found)}.",
            "",
            *TABLE,
        ]
        lines += [row(v, CLAIM_COLUMNS) for v in found if v.claim == claim]
    if CHECKED_BY_TESTS:
        lines += ["", "Claims that need no training, checked by tests:", ""]
        lines += [f"- {t.source}: {t.statement}: {t.finding} (`{t.test}`)" for t in CHECKED_BY_TESTS]
    return lines


def effects_section(found: list[Verdict], baseline: str = "standard") -> list[str]:
    """The "Effects" section: every row of :func:`effects`, per task, in :data:`TABLE`'s shape."""
    if not found:
        return []
    lines = [
        "",
        f"## Effects against `{baseline}`",
        "",
        f"Every experiment of the table but `{baseline}`'s, against `{baseline}` in the same setting (task, "
        "backbone, budget and every other setting; the variant and its options apart), paired by seed: "
        f"*ours* is `{baseline}` → the reading (means over the seeds both have: test numbers where every "
        "seed of both has one, else final validation values), *effect* the mean per-seed difference "
        "with its 95% Student-t interval, *n* the paired seeds (the runs left out named). *better* / "
        "*worse*: the interval excludes 0 on the metric's better / worse side; *equivalent*: the 90% "
        "interval lies inside ±δ, δ given with `--margin DELTA` (in the metric's units: 0.01 is one "
        "point of accuracy), or the claim's δ where a claim names the row (*reading* says so); "
        "*inconclusive*: none of these. *Holm*: the verdict with the p-values adjusted over the task's "
        "rows. *MDE* and *seeds for δ* as in the Claims section. The forest plot of each task "
        "(`forest_<task>.png`) draws these rows; `differences_<task>_<backbone>.png` the paired "
        "differences over training.",
    ]
    for task in dict.fromkeys(v.task for v in found):
        lines += ["", f"### {task}", "", *TABLE]
        lines += [row(v, CLAIM_COLUMNS) for v in found if v.task == task]
    return lines


def _kind(claim: Claim) -> str:
    """The claim's test, where it is not superiority's."""
    return "Test: non-inferiority (effect > −δ, one-sided). " if claim.kind == "non-inferiority" else ""


def answers(found: list[Verdict]) -> dict[tuple[str, str, str], str]:
    """``{(claim key, task, point): verdict}``: each claim's answer on each task (and point of
    training, for a monitor measure), the Holm-adjusted verdict of its *primary* reading; a
    confirm-stage row of the primary, where there is one, answers instead. Exploratory rows are
    never the answer."""
    out: dict[tuple[str, str, str], str] = {}
    for v in found:
        point = v.reading.rsplit(" · ", 1)[1] if " · " in v.reading else ""
        if v.role == "primary" or (v.role == "confirm" and v.reading_file == v.claim.primary):
            key = (v.claim.key, v.task, point.removesuffix(" (confirm)"))
            if v.role == "confirm" or key not in out:
                out[key] = v.adjusted
    return out


def _margin(claim: Claim, found: list[Verdict]) -> str:
    """δ as the rows use it (the user's where given), in the measure's printed unit."""
    margin = next((v.margin for v in found if v.claim == claim), claim.margin)
    if margin is None:
        return "none declared (no *equivalent* verdict)"
    first = next(v for v in found if v.claim == claim)
    unit = f" — {claim.margin_unit}" if claim.margin_unit and margin == claim.margin else ""
    return signed(first, margin).lstrip("+") + unit
