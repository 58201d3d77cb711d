"""The verdict's statistics: the three-way rule, Holm, power, and the family's false-positive rate."""

from __future__ import annotations

import numpy as np
import pytest
from test_claims import FINAL, run

from launch.analysis import stats
from launch.analysis.claims import Claim
from launch.analysis.verdicts import claims_section, verdicts


def verdict(diffs: list[float], margin: float | None = 0.01, sign: int = 1) -> str:
    test = stats.paired_test(diffs, sign, margin)
    return stats.three_way(test.p_for, test.p_against, test.p_equivalent)


def test_the_three_way_rule_on_constructed_paired_differences():
    tight_null = [0.001, -0.001, 0.0005, -0.0005, 0.0]  # inside ±0.01, small spread
    clear_gain = [0.02, 0.021, 0.019, 0.022, 0.018]
    wide_null = [0.05, -0.05, 0.04, -0.04, 0.0]  # centred on 0 but spread past ±0.01
    assert verdict(tight_null) == "equivalent"
    assert verdict(clear_gain) == "reproduced"
    assert verdict(wide_null) == "inconclusive"
    assert verdict([-d for d in clear_gain]) == "contradicted"
    assert verdict(clear_gain, sign=-1) == "contradicted"  # the paper claims a decrease
    assert verdict(tight_null, margin=None) == "inconclusive"  # no margin: never "equivalent"


def test_equivalence_is_the_90_percent_interval_inside_the_margin():
    """TOST at 5% ⇔ the 90% interval inside ±δ: on either side of the boundary the rule flips."""
    from scipy import stats as scipy_stats

    diffs = [0.004, -0.002, 0.006, 0.001, 0.003]
    mean, sd, n = np.mean(diffs), np.std(diffs, ddof=1), len(diffs)
    upper_90 = mean + scipy_stats.t.ppf(0.95, n - 1) * sd / np.sqrt(n)
    assert verdict(diffs, margin=upper_90 * 1.01) == "equivalent"
    assert verdict(diffs, margin=upper_90 * 0.99) == "inconclusive"


def test_holm_on_a_known_family():
    # sorted 0.005, 0.01, 0.03, 0.04 → ×4, ×3, ×2, ×1 = 0.02, 0.03, 0.06, 0.04 → monotone 0.06
    assert stats.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert stats.holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])  # capped at 1
    assert stats.holm([0.02]) == [0.02]  # a family of one is not adjusted


@pytest.mark.parametrize("n", [3, 5, 10])
def test_the_minimum_detectable_effect_has_the_power_a_simulation_finds(n):
    """Simulated paired experiments with the true effect at the MDE are detected 80% of the time
    (within 10%), and at 0.7× and 1.3× the MDE clearly less and more often."""
    from scipy import stats as scipy_stats

    sd = 0.02
    mde = stats.min_detectable_effect(sd, n)
    rng = np.random.default_rng(n)
    critical = scipy_stats.t.ppf(1 - stats.SIDE_ALPHA, n - 1)

    def simulated_power(effect: float) -> float:
        diffs = rng.normal(effect, sd, size=(20_000, n))
        t = diffs.mean(1) / (diffs.std(1, ddof=1) / np.sqrt(n))
        return float((t > critical).mean())

    assert simulated_power(mde) == pytest.approx(stats.POWER, rel=0.10)
    assert simulated_power(0.7 * mde) < 0.75 < 0.85 < simulated_power(1.3 * mde)


def test_the_seeds_needed_are_the_fewest_with_80_percent_power():
    sd, margin = 0.02, 0.01
    needed = stats.seeds_needed(sd, margin)
    assert stats.power(margin, sd, needed) >= 0.8 > stats.power(margin, sd, needed - 1)
    assert stats.min_detectable_effect(sd, needed) <= margin < stats.min_detectable_effect(sd, needed - 1)
    assert stats.seeds_needed(sd, 1e-6) is None  # past the cap


def test_the_sign_tests_equivalence_is_the_90_percent_exact_interval_inside_the_margin():
    """TOST with exact binomial tests at 5% a side says *equivalent* exactly when the 90%
    Clopper–Pearson interval of the share lies inside ``0.5 ± margin``; its one-sided p-values are
    the exact sign test's."""
    from scipy.stats import binomtest

    for n in (10, 40, 97):
        for k in range(n + 1):
            p_for, p_against, p_eq = stats.share_tests(k, n, 0.2)
            assert p_for == pytest.approx(binomtest(k, n, alternative="greater").pvalue)
            assert p_against == pytest.approx(binomtest(k, n, alternative="less").pvalue)
            low, high = binomtest(k, n).proportion_ci(0.90, method="exact")
            assert (p_eq < 0.05) == (0.3 < low and high < 0.7), (k, n)
    assert stats.share_tests(3, 5)[2] is None


def test_the_discordant_seeds_needed_are_the_fewest_whose_sign_test_has_80_percent_power():
    """Power by simulation at the returned count; no smaller count reaches 80% (exact power
    computed from scipy's binomial test, not the module's own rule)."""
    from scipy.stats import binom, binomtest

    def exact_power(n: int, share: float) -> float:
        critical = next(
            k for k in range(n + 2) if k > n or binomtest(k, n, alternative="greater").pvalue < 0.025
        )
        return float(binom.sf(critical - 1, n, share)) if critical <= n else 0.0

    needed = stats.pairs_needed(0.2)
    assert exact_power(needed, 0.7) >= 0.8 > max(exact_power(n, 0.7) for n in range(1, needed))
    draws = np.random.default_rng(0).binomial(needed, 0.7, size=2000)
    simulated = np.mean([binomtest(int(k), needed, alternative="greater").pvalue < 0.025 for k in draws])
    assert simulated == pytest.approx(exact_power(needed, 0.7), abs=0.03)
    assert 40 < needed < 60  # the normal approximation's ((0.98 + 0.84·0.46) / 0.2)² ≈ 47
    assert stats.pairs_needed(0.001) is None  # past the cap


def test_on_null_experiments_holm_keeps_a_family_of_six_readings_under_five_percent():
    """2,000 null experiments, 5 seeds × 6 readings sharing standard's seeds: quoting whichever
    reading clears zero gives a false "reproduced" far more often than Holm's family-wise rate."""
    rng = np.random.default_rng(0)
    raw_any = adjusted_any = 0
    for _ in range(2000):
        baseline = rng.normal(0, 1, 5)
        tests = [stats.paired_test(list(rng.normal(0, 1, 5) - baseline), 1, None) for _ in range(6)]
        raw = [stats.three_way(t.p_for, t.p_against, None) for t in tests]
        p_for, p_against = stats.holm([t.p_for for t in tests]), stats.holm([t.p_against for t in tests])
        adjusted = [stats.three_way(u, d, None) for u, d in zip(p_for, p_against, strict=True)]
        raw_any += "reproduced" in raw
        adjusted_any += "reproduced" in adjusted
    assert adjusted_any / 2000 <= 0.05
    assert raw_any > 2 * adjusted_any  # unadjusted: about 9–12% here; adjusted: at most 2.5% expected


def test_verdicts_adjust_within_a_claims_readings_and_the_report_marks_a_raw_only_verdict():
    """Six readings on one task: one clears zero on its own (p ≈ 0.01) but not after Holm."""
    margin_claim = Claim(
        "T-final", "T", "the variant trains better", "spectral", "final", "metric", ("digits",)
    )
    first_diffs = [0.004, 0.0015, 0.0035, 0.0, 0.003]  # one-sided p ≈ 0.015; × 6 ≈ 0.09
    noise = [0.0015, -0.001, 0.0005, -0.0005, 0.0]
    runs = []
    for seed in range(5):
        base = 0.5 + 0.07 * seed
        runs.append(run("standard", seed, base))
        runs.append(run("spectral", seed, base + first_diffs[seed], lam=0.0))
        for k in range(1, 6):
            runs.append(run("spectral", seed, base + noise[(seed + k) % 5], lam=float(k)))
    found = verdicts(runs, [margin_claim], margins={"T-final": 0.01})
    assert len(found) == 6 and all(v.margin == 0.01 for v in found)
    first = next(v for v in found if v.reading == "lam=0.0")
    assert first.verdict == "reproduced" and first.adjusted != "reproduced"
    assert first.test.p_for < stats.SIDE_ALPHA < 6 * first.test.p_for
    lines = "\n".join(claims_section(found))
    assert "**reproduced**†" in lines and "δ: 1.00" in lines
    assert all(v.detectable is not None and v.seeds_for_margin is not None for v in found)


def test_without_a_margin_no_equivalent_verdict_and_the_row_says_so():
    runs = []
    for seed in range(5):
        runs += [run("standard", seed, 0.5), run("spectral", seed, 0.5 + 1e-4 * (seed - 2), targets="q")]
    (v,) = verdicts(runs, [FINAL])
    assert v.margin is None and v.verdict == "inconclusive"
    assert "none declared" in "\n".join(claims_section([v]))


@pytest.mark.parametrize("item", ["P9=0.01", "P2-image=big", "P2-image=-0.01", "P5-precond=0.5"])
def test_a_bad_margin_is_one_line_and_status_2(item, tmp_path, capsys):
    from launch.analysis import report

    assert report.main(["--margin", item, str(tmp_path)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"error: --margin {item}")


def test_a_row_states_its_budget_and_names_the_runs_it_left_out():
    """Two budgets of one reading are two rows, each with its steps; a failed seed and a seed
    without its baseline are named in the row, not dropped without a word."""
    from dataclasses import replace

    from src.engine.record.identity import Identity

    def budgeted(r, steps: int):
        config = {**r.identity.config, "trainer": {"max_steps": steps}}
        return replace(r, identity=Identity(config))

    runs = []
    for steps in (150, 1000):
        for seed in range(4):
            runs.append(budgeted(run("standard", seed, 0.5 + 0.01 * seed), steps))
            runs.append(budgeted(run("spectral", seed, 0.51 + 0.01 * seed, targets="q"), steps))
    failed = replace(runs[-1], status="failed", final={})  # spectral seed 3 at 1,000 steps
    unpaired = budgeted(run("spectral", 7, 0.6, targets="q"), 1000)
    found = verdicts([*runs[:-1], failed, unpaired], [FINAL])
    by_budget = {v.budget: v for v in found}
    assert set(by_budget) == {"150 steps", "1,000 steps"}
    assert by_budget["150 steps"].n == 4 and by_budget["150 steps"].not_counted == ""
    late = by_budget["1,000 steps"]
    assert late.n == 3
    left = "spectral seed 3 failed; spectral seed 7 unpaired; standard seed 3 unpaired"  # its partner failed
    assert late.not_counted == left
    assert f"| 3 (not counted: {left}) |" in "\n".join(claims_section(found))


def test_a_budget_states_steps_epochs_and_what_was_seen():
    """Steps and epochs each from the other where the summary knows an epoch's steps; samples are
    steps × global batch, tokens for a language model."""
    from dataclasses import replace

    from launch.analysis.verdicts import budget_of
    from src.engine.record.identity import Identity

    def budget(trainer: dict, task: dict, per_epoch: int | None) -> str:
        r = run("standard", 0, 0.5)
        return budget_of(
            replace(r, identity=Identity({"trainer": trainer, "task": task}), steps_per_epoch=per_epoch)
        )

    lm = {"input": "causal_lm", "seq_len": 128, "batch_size": 16}
    assert budget({"max_steps": 300}, lm, 200) == "300 steps · 1.5 epochs · 614,400 tokens"
    assert budget({"max_steps": 300, "accumulate": 2}, lm, None) == "300 steps · 1,228,800 tokens"
    sandbox = {"input": "tokens", "batch_size": 32}
    assert budget({"max_epochs": 60}, sandbox, 64) == "60 epochs (3,840 steps) · 122,880 samples"
    assert budget({"max_epochs": 60}, sandbox, None) == "60 epochs"
    assert budget({}, sandbox, 64) == ""
