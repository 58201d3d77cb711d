"""Time to quality: steps to a target with censoring, Kaplan–Meier medians and the ratio's verdict."""

from __future__ import annotations

import math
import statistics

import pytest
from test_claims import run

from launch.analysis.claims import CLAIMS
from launch.analysis.time_to_quality import km_median, median_ratio, steps_to_target, target
from launch.analysis.verdicts import claims_section, verdicts

SPEED = next(c for c in CLAIMS if c.key == "P4-speed")
IMAGE_SPEED = type(SPEED)(**{**SPEED.__dict__, "tasks": ("digits",)})


def test_without_censoring_the_median_is_the_sample_median_and_the_interval_spans_the_seeds():
    steps = [700, 300, 500, 900, 400]
    median = km_median(steps, [True] * 5)
    assert median.steps == statistics.median(steps) == 500
    # five events: the band's lower edge is below ½ from the first, the upper edge reaches ½ only
    # where the curve reaches 0 (the order-statistic interval [min, max] of five seeds)
    assert (median.low, median.high, median.n, median.censored) == (300, 900, 5, 0)


def test_a_censored_example_by_hand():
    """Seeds reach the target at 100, 300, 400; two are censored at 200 and 500.

    KM: S(100) = 4/5 = 0.8; at 200 one leaves the risk set uncounted (3 at risk);
    S(300) = 0.8 · 2/3 ≈ 0.533 (> ½); S(400) = 0.8 · 2/3 · 1/2 ≈ 0.267 (≤ ½): the median is 400.
    The band's lower edge at 100 (log-log, Greenwood): 0.8^exp(1.96·√(1/20)/|ln 0.8|) ≈ 0.204 ≤ ½,
    so the interval starts there; the curve ends at 0.267 > 0, censored: its upper edge never
    reaches ½ and the upper end is not reached."""
    median = km_median([100, 200, 300, 400, 500], [True, False, True, True, False])
    assert 0.8 * 2 / 3 > 0.5 >= 0.8 * 2 / 3 * 1 / 2
    assert median.steps == 400 and median.censored == 2 and median.n == 5
    assert 0.8 ** math.exp(1.96 * math.sqrt(1 / 20) / abs(math.log(0.8))) == pytest.approx(0.204, abs=1e-3)
    assert median.low == 100 and median.high is None
    assert "400 [100, not reached] (2 of 5 censored)" == str(median)


def test_a_censored_seed_is_counted_and_moves_the_median_later_than_dropping_it():
    reached = [200, 300, 400, 500]
    kept = km_median(reached + [1000], [True] * 4 + [False])  # one seed never reaches it by step 1000
    dropped = km_median(reached, [True] * 4)
    assert kept.n == 5 and kept.censored == 1
    assert (dropped.steps, kept.steps) == (300, 400)
    # nor is it counted as if it had arrived at its last step: as an event there, the curve would
    # fall to 0 and bound the interval at 1,000; censored, the interval's upper end is not reached
    assert km_median(reached + [1000], [True] * 5).high == 1000 and kept.high is None


def test_steps_to_target_is_the_first_validation_step_else_the_last_censored():
    curve = run("cond_init", 0, 0.9, curve=[0.5, 0.85, 0.9, 0.9])  # steps 100 … 400
    assert steps_to_target(curve, 0.85) == (200, True)
    assert steps_to_target(curve, 0.95) == (400, False)
    # the stated rule: 95% of standard's mean final, or 1.05 × it for a metric that falls
    assert target([0.9, 1.0], higher=True, fraction=0.95) == pytest.approx(0.9025)
    assert target([2.0, 2.2], higher=False, fraction=0.95) == pytest.approx(2.205)


def arm(attn: str, reach_at: list[int], length: int = 20) -> list:
    """Runs whose accuracy jumps from 0.5 to 1.0 at ``reach_at[seed]`` (validation every 100 steps
    up to ``100 · length``); 0 in ``reach_at``: never (final 0.9, below the target 0.95)."""
    runs = []
    for seed, step in enumerate(reach_at):
        curve = [1.0 if step and 100 * (i + 1) >= step else 0.5 for i in range(length)]
        runs.append(run(attn, seed, curve[-1] if step else 0.9, curve=curve if step else curve[:-1] + [0.9]))
    return runs


STANDARD = [800, 900, 1000, 1100, 1200]


def test_a_reading_that_arrives_in_0_7_of_the_steps_on_every_seed_is_reproduced_from_six_seeds():
    faster = [100 * math.ceil(0.7 * s / 100) for s in STANDARD]  # 600, 700, 700, 800, 900
    (v,) = verdicts(arm("standard", STANDARD) + arm("cond_init", faster), [IMAGE_SPEED])
    assert (v.baseline, v.value, v.n) == (1000, 700, 5)
    assert v.effect == pytest.approx(0.7) and v.low <= 0.7 <= v.high < 1
    # every seed faster, but 5 seeds: the sign test's floor (1/32 > 2.5%) keeps the bootstrap's
    # 1/2,001 from settling it
    assert v.test.p_for == pytest.approx(1 / 32) and v.verdict == "inconclusive"
    assert (
        "standard 1,000 [800, 1,200] (0 of 5 censored) → cond_init 700 [600, 900] (0 of 5 censored)" in v.note
    )
    row = next(line for line in claims_section([v]) if line.startswith("| digits"))
    assert "0.70× [" in row and "val/acc ≥ 0.95" in row
    six = [*STANDARD, 1000]  # a sixth seed, faster too: 1/64 < 2.5%
    (v,) = verdicts(arm("standard", six) + arm("cond_init", [*faster, 700]), [IMAGE_SPEED])
    assert v.verdict == "reproduced" and v.adjusted == "reproduced"


def test_identical_arms_are_inconclusive():
    (v,) = verdicts(arm("standard", STANDARD) + arm("cond_init", STANDARD), [IMAGE_SPEED])
    assert v.effect == 1.0 and v.verdict == "inconclusive"
    assert v.test.p_for == v.test.p_against == 1.0


def test_a_median_not_reached_gives_no_ratio_and_says_why():
    never = [0, 0, 0, 900, 1000]  # three of five seeds never reach the target
    (v,) = verdicts(arm("standard", STANDARD) + arm("cond_init", never), [IMAGE_SPEED])
    assert v.n == 5 and v.effect is None and v.verdict == "inconclusive"
    assert "cond_init not reached (3 of 5 censored); no ratio: cond_init's median not reached" in v.note


def test_the_bootstrap_is_reproducible_and_sees_a_slower_reading():
    base = [(s, True) for s in STANDARD]
    slower = [(s * 1.4, True) for s in STANDARD]
    once, again = median_ratio(base, slower), median_ratio(base, slower)
    assert once == again and once.ratio == pytest.approx(1.4) and once.p_for == 1.0
    assert once.p_against == pytest.approx(1 / 32)  # the sign test's floor over 5 seeds
    six = [*base, (1000, True)]
    assert median_ratio(six, [(s * 1.4, True) for s, _ in six]).p_against == pytest.approx(1 / 64)


def test_the_interval_is_where_the_log_log_greenwood_band_crosses_a_half():
    """Ten seeds at 100 … 1,000, none censored: the band computed here by hand (Greenwood's variance,
    the log-log transform) and its first crossings of ½ are the interval's ends."""
    n, z = 10, 1.959964
    ends = {}
    for k in range(1, n):  # the curve after the k-th arrival (at 0, after the last, the band is the curve)
        survival = 1 - k / n
        greenwood = sum(1 / ((n - j) * (n - j - 1)) for j in range(k))
        spread = z * math.sqrt(greenwood) / abs(math.log(survival))
        lower, upper = survival ** math.exp(spread), survival ** math.exp(-spread)
        ends.setdefault("low", 100 * k) if lower <= 0.5 else None
        ends.setdefault("high", 100 * k) if upper <= 0.5 else None
    median = km_median([100 * k for k in range(1, n + 1)], [True] * n)
    assert median.steps == 500 and (median.low, median.high) == (ends["low"], ends["high"]) != (100, 1000)
