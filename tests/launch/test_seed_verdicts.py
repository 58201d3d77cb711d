"""P5's claims judged from seed sets (launch/seed_verdicts.py): the sign test's verdict, Holm over
a variant's readings, the reading a set matches, and the stages' one-sample verdict."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from scipy.stats import binomtest

from launch.claims import CLAIMS
from launch.seed_verdicts import reading_of, seed_verdicts
from src.sandbox.curves import Curves

PRECOND = {"variant": "precond", "eps": 1e-6, "detach": True, "gain": False}


def learning_at(epochs: list[int | None], attn: dict | None = None, total: int = 40) -> Curves:
    """Seeds at chance until the given epoch (None: never), then at 100%."""
    acc = [[1.0 if e is not None and i + 1 >= e else 0.5 for i in range(total)] for e in epochs]
    curves = Curves(list(range(len(epochs))), ["experiment=paper/p5"], total, 64, 2048, acc)
    curves.attn = attn or {"variant": "standard"}
    return curves


def claims(measure: str, variant: str) -> list:
    return [c for c in CLAIMS if c.measure == measure and c.variant == variant]


def test_a_set_is_known_by_the_reading_it_matches():
    assert reading_of(learning_at([1], PRECOND)) == "precond"
    assert reading_of(learning_at([1], {**PRECOND, "gain": True})) == "precond_gain"
    unknown = learning_at([1], {"variant": "precond", "detach": False, "gain": False, "eps": 1e-3})
    assert reading_of(unknown) == "precond_undetached"  # only the options the file sets count


def test_the_sign_test_judges_a_variant_and_holm_adjusts_over_its_readings():
    """Against standard, the primary reading learns first in 6 seeds and later in none (p = 1/64,
    reproduced raw); with a second reading of the same variant in the family, Holm doubles it
    past 2.5%. A reading that learns later in 7 of 8 is contradicted."""
    standard = learning_at([20, 20, 20, 20, 20, 20, None, 10])
    primary = learning_at([10, 10, 10, 10, 10, 10, None, 10], PRECOND)  # 6 first, 2 ties
    slower = learning_at([30, 30, 30, 30, 30, 30, None, 30], {**PRECOND, "gain": True})  # 7 later
    sets = [(Path(n), c) for n, c in (("s", standard), ("p", primary), ("g", slower))]
    one, two = seed_verdicts(sets, claims("learns_first", "precond"))
    assert one.primary and one.reading == "precond" and not two.primary
    assert (one.n, one.value) == (6, 1.0) and one.p_for == pytest.approx(1 / 64)
    assert (one.low, one.high) == pytest.approx(tuple(binomtest(6, 6).proportion_ci(method="exact")))
    assert (one.verdict, one.adjusted) == ("reproduced", "inconclusive")
    assert (two.n, two.value, two.verdict) == (7, 0.0, "contradicted")
    assert "learned first here / in standard: 6 / 0" in one.note


def test_a_set_without_a_standard_of_the_same_seeds_and_epochs_is_not_judged():
    sets = [(Path("s"), learning_at([20, None])), (Path("p"), learning_at([10, 10, 10], PRECOND))]
    assert seed_verdicts(sets, claims("learns_first", "precond")) == []


def test_the_stages_are_a_plateau_longer_than_the_rise_and_never_learners_are_censored():
    """Seeds that sit at chance 25-35 epochs then jump: read every 5 epochs, each plateau is far
    longer than its rise (reproduced); the seed that never learns is counted as censored."""
    standard = learning_at([26, 31, 36, None], total=60)
    (row,) = seed_verdicts([(Path("s"), standard)], claims("stages", "standard"))
    assert row.n == 3 and row.value > 0.3 and row.low > 0 and row.verdict == "reproduced"
    assert "3 of 4 seeds" in row.note and "1 never leave it (censored)" in row.note


def test_spikes_sharper_than_the_control_steps_reproduce_the_curvature_claim(tmp_path):
    """Four seeds whose spikes are far more often past 2/λ than their other steps: the mean
    difference over the seeds and its t interval above 0; the learning rate without a spike gives
    no row, only a mention; the report prints the row."""
    from launch.report import main as report
    from launch.seed_verdicts import load_memories
    from launch.stats import paired_test

    def statistic(lr: float, spikes: int, sharp: int, control: int, control_sharp: int, diffs) -> dict:
        return {
            "lr": lr, "seeds": 20, "seeds_with_spikes": len(diffs), "spikes": spikes,
            "spikes_sharp": sharp, "control": control, "control_sharp": control_sharp,
            "p_value": 0.0, "spike_grad": 0.2, "control_grad": 0.01, "seed_differences": diffs,
        }  # fmt: skip

    diffs = [0.8, 0.9, 0.7, 0.85]
    folder = tmp_path / "memory"
    folder.mkdir()
    record = {
        "args": {"steps": 35, "tokens": 3},
        "statistics": [statistic(10, 10, 9, 100, 5, diffs), statistic(1, 0, 0, 700, 0, [])],
    }
    (folder / "memory.json").write_text(json.dumps(record))
    (row,) = seed_verdicts([], claims("spike_curvature", "standard"), load_memories([tmp_path]))
    expected = paired_test(diffs)
    assert (row.n, row.value, row.verdict) == (4, pytest.approx(0.8125), "reproduced")
    assert (row.low, row.high) == pytest.approx((expected.low, expected.high))
    assert "no spike at η = 1" in row.note and "control steps: 5 of 100 (5%)" in row.note
    assert report([str(tmp_path), "--out", str(tmp_path / "report")]) == 0
    text = (tmp_path / "report" / "report.md").read_text()
    assert "| `P5-spikes` | `memory` | `η = 10, 3 tokens` | memory | 35 steps × 20 seeds | 4 | +0.81" in text
