"""The statistics behind a verdict: paired tests by seed, equivalence, multiplicity and power.

A claim's effect is measured as per-seed differences ``variant − standard`` (:mod:`launch.analysis.verdicts`).
From those differences this module gives

* :func:`paired_test`: the mean, the 95% Student-t interval, the one-sided p-values for an effect
  on the paper's side and against it, and the two one-sided tests' (TOST) p-value for an effect
  inside ``±margin`` (equivalence: its 90% interval lies inside the margin);
* :func:`three_way`: the verdict those give at one level — *reproduced* (the effect is on the
  paper's side), *contradicted* (against it), *equivalent* (no effect as large as the margin), or
  *inconclusive*;
* :func:`holm`: Holm's step-down adjustment of a family's p-values (a claim's readings on one task
  are one family: trying six readings and quoting the one that clears zero is six tries);
* :func:`tested_at`: the level a row is tested at, for planning: its look's level (the fixed one,
  or a settled sweep's look, :func:`look_levels`) over the size ``m`` of its Holm family;
* :func:`min_detectable_effect` and :func:`seeds_needed`: the smallest effect a paired t-test over
  ``n`` seeds detects with 80% power at that level, from the differences' spread, and the seeds it
  would take to detect the margin (both also the power of a non-inferiority test at a true effect
  of 0: its bound −δ is δ away);
* :func:`example_variance`: for a small evaluation set, the variance its examples add to a mean
  paired difference of accuracies (an option of :func:`paired_test`, off by default);
* :func:`share_tests` and :func:`pairs_needed`: the same three p-values for a sign test (P5's
  "which arm learned first" over the seeds where the arms differ), its margin a share of those
  seeds away from one half, and the discordant seeds it takes to detect that margin.

Levels: a one-sided test at 2.5% on each side (what a 95% two-sided interval excluding 0 means)
and TOST at 5% (the 90% interval inside ``±margin``), as in clinical equivalence trials
(Schuirmann 1987); docs/methods.md, "Verdicts", says why.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

SIDE_ALPHA = 0.025  # one-sided level of "reproduced" and "contradicted" (a 95% interval excludes 0)
EQUIV_ALPHA = 0.05  # TOST's level (the 90% interval inside ±margin)
POWER = 0.80
# [reading] the sign tests' margin (P5 gives no number): one arm first in at least 70% of the seeds
# where the arms differ is an effect of interest; a share whose 90% interval lies inside
# (0.3, 0.7) says "no effect that large" (about 7:3 odds, a gap of a few seeds in ten)
SHARE_MARGIN = 0.2


@dataclass(frozen=True)
class Levels:
    """The levels one verdict is read at: each side's one-sided level and TOST's. A fixed-seed
    experiment uses the defaults; a sweep that adds seeds until settled (:mod:`launch.analysis.settle`)
    reads each look at the alpha it spends there (:func:`spent`), and ``last`` is then its
    schedule's last look's levels (where a row that needs more seeds would be judged; None: a
    fixed experiment, or this is the last look)."""

    side: float = SIDE_ALPHA
    equivalent: float = EQUIV_ALPHA
    last: Levels | None = None


FIXED = Levels()


def spent(fraction: float, alpha: float, shape: str = "obf") -> float:
    """The alpha spent by the time ``fraction`` of the seeds (0–1] are in: Lan–DeMets' spending
    functions, O'Brien–Fleming-shaped (``obf``: 2 − 2Φ(z₁₋α/₂ / √t), little early, most at the
    end) or Pocock-shaped (``pocock``: α·ln(1 + (e − 1)·t), evenly). Both reach ``alpha`` at 1."""
    from scipy.stats import norm

    t = min(max(fraction, 0.0), 1.0)
    if t == 0:
        return 0.0
    if shape == "obf":
        return float(2 - 2 * norm.cdf(norm.ppf(1 - alpha / 2) / math.sqrt(t)))
    if shape == "pocock":
        return alpha * math.log(1 + (math.e - 1) * t)
    raise ValueError(f"unknown spending shape {shape!r} (obf or pocock)")


def look_levels(looks: list[int], shape: str = "obf") -> list[Levels]:
    """Each look's levels when seeds come in at ``looks`` (increasing seed counts, the last the
    cap): the alpha spent between the previous look and this one, on each side and for TOST.
    Testing every look at its increment keeps the chance of any false verdict over all looks at
    most the fixed level (Bonferroni over looks: conservative, valid whatever the looks'
    correlation)."""
    cap = looks[-1]
    out, before_side, before_eq = [], 0.0, 0.0
    for n in looks:
        side, eq = spent(n / cap, SIDE_ALPHA, shape), spent(n / cap, EQUIV_ALPHA, shape)
        out.append(Levels(side - before_side, eq - before_eq))
        before_side, before_eq = side, eq
    return out


def tested_at(look: Levels = FIXED, family: int = 1, planned: bool = False) -> Levels:
    """The level a row is tested at, for power, MDE and seeds needed: its look's levels (``planned``:
    its schedule's last look's, where more seeds would be judged) divided by ``family``, the rows
    of its Holm family. That is Holm's first step, α/m: the conservative planning level, since
    its later steps (α/(m − 1), …) depend on the other rows' p-values, which no plan knows."""
    at = (look.last or look) if planned else look
    m = max(family, 1)
    return Levels(at.side / m, at.equivalent / m)


def describe_level(level: Levels) -> str:
    """``α 0.0125`` (one-sided), as a row prints the level its MDE is at."""
    return f"α {level.side:.3g}"


@dataclass(frozen=True)
class PairedTest:
    """A paired t-test of per-seed differences, in the claim's direction (``sign`` +1 or −1)."""

    n: int
    mean: float
    sd: float
    low: float  # the 95% interval
    high: float
    p_for: float  # one-sided: the effect is on the paper's side
    p_against: float  # one-sided: the effect is against it
    p_equivalent: float | None  # TOST against ±margin (None without a margin)


def paired_test(
    diffs: list[float],
    sign: int = 1,
    margin: float | None = None,
    bound: float = 0.0,
    example_var: float = 0.0,
) -> PairedTest | None:
    """The test of ``diffs`` (None below two differences). ``sign``: the side the paper claims.
    ``bound``: the effect, in the claim's direction, that the one-sided p-values test against (0:
    superiority; −δ: non-inferiority, ``p_for`` then tests "not worse by δ" and ``p_against``
    "worse by more than δ"). ``example_var``: the variance the evaluation set's examples add to
    the mean (:func:`example_variance`; 0, the default, treats the set as fixed), added to the
    seeds' ``sd² / n`` in the interval and every p-value."""
    from scipy import stats

    n = len(diffs)
    if n < 2:
        return None
    mean, sd = statistics.fmean(diffs), statistics.stdev(diffs)
    se = math.sqrt(sd**2 / n + example_var)
    half = stats.t.ppf(0.975, n - 1) * se
    null = sign * bound  # the bound on the differences' own scale
    if se == 0:  # every seed the same difference: the sign is certain, equivalence exact
        up = 0.0 if mean > null else 1.0
        down = 0.0 if mean < null else 1.0
        p_eq = None if margin is None else (0.0 if abs(mean) < margin else 1.0)
    else:
        t = (mean - null) / se
        up, down = stats.t.sf(t, n - 1), stats.t.cdf(t, n - 1)
        p_eq = None
        if margin is not None:
            above_low = stats.t.sf((mean + margin) / se, n - 1)  # H0: effect ≤ −margin
            below_high = stats.t.cdf((mean - margin) / se, n - 1)  # H0: effect ≥ +margin
            p_eq = max(above_low, below_high)
    p_for, p_against = (up, down) if sign > 0 else (down, up)
    return PairedTest(n, mean, sd, mean - half, mean + half, p_for, p_against, p_eq)


def three_way(p_for: float, p_against: float, p_equivalent: float | None, levels: Levels = FIXED) -> str:
    """The verdict at ``levels`` (this module's fixed ones by default) from (possibly adjusted)
    p-values."""
    if p_for < levels.side:
        return "reproduced"
    if p_against < levels.side:
        return "contradicted"
    if p_equivalent is not None and p_equivalent < levels.equivalent:
        return "equivalent"
    return "inconclusive"


def example_variance(variant: float, baseline: float, examples: int) -> float:
    """The variance ``examples`` evaluation examples add to a mean paired difference of accuracies
    ``variant − baseline``, when the examples are a sample of the task's and not the task itself:
    each arm's binomial variance ``p(1 − p) / N``, summed. It is the upper end (the arms' per-example
    correctness treated as independent; their positive correlation, unknown from the records,
    lowers it), and shared by every seed: the examples are the same for all of them, so more seeds
    do not shrink it."""
    if examples < 1:
        raise ValueError(f"an evaluation set of {examples} examples: give the set's size (≥ 1)")
    return (variant * (1 - variant) + baseline * (1 - baseline)) / examples


def difference_interval(k1: int, n1: int, k2: int, n2: int) -> tuple[float, float]:
    """The 95% interval of ``k1/n1 − k2/n2`` by Newcombe's hybrid score method (each share's
    Wilson interval, combined): it stays inside [−1, 1] and keeps its coverage at a few seeds,
    where the normal approximation does not (Newcombe 1998, method 10)."""
    from scipy.stats import binomtest

    p1, p2 = k1 / n1, k2 / n2
    l1, u1 = binomtest(k1, n1).proportion_ci(0.95, method="wilson")
    l2, u2 = binomtest(k2, n2).proportion_ci(0.95, method="wilson")
    d = p1 - p2
    return d - math.hypot(p1 - l1, u2 - p2), d + math.hypot(u1 - p1, p2 - l2)


def holm(p_values: list[float]) -> list[float]:
    """Holm's step-down adjusted p-values (same order as given; capped at 1, monotone)."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    adjusted = [1.0] * len(p_values)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(p_values) - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


def power(effect: float, sd: float, n: int, alpha: float = SIDE_ALPHA) -> float:
    """The chance that a one-sided paired t-test at ``alpha`` over ``n`` seeds detects ``effect``
    (noncentral t with ``n − 1`` degrees of freedom)."""
    from scipy import stats

    if n < 2 or sd <= 0:
        return float("nan")
    critical = stats.t.ppf(1 - alpha, n - 1)
    return float(stats.nct.sf(critical, n - 1, effect * math.sqrt(n) / sd))


def min_detectable_effect(
    sd: float, n: int, target: float = POWER, alpha: float = SIDE_ALPHA
) -> float | None:
    """The smallest effect detected with ``target`` power over ``n`` seeds (None below 2 seeds or
    with no spread)."""
    from scipy.optimize import brentq

    if n < 2 or not sd > 0:
        return None
    return float(brentq(lambda d: power(d, sd, n, alpha) - target, 1e-12 * sd, 100 * sd))


def seeds_needed(
    sd: float, effect: float, cap: int = 1000, target: float = POWER, alpha: float = SIDE_ALPHA
) -> int | None:
    """The fewest seeds (≥ 2) whose paired test at ``alpha`` detects ``effect`` with ``target``
    power; None when more than ``cap`` would be needed or there is no spread to judge by."""
    if not sd > 0 or effect <= 0:
        return None
    low, high = 2, cap
    if power(effect, sd, high, alpha) < target:
        return None
    while low < high:  # power grows with n
        mid = (low + high) // 2
        low, high = (mid + 1, high) if power(effect, sd, mid, alpha) < target else (low, mid)
    return low


def share_tests(k: int, n: int, margin: float | None = None) -> tuple[float, float, float | None]:
    """Exact one-sided p-values for ``k`` of ``n`` discordant seeds on the claim's side:
    ``(p for, p against, p equivalent)``, the last TOST's for a share inside ``0.5 ± margin``
    (None without a margin). ``n`` must be positive."""
    from scipy.stats import binom

    p_for, p_against = float(binom.sf(k - 1, n, 0.5)), float(binom.cdf(k, n, 0.5))
    if margin is None:
        return p_for, p_against, None
    above_low = binom.sf(k - 1, n, 0.5 - margin)  # H0: share ≤ 0.5 − margin
    below_high = binom.cdf(k, n, 0.5 + margin)  # H0: share ≥ 0.5 + margin
    return p_for, p_against, float(max(above_low, below_high))


def pairs_needed(
    margin: float, target: float = POWER, alpha: float = SIDE_ALPHA, cap: int = 1000
) -> int | None:
    """The fewest discordant seeds at which the one-sided exact sign test at ``alpha`` detects a
    share of ``0.5 + margin`` with ``target`` power (the exact test's power is not monotone in
    the count: the first count that reaches it); None past ``cap``."""
    import numpy as np
    from scipy.stats import binom

    for n in range(1, cap + 1):
        counts = np.arange(n + 1)
        significant = counts[binom.sf(counts - 1, n, 0.5) < alpha]  # the verdict's rule: p < alpha
        if significant.size and binom.sf(significant[0] - 1, n, 0.5 + margin) >= target:
            return n
    return None
