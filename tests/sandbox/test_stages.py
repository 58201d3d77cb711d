"""P5's stages from a curve: changepoints without a hand-picked threshold, censored plateaus."""

from __future__ import annotations

import numpy as np
import pytest

from src.sandbox.stages import accuracy_stages, plateau_km_median, stages

EPOCHS = np.arange(0, 201, 5.0)  # a validation every 5 epochs, as conf/task/modadd.yaml


def seed11(epochs: np.ndarray) -> np.ndarray:
    """Seed 11's staircase (issue 27): chance to epoch 37, 94.4% to 104, 100% from about 141."""
    ramp = 0.944 + (epochs - 104) / (141 - 104) * 0.056
    return np.where(epochs < 37, 0.5, np.where(epochs < 104, 0.944, np.where(epochs < 141, ramp, 1.0)))


def measured(accuracy: np.ndarray, seed: int, test_size: int = 2048) -> np.ndarray:
    """The accuracy as a test set of ``test_size`` examples measures it (binomial noise)."""
    return np.random.default_rng(seed).binomial(test_size, accuracy) / test_size


def test_a_known_changepoint_is_found_within_a_validation():
    truth = np.where(EPOCHS < 60, 0.5, np.minimum(1.0, 0.5 + (EPOCHS - 60) / 40 * 0.5))
    for seed in range(5):
        found = accuracy_stages(EPOCHS, measured(truth, seed), 2048)
        assert any(abs(EPOCHS[c] - 60) <= 10 for c in found.cuts), found.cuts  # within two validations
        assert found.phases[0].kind == "plateau" and found.phases[1].kind == "rise"
        assert abs(found.first_plateau - 60) <= 10 and abs(found.first_rise - 40) <= 15
        assert not found.censored
    # any scale: a kink at point 30 of a noisy line, where σ is read from the curve itself
    x, extra = np.arange(80.0), 0
    for seed in range(10):
        noise = 0.02 * np.random.default_rng(seed).standard_normal(80)
        found = stages(x, np.where(x < 30, 2.0, 2.0 - 0.05 * (x - 30)) + noise, higher_is_better=False)
        assert min(abs(c - 30) for c in found.cuts) <= 2
        assert found.phases[0].kind == "plateau" and found.phases[1].kind == "rise"
        extra += len(found.cuts) > 1
    assert extra <= 2  # σ is estimated from 80 points (±16%): now and then a second cut


def test_a_straight_line_has_no_changepoint():
    x = np.arange(60.0)
    for y in (0.2 + 0.01 * x, 0.2 + 0.01 * x + 0.01 * np.random.default_rng(1).standard_normal(60)):
        found = stages(x, y)
        assert found.cuts == [] and [p.kind for p in found.phases] == ["rise"]
        assert found.first_plateau == 0.0 and found.rise_censored
    assert [p.kind for p in stages(x, 1.0 - 0.01 * x).phases] == ["fall"]


def test_pure_noise_has_no_changepoint_and_is_one_plateau():
    cut = 0
    for seed in range(50):
        y = 0.5 + 0.01 * np.random.default_rng(seed).standard_normal(100)
        found = stages(np.arange(100.0), y)
        cut += bool(found.cuts)
        if not found.cuts:
            assert [p.kind for p in found.phases] in (["plateau"], ["rise"], ["fall"])
    assert cut <= 2  # none of 200 draws at 100 points in the module docstring's simulation
    found = stages(np.arange(100.0), 0.5 + 0.01 * np.random.default_rng(0).standard_normal(100))
    assert found.cuts == [] and [p.kind for p in found.phases] == ["plateau"] and found.censored


def test_seed_11s_staircase_is_two_plateaus_and_two_rises():
    found = accuracy_stages(EPOCHS, seed11(EPOCHS), 2048)
    kinds = [p.kind for p in found.phases]
    assert kinds == ["plateau", "rise", "plateau", "rise", "plateau"]
    assert found.plateaus_left == 2 and found.rises == 2 and found.plateaus == 3
    chance, stall, learned = (p for p in found.phases if p.kind == "plateau")
    assert (
        chance.level == pytest.approx(0.5)
        and stall.level == pytest.approx(0.944, abs=2e-3)
        and learned.level == 1.0
    )
    assert found.first_plateau == 35 and found.first_rise == 5  # last chance validation: epoch 35
    second = found.phases[3]
    assert abs(second.start - 104) <= 5 and abs(second.end - 141) <= 5  # the slow climb 94.4% -> 100%
    assert found.summary()["stages/plateaus_left"] == 2
    # as a test set of 2,048 measures it: the same count in almost every draw
    right = sum(
        (s := accuracy_stages(EPOCHS, measured(seed11(EPOCHS), seed), 2048)).plateaus_left == 2
        and s.rises == 2
        and abs(s.first_plateau - 35) <= 5
        for seed in range(50)
    )
    assert right >= 45


def test_a_seed_that_never_learns_is_censored_not_dropped():
    never = accuracy_stages(EPOCHS, measured(np.full(len(EPOCHS), 0.5), 3), 2048)
    assert never.censored and never.first_plateau == 200 and never.first_rise is None
    assert never.summary()["stages/censored"] is True
    learns = [accuracy_stages(EPOCHS, np.where(EPOCHS < t, 0.5, 1.0), 2048) for t in (40, 45, 50)]
    assert [s.first_plateau for s in learns] == [35, 40, 45]
    # Kaplan–Meier: two never-learning seeds keep the median at 45; dropping them would say 40
    assert plateau_km_median(learns + [never, never]) == 45
    assert plateau_km_median(learns[:2] + [never, never, never]) is None  # most never leave: not reached


def test_mismatched_curves_are_refused():
    with pytest.raises(ValueError, match="as many steps as values"):
        stages([0, 1, 2], [0.5, 0.5])
