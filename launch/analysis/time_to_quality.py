"""Time to quality: steps to a target with censoring, Kaplan–Meier medians, and their ratio.

P4 says conditioned initialization "converges in 0.70× the steps". That is a statement about a
curve, so it is measured as one: each seed's *steps to target* (the first validation step at which
its metric reaches a target fixed by a rule stated before the runs), with the seeds that never
reach it kept as *censored* at their last validation step rather than dropped or counted as if
they had arrived there. From those:

* :func:`target`: **[reading]** the target is a fraction ``f`` of ``standard``'s mean final metric:
  ``f × mean`` for a metric that rises (accuracy), ``(2 − f) × mean`` for one that falls (loss,
  perplexity): "within ``1 − f`` of where ``standard`` ends". ``Claim.target_fraction`` holds ``f``.
* :func:`km_median`: per arm, the Kaplan–Meier estimate of the share of seeds not yet at the
  target (``scipy.stats.ecdf`` on right-censored data); its median is the smallest step at which
  that share is ≤ ½, and the 95% interval is where the pointwise log-log band of the curve crosses
  ½ (the band-inversion interval of R's ``survfit``, after Brookmeyer and Crowley 1982): from the
  first step the band's lower edge is ≤ ½ to the first step its upper edge is. A median, or the
  interval's upper end, that the curve never reaches is ``None`` (*not reached*).
* :func:`median_ratio`: ``reading / standard`` of the two medians, with a 95% percentile interval
  and one-sided p-values from a paired bootstrap over seeds (seeds resampled with both arms
  together, a fixed generator seed), so the verdict fits :func:`launch.analysis.stats.three_way` and Holm.

Both arms share the budget, so steps are compared as steps (no fraction of the run's length).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .records import Run

RESAMPLES = 2000
CONFIDENCE = 0.95


def target(finals: Sequence[float], higher: bool, fraction: float) -> float:
    """The target from ``standard``'s final metrics: ``fraction`` of their mean for a metric that
    rises, ``2 − fraction`` of it for one that falls."""
    mean = float(np.mean(finals))
    return fraction * mean if higher else (2 - fraction) * mean


def steps_to_target(run: Run, goal: float) -> tuple[int, bool] | None:
    """``(step, reached)``: the first validation step whose metric reaches ``goal``, else the last
    validation step, censored (``reached`` False). None without a validation series."""
    steps, values = run.series(run.metric)
    if not steps:
        return None
    for step, value in zip(steps, values, strict=True):
        if (value >= goal) if run.higher_is_better else (value <= goal):
            return step, True
    return steps[-1], False


@dataclass(frozen=True)
class Median:
    """One arm's Kaplan–Meier median steps to target, its 95% interval, and its seeds."""

    steps: float | None  # None: the curve never falls to ½ (not reached)
    low: float | None
    high: float | None  # None: the band's upper edge never falls to ½
    n: int
    censored: int  # seeds that never reached the target

    def __str__(self) -> str:
        def text(x: float | None) -> str:
            return "not reached" if x is None else f"{x:,.0f}"

        interval = "" if self.steps is None else f" [{text(self.low)}, {text(self.high)}]"
        return f"{text(self.steps)}{interval} ({self.censored} of {self.n} censored)"


def km_median(steps: Sequence[float], reached: Sequence[bool], confidence: float = CONFIDENCE) -> Median:
    """The Kaplan–Meier median of ``steps`` (``reached`` False: right-censored there) and its
    interval from the survival function's pointwise log-log band."""
    import warnings

    from scipy import stats

    times, events = np.asarray(steps, float), np.asarray(reached, bool)
    curve = stats.ecdf(stats.CensoredData.right_censored(times, ~events)).sf
    at, survival = curve.quantiles, curve.probabilities
    with warnings.catch_warnings():  # undefined where the estimate is 0 or 1: handled below
        warnings.simplefilter("ignore", RuntimeWarning)
        band = curve.confidence_interval(confidence, method="log-log")
    # [reading] where the band is undefined (the curve at 0 or 1, where Greenwood's variance is
    # 0 or undefined) it is taken as the curve itself
    lower = np.where(np.isnan(band.low.probabilities), survival, band.low.probabilities)
    upper = np.where(np.isnan(band.high.probabilities), survival, band.high.probabilities)

    def first_at_half(values: np.ndarray) -> float | None:
        hits = np.flatnonzero(values <= 0.5 + 1e-12)
        return float(at[hits[0]]) if hits.size else None

    return Median(
        first_at_half(survival),
        first_at_half(lower),
        first_at_half(upper),
        len(times),
        int((~events).sum()),
    )


def arm_median(seeds: Sequence[tuple[float, bool]]) -> Median:
    """:func:`km_median` of one arm's ``(steps, reached)`` per seed."""
    return km_median([s for s, _ in seeds], [r for _, r in seeds])


@dataclass(frozen=True)
class Ratio:
    """``reading / standard`` of the Kaplan–Meier medians, with the paired bootstrap's 95%
    interval and one-sided p-values (``p_for``: the share of resampled ratios ≥ 1, i.e. against
    a speed-up; ``p_against``: the share ≤ 1)."""

    ratio: float
    low: float
    high: float  # inf: resamples where the reading's median is not reached
    p_for: float
    p_against: float
    resamples: int


def median_ratio(
    standard: Sequence[tuple[float, bool]],
    reading: Sequence[tuple[float, bool]],
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> Ratio | None:
    """The ratio of the medians of paired seeds (``standard[i]`` and ``reading[i]`` are one
    seed's), None where either median is not reached. In a resample where one median is not
    reached, the ratio is taken as ∞ (the reading's) or 0 (standard's), 1 if both (no evidence
    either way); p-values are ``(k + 1) / (resamples + 1)``, so never 0."""
    if len(standard) != len(reading):
        raise ValueError("standard and reading must hold the same seeds, in the same order")
    point = _ratio(arm_median(standard).steps, arm_median(reading).steps)
    if point is None or not np.isfinite(point):
        return None
    rng = np.random.default_rng(seed)
    known: dict[tuple[int, ...], float] = {}  # a resample is a multiset of seeds: few distinct ones

    def resampled(draw: tuple[int, ...]) -> float:
        if draw not in known:
            known[draw] = _ratio(
                arm_median([standard[i] for i in draw]).steps,
                arm_median([reading[i] for i in draw]).steps,
                bootstrap=True,
            )
        return known[draw]

    n = len(standard)
    ratios = np.array([resampled(tuple(sorted(rng.integers(0, n, n).tolist()))) for _ in range(resamples)])
    low, high = np.quantile(ratios, [(1 - CONFIDENCE) / 2, (1 + CONFIDENCE) / 2], method="inverted_cdf")
    faster, slower = sign_test(standard, reading)
    return Ratio(
        point,
        float(low),
        float(high),
        max((int((ratios >= 1).sum()) + 1) / (resamples + 1), faster),
        max((int((ratios <= 1).sum()) + 1) / (resamples + 1), slower),
        resamples,
    )


def sign_test(
    standard: Sequence[tuple[float, bool]], reading: Sequence[tuple[float, bool]]
) -> tuple[float, float]:
    """One-sided exact sign tests over the seeds, ``(p faster, p slower)``: a seed is faster when
    the reading arrives and standard does not, or arrives first; ties and seeds where neither
    arrives count for neither. Its p-values floor the bootstrap's: over 5 seeds a bootstrap can
    say 1/2,001 where no 5-seed experiment can be surer than 1/32 that every seed was not luck."""
    from scipy.stats import binomtest

    def first(a: tuple[float, bool], b: tuple[float, bool]) -> bool:
        return a[1] and (not b[1] or a[0] < b[0])

    up = sum(first(r, s) for s, r in zip(standard, reading, strict=True))
    down = sum(first(s, r) for s, r in zip(standard, reading, strict=True))
    if up + down == 0:
        return 1.0, 1.0
    return (
        binomtest(up, up + down, alternative="greater").pvalue,
        binomtest(down, up + down, alternative="greater").pvalue,
    )


def _ratio(base: float | None, mine: float | None, bootstrap: bool = False) -> float | None:
    """``mine / base``; outside a resample None where either is missing."""
    if base is not None and mine is not None and base > 0:
        return mine / base
    if not bootstrap:
        return None
    if base is None and mine is None:
        return 1.0
    return np.inf if mine is None else 0.0
