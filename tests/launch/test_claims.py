"""Claims and verdicts: paired effects over seeds, per reading, and the verdict rule."""

from __future__ import annotations

import math

import pytest

from launch.claims import CLAIMS, Claim
from launch.records import Run
from launch.stats import paired_test
from launch.verdicts import stages, verdicts
from src.engine.record.identity import Identity

FINAL = Claim("T-final", "T", "the variant trains better", "spectral", "final", "metric", ("digits",))


def run(attn: str, seed: int, acc: float, curve: list[float] | None = None, **options) -> Run:
    """A completed digits run with final accuracy ``acc`` (and a validation curve, 100 steps apart)."""
    config = {"task": {"name": "digits", "p": 2}, "attn": {"variant": attn, **options}}
    curve = curve or [acc]
    rows = [{"step": 100 * (i + 1), "split": "val", "val/acc": a} for i, a in enumerate(curve)]
    rows.append(
        {"step": 0, "split": "monitor", "kappa/W_Q/median": 10.0 ** (3 - seed % 2), "entropy/P/median": 0.5}
    )
    return Run(
        f"{attn}-{options}-{seed}",
        "digits",
        "vit",
        attn,
        seed,
        "completed",
        "val/acc",
        "max",
        {"val/acc": acc},
        rows,
        identity=Identity(config),
    )


def test_the_interval_is_students_t():
    test = paired_test([1.0, 2.0, 3.0])
    low, high = test.low, test.high
    # mean 2, sd 1, n 3: t(0.975, 2) = 4.303
    assert math.isclose(low, 2 - 4.303 / math.sqrt(3), abs_tol=1e-3) and math.isclose(
        high, 2 + 4.303 / math.sqrt(3), abs_tol=1e-3
    )
    assert paired_test([1.0]) is None


def test_seeds_are_paired_so_a_consistent_gain_shows_through_seed_noise():
    """Seeds differ by up to 0.3; the variant is 0.01 better on every seed: paired, that is clear."""
    runs = []
    for seed in range(5):
        base = 0.5 + 0.07 * seed
        runs += [run("standard", seed, base), run("spectral", seed, base + 0.01 + 0.001 * seed, targets="q")]
    (v,) = verdicts(runs, [FINAL])
    assert v.n == 5 and v.verdict == "reproduced" and 0.0 < v.low < 0.012 < v.high < 0.02


def test_each_reading_gets_its_own_verdict():
    runs = []
    for seed in range(4):
        runs += [
            run("standard", seed, 0.9 + 0.01 * seed),
            run("spectral", seed, 0.95 + 0.01 * seed + 0.002 * seed**2, targets="q"),
            run("spectral", seed, 0.3 + 0.01 * seed - 0.002 * seed**2, targets="qkv"),
        ]
    found = {v.reading: v.verdict for v in verdicts(runs, [FINAL])}
    assert found == {"targets=q": "reproduced", "targets=qkv": "contradicted"}


def test_noise_either_way_is_inconclusive_and_a_lower_is_better_claim_flips_the_side():
    runs = []
    for seed, delta in enumerate([0.02, -0.03, 0.01, -0.01]):
        runs += [run("standard", seed, 0.8), run("spectral", seed, 0.8 + delta)]
    assert [v.verdict for v in verdicts(runs, [FINAL])] == ["inconclusive"]
    kappa = Claim("T-kappa", "T", "lower κ", "spectral", "init:kappa/W_Q/median", "lower", ("digits",))
    runs = []
    for seed in range(3):
        lowered = run("spectral", seed, 0.8)
        lowered.rows[-1]["kappa/W_Q/median"] = 10.0 ** (1 - seed % 2 + 0.1 * seed)
        runs += [run("standard", seed, 0.8), lowered]
    (v,) = verdicts(runs, [kappa])
    assert v.verdict == "reproduced" and v.effect == pytest.approx(-2 + 0.1, abs=0.11)  # log10: 10³ → 10¹


def modadd(seed: int, curve: list[float]) -> Run:
    """A completed ``standard`` modadd run: test accuracy on 2,048 sequences, 100 steps apart."""
    rows = [{"step": 100 * (i + 1), "split": "val", "val/acc": a} for i, a in enumerate(curve)]
    config = {"task": {"name": "modadd", "p": 2, "test_size": 2048}, "attn": {"variant": "standard"}}
    final = {"val/acc": curve[-1]}
    return Run(
        f"m{seed}",
        "modadd",
        "sandbox",
        "standard",
        seed,
        "completed",
        "val/acc",
        "max",
        final,
        rows,
        identity=Identity(config),
    )


def test_two_stages_are_a_plateau_longer_than_the_rise():
    plateau = modadd(0, [0.5] * 20 + [1.0] * 21)  # last at chance: step 2000; learned at 2100
    assert stages(plateau) == pytest.approx((2000 - 100) / 4100)
    gradual = modadd(1, [0.5 + 0.025 * i for i in range(20)] + [1.0] * 21)  # rises from the start
    assert stages(gradual) < 0
    assert stages(modadd(2, [0.5] * 41)) is None  # never learns: censored


def test_the_stages_verdict_counts_the_seeds_that_never_learn():
    runs = [modadd(s, [0.5] * (10 + 2 * s) + [1.0] * (31 - 2 * s)) for s in range(4)]
    runs.append(modadd(4, [0.5] * 41))
    (row,) = verdicts(runs, [c for c in CLAIMS if c.key == "P5-stages"])
    assert row.n == 4 and row.verdict == "reproduced"  # plateaus of 1000-1600 steps, rises of 100
    assert "1 never leave it (censored)" in row.note and "median first plateau 1400 steps" in row.note


def test_every_claim_names_a_variant_a_measure_and_a_task_the_readings_run():
    from src.attention import VARIANTS

    for claim in CLAIMS:
        assert claim.variant in VARIANTS and claim.source in claim.key
        assert claim.measure in ("final", "time_to_target", "stages") or claim.measure.startswith("init:")
        # a target stated before the runs, a fraction of standard's final (time to target only)
        assert (claim.target_fraction is not None) == (claim.measure == "time_to_target")
        assert claim.target_fraction is None or 0.5 < claim.target_fraction <= 1
        assert set(claim.tasks) <= {"digits", "lra_listops_small", "lm_char", "modadd"}


def test_keys_that_follow_the_seed_leave_the_seeds_one_experiment(tmp_path):
    """modadd draws its data from ``task.data_seed: ${seed}``: two seeds are still one experiment."""
    from omegaconf import OmegaConf

    from launch.records import read_run, seed_keys

    folders = []
    for seed in (0, 1):
        folder = tmp_path / f"seed={seed}"
        (folder / ".hydra").mkdir(parents=True)
        raw = {
            "seed": seed,
            "task": {"name": "modadd", "data_seed": "${seed}"},
            "attn": {"variant": "standard"},
        }
        OmegaConf.save(OmegaConf.create(raw), folder / ".hydra" / "config.yaml")
        folders.append(folder)
    assert seed_keys(folders[0]) == ["task.data_seed"]
    first, second = (read_run(f) for f in folders)
    assert first.seed != second.seed and first.experiment == second.experiment
