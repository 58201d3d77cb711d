"""Claims and verdicts: paired effects over seeds, per reading, and the verdict rule."""

from __future__ import annotations

import math

import pytest

from launch.analysis.claims import ANY_ROW, CLAIMS, SEED_SET_MEASURES, Claim, parse_margins
from launch.analysis.records import Run
from launch.analysis.stats import paired_test
from launch.analysis.verdicts import stages, verdicts
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
    kappa = Claim("T-kappa", "T", "lower κ", "spectral", "monitor:kappa/W_Q/median", "lower", ("digits",))
    runs = []
    for seed in range(3):
        lowered = run("spectral", seed, 0.8)
        lowered.rows[-1]["kappa/W_Q/median"] = 10.0 ** (1 - seed % 2 + 0.1 * seed)
        runs += [run("standard", seed, 0.8), lowered]
    v, during, end = verdicts(runs, [kappa])
    assert v.reading == "default · at init"
    assert v.verdict == "reproduced" and v.effect == pytest.approx(-2 + 0.1, abs=0.11)  # log10: 10³ → 10¹
    assert during.n == end.n == 0 and end.verdict == "no data"  # only step 0 was monitored: named
    assert "spectral seed 0 has no value at the end" in end.not_counted


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
        measures = ("final", "time_to_target", "stages", *SEED_SET_MEASURES)
        assert claim.measure in measures or claim.measure.startswith("monitor:")
        assert claim.measure not in SEED_SET_MEASURES or claim.tasks == ("modadd",)
        # a target stated before the runs, a fraction of standard's final (time to target only)
        assert (claim.target_fraction is not None) == (claim.measure == "time_to_target")
        assert claim.target_fraction is None or 0.5 < claim.target_fraction <= 1
        assert set(claim.tasks) <= {"digits", "lra_listops_small", "lm_char", "modadd"}


def test_keys_that_follow_the_seed_leave_the_seeds_one_experiment(tmp_path):
    """modadd draws its data from ``task.data_seed: ${seed}``: two seeds are still one experiment."""
    from omegaconf import OmegaConf

    from launch.analysis.records import read_run, seed_keys

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


def monitored(attn: str, seed: int, kappas: dict[int, float], **options) -> Run:
    """A run whose κ(W_Q) is ``kappas[step]`` at each monitor step."""
    r = run(attn, seed, 0.8, **options)
    r.rows = [row for row in r.rows if row["split"] != "monitor"]
    r.rows += [{"step": s, "split": "monitor", "kappa/W_Q/median": k} for s, k in kappas.items()]
    return r


def test_kappa_is_judged_at_init_during_and_at_the_end():
    """Lower at init, equal at the end: reproduced at init and not at the end; *during* is the mean
    of log10 κ over the monitor steps strictly inside the run (hand-computed)."""
    kappa = Claim("T-kappa", "T", "lower κ", "spectral", "monitor:kappa/W_Q/median", "lower", ("digits",))
    runs = []
    for seed in range(4):
        wobble = 1 + 0.01 * seed
        runs.append(monitored("standard", seed, {0: 1e3 * wobble, 50: 1e3, 100: 1e3, 150: 100.0 * wobble}))
        runs.append(
            monitored("spectral", seed, {0: 10.0, 50: 10.0, 100: 1e2, 150: 100.0 * (1 + 0.01 * (3 - seed))})
        )
    init, during, end = verdicts(runs, [kappa])
    assert [v.reading.rsplit(" · ")[-1] for v in (init, during, end)] == [
        "at init",
        "during training",
        "at the end",
    ]
    assert init.verdict == "reproduced" and end.verdict == "inconclusive"
    assert during.value == pytest.approx((1 + 2) / 2) and during.baseline == pytest.approx(3)
    assert during.effect == pytest.approx(-1.5)


def test_each_primary_is_a_reading_file_and_matches_exactly_one_reading():
    """Every claim's primary reading is a file in conf/reading/ of the claim's variant, and among
    the runs of every reading of that variant only the primary's runs match it."""
    from launch.analysis.reading_files import matching, reading_files

    files = reading_files()
    for claim in CLAIMS:
        assert claim.primary in files, claim.key
        variant, settings = files[claim.primary]
        assert variant == claim.variant, claim.key
        runs = [run(v, 0, 0.5, **options) for name, (v, options) in files.items() if v == claim.variant]
        assert [r for r in runs if matching(r) == claim.primary] == [run(variant, 0, 0.5, **settings)]


def test_the_answer_is_the_primary_reading_and_an_exploratory_verdict_is_marked():
    """A clear gain on an exploratory reading and noise on the primary: the row of the exploratory
    reading says *reproduced* with ‡, and the claim's answer is the primary's *inconclusive*."""
    from launch.analysis.verdicts import answers, claims_section

    claim = next(c for c in CLAIMS if c.key == "P2-image")
    runs = []
    for seed, noise in enumerate([0.02, -0.03, 0.01, -0.01, 0.0]):
        runs.append(run("standard", seed, 0.8))
        runs.append(run("spectral", seed, 0.8 + noise, mode="identity", lam=10.0, targets="qkv"))  # primary
        runs.append(run("spectral", seed, 0.85 + noise / 10, mode="svd", targets="qkv"))  # exploratory
    found = verdicts(runs, [claim])
    by_file = {v.reading_file: v for v in found}
    assert by_file["spectral_qkv"].role == "primary" and by_file["spectral_svd"].role == "exploratory"
    assert by_file["spectral_svd"].adjusted == "reproduced"
    assert answers(found) == {("P2-image", "digits", ""): "inconclusive"}
    rows = "\n".join(claims_section(found))
    svd_row = next(line for line in rows.splitlines() if "`spectral_svd`" in line)
    assert "**reproduced**‡" in svd_row
    primary_row = next(line for line in rows.splitlines() if "`spectral_qkv` **primary**" in line)
    assert "**inconclusive**" in primary_row


@pytest.mark.parametrize(
    "items, any_row, message",
    [
        (["P2-image=abc"], False, "--margin P2-image=abc: 'abc' is not a number (e.g. P2-image=0.01)"),
        (["P2-image=-0.01"], False, "--margin P2-image=-0.01: a margin is a positive effect size"),
        (["0"], True, "--margin 0: a margin is a positive effect size"),
        (["0.01"], False, "--margin 0.01: no claim '0.01'"),
    ],
)
def test_a_margin_is_a_positive_number_said_in_one_line(items, any_row, message):
    with pytest.raises(ValueError) as refused:
        parse_margins(items, any_row=any_row)
    assert str(refused.value).startswith(message)
    assert parse_margins(["P2-image=0.02", "0.5"], any_row=True) == {"P2-image": 0.02, ANY_ROW: 0.5}


def run_with_test(attn: str, seed: int, val: float, test: float, **options) -> Run:
    """:func:`run` with an ``eval-test.json`` of the record's own configuration: ``test/acc``."""
    done = run(attn, seed, val, **options)
    done.evals["test"] = {
        "split": "test",
        "metric": "test/acc",
        "metrics": {"test/acc": test},
        "checkpoint": "last",
    }
    return done


def test_a_final_claim_reads_test_in_the_report_and_validation_in_the_settle_loop():
    """Validation says the variant is better, test says it is worse: the report's verdict
    (``on="auto"``) is the test split's, the settle loop's look (``on="val"``) never sees test;
    and one run without its test number sends the whole row back to validation."""
    runs = []
    for seed in range(6):
        runs += [run_with_test("standard", seed, 0.80, 0.90 + 0.001 * seed)]
        runs += [run_with_test("spectral", seed, 0.85 + 0.002 * seed, 0.85, targets="q")]
    (report,) = verdicts(runs, [FINAL])
    (look,) = verdicts(runs, [FINAL], on="val")
    assert report.metric == "test/acc" and report.verdict == "contradicted" and report.effect < -0.04
    assert look.metric == "val/acc" and look.verdict == "reproduced" and look.effect > 0.04
    del runs[-1].evals["test"]
    (mixed,) = verdicts(runs, [FINAL])
    assert mixed.metric == "val/acc" and mixed.verdict == "reproduced"
    with pytest.raises(ValueError, match="not auto or val"):
        verdicts(runs, [FINAL], on="test")
