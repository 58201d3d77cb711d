"""P5's claims judged from seed sets (launch/analysis/seed_verdicts.py): the sign test's verdict, Holm over
a variant's readings, the reading a set matches, and the stages' one-sample verdict."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from scipy.stats import binomtest

from launch.analysis.claims import CLAIMS
from launch.analysis.seed_verdicts import reading_of, seed_verdicts
from launch.analysis.stats import SHARE_MARGIN, pairs_needed
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
    from launch.analysis.report import main as report
    from launch.analysis.seed_verdicts import load_memories
    from launch.analysis.stats import paired_test

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


def probed(learn: list[int | None], head: list[int | None], total: int = 200, every: int = 5) -> Curves:
    """Seeds that learn at ``learn`` and whose clustering (η²) jumps from 0.3 to 0.95 at ``head``."""
    curves = learning_at(learn, total=total)
    curves.probe_every = every
    points = range(every, total + 1, every)
    curves.clustering = [[0.95 if h is not None and e >= h else 0.3 for e in points] for h in head]
    curves.focus = [[0.0 for _ in points] for _ in head]
    return curves


def test_the_clustering_head_forms_first_when_it_jumps_before_the_accuracy():
    """Six seeds whose head forms 50 epochs before they learn: 6 of 6 first, p = 1/64, reproduced;
    one within a probe of it is a tie; a never-learner whose head formed is counted apart."""
    curves = probed([100, 110, 120, 130, 140, 150, 60, None], [50, 60, 70, 80, 90, 100, 60, 40])
    (row,) = seed_verdicts([(Path("s"), curves)], claims("clustering_first", "standard"))
    assert (row.n, row.value, row.verdict) == (6, 1.0, "reproduced")
    assert row.p_for == pytest.approx(1 / 64)
    assert (
        "within a probe (5 epochs): 1" in row.note and "of 1 that never learned, 1 formed a head" in row.note
    )
    late = probed([50, 60, 70, 80, 90, 100], [100, 110, 120, 130, 140, 150])  # heads after learning
    (row,) = seed_verdicts([(Path("s"), late)], claims("clustering_first", "standard"))
    assert (row.value, row.verdict) == (0.0, "contradicted")


def test_a_set_fine_tuned_from_another_is_paired_with_the_same_seeds_from_scratch():
    """The fine-tuned set learns first in 6 seeds of 8 (2 ties): reproduced; it is not taken for
    the scratch set's standard (both are `standard` with the same overrides), so learns_first and
    stages see them apart."""
    scratch = learning_at([30, 30, 30, 30, 30, 30, None, 10])
    tuned = learning_at([10, 10, 10, 10, 10, 10, None, 10])
    tuned.init_from, tuned.init_acc = "runs/p2", [1.0] * 8
    sets = [(Path("p3"), scratch), (Path("p3_from_p2"), tuned)]
    (row,) = seed_verdicts(sets, claims("curriculum", "standard"))
    assert (row.n, row.value, row.folder, row.verdict) == (6, 1.0, "p3_from_p2", "reproduced")
    assert "from p2 / from scratch, learned first: 6 / 0" in row.note
    assert seed_verdicts([(Path("p3_from_p2"), tuned)], claims("curriculum", "standard")) == []
    assert len(seed_verdicts(sets, claims("stages", "standard"))) == 2


def test_the_initialization_split_compares_the_shares_by_fishers_test():
    """Eight seeds whose source learned (7 learn p = 3) against eight whose source did not (1
    learns): +0.75; Fisher's one-sided p is the hypergeometric tail P(X ≥ 7) with 8 learners among
    16, 8 drawn: (C(8,7)·C(8,1) + 1) / C(16,8) = 65 / 12870; reproduced."""
    tuned = learning_at([10] * 7 + [None] + [10] + [None] * 7)
    tuned.init_from, tuned.init_acc = "runs/p2", [1.0] * 8 + [0.5] * 8
    (row,) = seed_verdicts([(Path("t"), tuned)], claims("init_source", "standard"))
    assert row.value == pytest.approx(0.75) and row.p_for == pytest.approx(65 / 12870)
    assert row.low < 0.75 < row.high <= 1 and row.verdict == "reproduced"
    assert "from a source that learned: 7 of 8; from one that did not: 1 of 8" in row.note


def test_newcombes_interval_matches_his_worked_example():
    """Newcombe (1998), Statistics in Medicine 17:873, table II, method 10: 56/70 − 48/80 = 0.2
    with 95% interval [0.0524, 0.3339]."""
    from launch.analysis.stats import difference_interval

    low, high = difference_interval(56, 70, 48, 80)
    assert (low, high) == pytest.approx((0.0524, 0.3339), abs=1e-4)


def test_balanced_first_learners_are_equivalent_within_the_margin_and_an_open_row_says_what_settles_it():
    """60 discordant seeds split 30 / 30: TOST puts the share inside 0.5 ± 0.2 (equivalent, raw and
    after Holm), not at a margin of 0.05, whose note names the discordant seeds it takes; 8 split
    5 / 3 (every seed discordant) stay open, the seeds to settle equal to the discordant ones."""
    standard = learning_at([20] * 30 + [10] * 30 + [None] * 4, total=40)
    balanced = learning_at([10] * 30 + [20] * 30 + [None] * 4, PRECOND, total=40)
    sets = [(Path("s"), standard), (Path("p"), balanced)]
    (row,) = seed_verdicts(sets, claims("learns_first", "precond"))
    assert (row.n, row.value, row.verdict, row.adjusted) == (60, 0.5, "equivalent", "equivalent")
    assert row.p_equivalent < 0.05 and row.claim.margin == SHARE_MARGIN
    (narrow,) = seed_verdicts(sets, claims("learns_first", "precond"), margins={"P5-precond": 0.05})
    assert narrow.verdict == "inconclusive" and f"takes {pairs_needed(0.05)} discordant seeds" in narrow.note

    few = [
        (Path("s"), learning_at([20] * 5 + [10] * 3)),
        (Path("p"), learning_at([10] * 5 + [20] * 3, PRECOND)),
    ]
    (open_row,) = seed_verdicts(few, claims("learns_first", "precond"))
    needed = pairs_needed(SHARE_MARGIN)
    assert open_row.verdict == "inconclusive"
    assert f"takes {needed} discordant seeds (80% power) ≈ {needed} seeds at this set's rate" in open_row.note
