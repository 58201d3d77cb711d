"""The one verdict row: :class:`Verdict`, its multiplicity adjustment (:func:`adjust`) and its
renderer (:func:`row`, :func:`cells`).

Every comparison the suite judges is one :class:`Verdict`, whatever its evidence: a claim on a task
for one reading from run records (:mod:`launch.analysis.verdicts`), a comparison no claim makes
(:func:`launch.analysis.verdicts.effects`), a P5 claim on a seed set or a memory run
(:mod:`launch.analysis.seed_verdicts`), one seed set against another
(:func:`launch.analysis.seed_sets.compare`). Each carries its effect and interval in its measure's
units (:mod:`launch.analysis.measures` says which), ``n``, and the three one-sided p-values its
verdict is read from (:attr:`Verdict.test`: for, against, equivalence); :func:`adjust` is Holm
over one family of them, each side and the equivalence separately; :func:`row` writes one as a
Markdown table row, its columns (:data:`COLUMNS`) chosen by the section it stands in.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from . import stats
from .claims import Claim
from .measures import lookup
from .results import fmt


@dataclass
class Verdict:
    """One claim on one task for one reading; or, with no ``claim``, one comparison of a reading
    with its baseline (:func:`launch.analysis.verdicts.effects`: every row of the report that is not
    the baseline); or a P5 claim on one seed set or memory run."""

    claim: Claim | None
    task: str
    reading: str  # the variant's options (what tells this experiment apart)
    n: int  # seeds paired with standard (or, for ``stages``, standard's seeds that learn)
    baseline: float | None  # standard's mean of the measure (log10 for κ)
    value: float | None  # the reading's mean of the measure (a seed set's: its statistic)
    effect: float | None  # mean of the per-seed differences (a seed set's: its statistic)
    low: float | None
    high: float | None
    entropy: float | None  # the reading's median attention entropy at init (mean over seeds)
    note: str = ""
    claimed_sign: int = 1  # +1: the paper says the effect is positive; -1: negative
    metric: str = ""  # the runs' main metric (for ``final``: how to print it)
    test: stats.PairedTest | None = None  # the test behind the interval and the p-values (None: untested)
    margin: float | None = None  # δ, the smallest effect of interest (the claim's, or the user's)
    adjusted: str = ""  # the verdict with the family's Holm-adjusted p-values (set by adjust())
    budget: str = ""  # what the runs were trained for ("150 steps", "3 epochs", "60 epochs × 6 seeds")
    not_counted: str = ""  # runs of this reading or its baseline left out, named ("seed 3 failed")
    levels: stats.Levels = (
        stats.FIXED
    )  # the levels it is read at (a settled sweep's look: launch.analysis.settle)
    experiment: str = ""  # the reading's experiment hash (launch.analysis.records.Run.experiment)
    baseline_experiment: str = ""  # standard's, in the same setting
    stage: str = (
        ""  # "confirm": fresh seeds of the confirm stage (launch.analysis.settle --confirm), its own family
    )
    reading_file: str = ""  # the conf/reading/ file its runs match ("" where none does)
    role: str = ""  # primary (the claim's reading, chosen from the text) | exploratory | confirm
    family: int = 1  # the rows of its Holm family with a test (set by adjust())
    variant: str = ""  # with no claim: the compared variant with its options (``scale_out factor=0.25``)
    baseline_label: str = ""  # with no claim: what it is compared with (``standard``)
    backbone: str = ""  # a seed set's backbone (``sandbox``, ``memory``)
    folder: str = ""  # a seed set's folder (a grid's cell: its name)
    measured: str = ""  # with no claim: the measure compared (``final`` where empty)

    @property
    def measure(self) -> str:
        """The claim's measure; a comparison without a claim compares :attr:`measured`, else the
        runs' main metric (``final``)."""
        return self.claim.measure if self.claim else self.measured or "final"

    @property
    def verdict(self) -> str:
        """The verdict at the unadjusted levels (:func:`launch.analysis.stats.three_way`)."""
        if self.test is None:
            return "no data" if self.n == 0 else "inconclusive"
        return self.named(stats.three_way(self.p_for, self.p_against, self.p_equivalent, self.levels))

    @property
    def p_for(self) -> float | None:
        """One-sided p-value of an effect on the claim's side (None: untested)."""
        return None if self.test is None else self.test.p_for

    @property
    def p_against(self) -> float | None:
        """One-sided p-value of an effect against it (None: untested)."""
        return None if self.test is None else self.test.p_against

    @property
    def p_equivalent(self) -> float | None:
        """TOST's p-value against ±δ (None: untested, or no margin)."""
        return None if self.test is None else self.test.p_equivalent

    @property
    def primary(self) -> bool:
        """Whether the row is of the claim's primary reading."""
        return self.role == "primary"

    def named(self, verdict: str) -> str:
        """A verdict in the row's words: a claim's (*reproduced*, *contradicted*), or, for a
        comparison no claim makes, its measure's (*better*, *worse*; *faster*, *slower*)."""
        if self.claim:
            return verdict
        return lookup(self.measure).words.get(verdict, verdict)

    @property
    def tested_at(self) -> stats.Levels:
        """The level its MDE is at: its look's over its Holm family
        (:func:`launch.analysis.stats.tested_at`)."""
        return stats.tested_at(self.levels, self.family)

    @property
    def detectable(self) -> float | None:
        """The smallest effect these seeds detect with 80% power at :attr:`tested_at`, from the
        differences' spread (for a non-inferiority claim: the smallest δ whose test has 80% power
        at a true effect of 0)."""
        if self.test is None:
            return None
        return stats.min_detectable_effect(self.test.sd, self.n, alpha=self.tested_at.side)

    @property
    def seeds_for_margin(self) -> int | None:
        """The seeds a test of δ would need at 80% power (None without δ or without a spread), at
        the level of its schedule's last look over its Holm family (``planned``)."""
        if self.test is None or self.margin is None:
            return None
        level = stats.tested_at(self.levels, self.family, planned=True)
        return stats.seeds_needed(self.test.sd, self.margin, alpha=level.side)


def adjust(family: list[Verdict]) -> list[Verdict]:
    """Set each verdict's ``adjusted`` from Holm's adjustment of the family's p-values (each
    side and the equivalence tested separately, each at its own level; the equivalence over the
    rows that have its test), and its ``family``; an untested row's ``adjusted`` is its verdict."""
    tested = [v for v in family if v.test is not None]
    p_for = stats.holm([v.p_for for v in tested])
    p_against = stats.holm([v.p_against for v in tested])
    with_margin = [v for v in tested if v.p_equivalent is not None]
    p_equivalent = dict(
        zip(map(id, with_margin), stats.holm([v.p_equivalent for v in with_margin]), strict=True)
    )
    for v, up, down in zip(tested, p_for, p_against, strict=True):
        v.adjusted = v.named(stats.three_way(up, down, p_equivalent.get(id(v)), v.levels))
        v.family = len(tested)
    for v in family:
        v.adjusted = v.adjusted or v.verdict
    return family


def known_test(
    n: int,
    effect: float | None,
    low: float | None,
    high: float | None,
    p_for: float | None,
    p_against: float | None,
    p_equivalent: float | None = None,
) -> stats.PairedTest | None:
    """A test known by its p-values and interval alone (a sign test, a bootstrap, Fisher's), in the
    shape :class:`Verdict` reads: no t spread, so no MDE (None where ``p_for`` is None: untested)."""
    if p_for is None:
        return None
    nan = float("nan")
    mean = nan if effect is None else effect
    low, high = (nan if low is None else low), (nan if high is None else high)
    return stats.PairedTest(n, mean, nan, low, high, p_for, p_against, p_equivalent)


# -- the renderer: one row of any section's table -------------------------------------------------


def row(v: Verdict, columns: Sequence[str]) -> str:
    """``v`` as one Markdown table row of ``columns`` (names of :data:`COLUMNS`)."""
    return f"| {cells(v, columns)} |"


def lines(compared: Sequence[Verdict]) -> str:
    """The comparisons (rows without a claim) one line each, as ``launch.analysis.report`` prints
    them: task, what against what, effect [95% interval], n and the verdict with Holm's adjustment."""
    shown = [
        f"{v.task} · {v.variant} vs {v.baseline_label or 'standard'}: {_effect(v)} {v.metric}, n={v.n}, "
        f"{v.adjusted or v.verdict}"
        for v in compared
        if v.claim is None
    ]
    return "\n".join(shown) or "no comparisons: no row has a baseline run of the same setting and seeds"


def cells(v: Verdict, columns: Sequence[str]) -> str:
    """``v``'s cells of ``columns``, joined as a table row's inside."""
    return " | ".join(COLUMNS[c](v) for c in columns)


def _ours(v: Verdict) -> str:
    if v.measure in ("stages", "time_to_target"):
        return v.note
    return "—" if v.value is None else f"{_measured(v, v.baseline)} → {_measured(v, v.value)}"


def _effect(v: Verdict) -> str:
    effect = "—" if v.effect is None else signed(v, v.effect)
    if v.low is not None:
        effect += f" [{signed(v, v.low)}, {signed(v, v.high)}]"
    return effect


def _detectable(v: Verdict) -> str:
    if v.detectable is None:
        return "—"
    return signed(v, v.detectable).lstrip("+") + f" ({stats.describe_level(v.tested_at)})"


def _reading(v: Verdict) -> str:
    name = f"`{v.reading_file}`" if v.reading_file else ""
    return " ".join(filter(None, [name, "**primary**" if v.role == "primary" else "", v.reading]))


def _verdict(v: Verdict) -> str:
    only_raw = "†" if v.verdict != v.adjusted and v.verdict != "inconclusive" else ""
    exploratory = "‡" if v.role == "exploratory" and v.verdict != "inconclusive" else ""
    return f"**{v.verdict}**{_words(v, v.verdict)}{only_raw}{exploratory}"


def _statistic(v: Verdict) -> str:
    """A seed set's statistic [interval]: a difference signed, a share not."""
    signed = "+" if lookup(v.measure).unit == "difference" else ""
    value = "—" if v.value is None else f"{v.value:{signed}.2f}"
    interval = "" if v.low is None or math.isnan(v.low) else f" [{v.low:.2f}, {v.high:.2f}]"
    return value + interval


def _seeds(v: Verdict) -> str:
    return "—" if v.margin is None or v.test is None else str(v.seeds_for_margin or "> 1000")


def _verdict_holm(v: Verdict) -> str:
    adjusted = f" ({v.adjusted})" if v.adjusted and v.adjusted != v.verdict else ""
    return f"{v.verdict}{adjusted}"


#: every column a section's table may have, by name: how it prints a row's cell
COLUMNS: dict[str, Callable[[Verdict], str]] = {
    "task": lambda v: v.task,
    "variant": lambda v: v.variant or v.claim.variant,
    "reading": _reading,
    "budget": lambda v: v.budget or "—",
    "n": lambda v: f"{v.n} (not counted: {v.not_counted})" if v.not_counted else str(v.n),
    "ours": _ours,
    "effect": _effect,
    "mde": _detectable,
    "seeds for δ": _seeds,
    "entropy": lambda v: "—" if v.entropy is None else f"{v.entropy:.3f}",
    "verdict": _verdict,
    "holm": lambda v: f"{v.adjusted}{_words(v, v.adjusted)}",
    # a seed set's (launch.analysis.seed_verdicts, launch.analysis.seed_sets)
    "claim": lambda v: f"`{v.claim.key}`",
    "backbone": lambda v: f"`{v.backbone}`",
    "set reading": lambda v: f"`{v.reading}`{' †' if v.primary else ''}",
    "set": lambda v: v.folder,
    "statistic": _statistic,
    "verdict (holm)": _verdict_holm,
    "note": lambda v: v.note,
    "p for / against": lambda v: f"{v.p_for:.3g} / {v.p_against:.3g}",
    "verdict / holm": lambda v: f"{v.verdict} / {v.adjusted}",
}

#: the claims' and the comparisons' table (:func:`launch.analysis.verdicts.claims_section`)
CLAIM_COLUMNS = (
    "task", "variant", "reading", "budget", "n", "ours", "effect", "mde", "seeds for δ", "entropy",
    "verdict", "holm",
)  # fmt: skip
#: the head of a table of :data:`CLAIM_COLUMNS` rows
TABLE = (
    "| task | variant | reading | budget | n | ours | effect [95% CI] | MDE | seeds for δ "
    "| entropy | verdict | Holm |",
    "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
)


#: a non-inferiority claim's verdicts in its own words
NOT_WORSE = {"reproduced": " (not worse)", "contradicted": " (worse)"}


def _words(v: Verdict, verdict: str) -> str:
    """`` (not worse)`` / `` (worse)`` after a non-inferiority claim's verdict (else nothing)."""
    return NOT_WORSE.get(verdict, "") if v.claim and v.claim.kind == "non-inferiority" else ""


def _measured(v: Verdict, value: float | None) -> str:
    """A mean of the claim's measure: the metric as the tables print it, κ as a power of 10."""
    if value is None:
        return "—"
    if v.measure.startswith("monitor:kappa"):
        return f"10^{value:.2f}"
    return fmt(value, v.metric) if v.measure == "final" else f"{value:.2f}"


def signed(v: Verdict, value: float) -> str:
    """A difference in the row's measure's printed unit: accuracy points for ``final``, a ratio
    for ``time_to_target``."""
    if v.measure == "final":
        text = fmt(abs(value), v.metric)
        return ("−" if value < 0 else "+") + text
    if v.measure == "time_to_target":  # a ratio of medians, not a difference
        return "∞" if math.isinf(value) else f"{value:.2f}×"
    return f"{value:+.3f}"
