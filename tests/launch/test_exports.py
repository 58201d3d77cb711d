"""The report's exports (results.csv, results.json), its split labels and its variant options, on
hand-made run folders with known numbers (``write_run`` from test_report)."""

from __future__ import annotations

import dataclasses
import json
import statistics

import pytest
from test_report import STEPS, write_run

from launch.analysis import exports, report
from launch.analysis.records import read_runs, variant_options
from src.attention import VARIANTS

TESTS = {0: 0.61, 1: 0.65, 2: 0.66}


@pytest.fixture
def sweep(tmp_path):
    """standard: 3 seeds with test numbers; precond: 2 seeds, one with a test number; spectral
    mode=svd: one seed; and a failed run."""
    for seed, test in TESTS.items():
        write_run(tmp_path, "standard", seed, [0.5 + seed / 100] * 10, test=test)
    write_run(tmp_path, "precond", 0, [0.7] * 10, test=0.68)
    write_run(tmp_path, "precond", 1, [0.72] * 10)
    write_run(tmp_path, "spectral", 0, [0.4] * 10, settings={"attn.mode": "svd"})
    write_run(tmp_path, "cond_init", 0, None, status="failed", error="RuntimeError: planted")
    assert report.main([str(tmp_path), "--out", str(tmp_path / "out")]) == 0
    return tmp_path


def test_the_csv_and_the_json_carry_the_same_rows(sweep):
    rows = json.loads((sweep / "out" / "results.json").read_text())
    assert exports.read_exports_csv(sweep / "out" / "results.csv") == rows
    runs = [r for r in rows if r["kind"] == "run"]
    assert len(runs) == 7 and {r["run_dir"] for r in runs} == {r.name for r in read_runs([sweep])}
    failed = next(r for r in runs if r["status"] == "failed")
    assert (failed["attn"], failed["final"], failed["split"]) == ("cond_init", None, None)


def test_a_group_row_is_its_seeds_mean_std_n_over_one_split(sweep):
    rows = json.loads((sweep / "out" / "results.json").read_text())
    groups = {r["attn"]: r for r in rows if r["kind"] == "group"}
    standard = groups["standard"]
    assert (standard["split"], standard["metric"], standard["seeds"]) == ("test", "test/acc", [0, 1, 2])
    assert standard["mean"] == pytest.approx(statistics.fmean(TESTS.values()))
    assert standard["std"] == pytest.approx(statistics.stdev(TESTS.values()))
    precond = groups["precond"]  # one seed tested, one not: validation for both, never a mix
    assert (precond["split"], precond["n"], precond["mean"]) == ("val", 2, pytest.approx(0.71))
    assert "test on 1 of 2 seeds" in precond["note"]
    spectral = groups["spectral"]
    assert (spectral["n"], spectral["std"], spectral["options"]) == (1, None, "mode=svd")
    run = next(r for r in rows if r["kind"] == "run" and r["attn"] == "standard" and r["seed"] == 1)
    assert (run["final"], run["split"], run["best"], run["best_split"]) == (TESTS[1], "test", 0.51, "val")
    assert (run["steps"], run["epochs"]) == (STEPS[-1], STEPS[-1] / 10)


def test_the_table_says_each_split_and_one_seed_has_no_spread(sweep):
    text = (sweep / "out" / "report.md").read_text()
    mean = 100 * statistics.fmean(TESTS.values())
    assert f"| standard | — | 1000 (100 ep) | test | test/acc | {mean:.2f} ± " in text
    assert "| val (test on 1 of 2 seeds only: val for all) | val/acc | 71.00 ± 1.41 | 2 |" in text
    assert "| spectral mode=svd | — | 1000 (100 ep) | val | val/acc | 40.00 ± — | 1 |" in text
    assert "± 0.00" not in text


def test_a_damaged_eval_file_is_named_and_the_run_falls_back_to_validation(tmp_path):
    folder = write_run(tmp_path, "standard", 0, [0.5] * 10)
    (folder / "eval-test.json").write_text('{"split": "test", "metrics": {}}')
    with pytest.warns(UserWarning, match="eval-test.json is left out .no .metrics. holding.*split=test"):
        (run,) = read_runs([tmp_path])
    assert (run.reported.split, run.reported.value) == ("val", 0.5)


def test_an_eval_of_another_checkpoint_than_the_records_is_left_out(tmp_path):
    folder = write_run(tmp_path, "standard", 0, [0.5, 0.6, 0.55] + [0.5] * 7, test=0.7)
    assert json.loads((folder / "eval-test.json").read_text())["checkpoint_step"] == STEPS[1]
    (run,) = read_runs([tmp_path])
    assert (run.reported.split, run.reported.value) == ("test", 0.7)
    summary = json.loads((folder / "summary.json").read_text())
    summary["best"]["step"] = STEPS[5]  # the run went on and found a better checkpoint since
    (folder / "summary.json").write_text(json.dumps(summary))
    with pytest.warns(UserWarning, match=f"best checkpoint at step {STEPS[1]}, the record's at {STEPS[5]}"):
        (run,) = read_runs([tmp_path])
    assert (run.reported.split, run.reported.value) == ("val", 0.5)


@pytest.mark.parametrize("variant", ["spectral", "cond_tokens", "precond"])
def test_variant_options_leave_out_the_defaults_and_show_the_rest(variant):
    defaults = {f.name: f.default for f in dataclasses.fields(VARIANTS[variant])}
    changed = next(k for k, v in defaults.items() if isinstance(v, str | float | int))
    other = defaults[changed] * 2 if not isinstance(defaults[changed], str) else defaults[changed] + "x"
    assert variant_options(variant, {"variant": variant, **defaults}) == ""
    assert variant_options(variant, {**defaults, changed: other}) == f"{changed}={other}"
    composed = {"cond_init": {"value": "fused"}, variant: {**defaults, changed: other}}
    assert (
        variant_options(f"cond_init+{variant}", composed)
        == f"cond_init.value=fused {variant}.{changed}={other}"
    )


def test_claims_csv_reads_back_as_its_json_and_its_rows_are_the_verdicts(tmp_path):
    """claims.csv carries the Claims section's verdicts: P1's precond row on digits pairs the three
    seeds with standard's on their test numbers, its effect the mean difference and its interval
    Student's t (scipy's)."""
    from scipy import stats as scipy_stats

    ours, theirs = [0.93, 0.95, 0.94], [0.90, 0.94, 0.92]
    for seed in range(3):
        write_run(tmp_path, "standard", seed, [0.9] * 10, task="digits", test=theirs[seed])
        write_run(tmp_path, "precond", seed, [0.9] * 10, task="digits", test=ours[seed])
    assert report.main([str(tmp_path), "--out", str(tmp_path / "out")]) == 0
    rows = json.loads((tmp_path / "out" / "claims.json").read_text())
    assert exports.read_exports_csv(tmp_path / "out" / "claims.csv") == rows
    (row,) = [r for r in rows if r["claim"] == "P1-train" and r["task"] == "digits"]
    diffs = [a - b for a, b in zip(ours, theirs, strict=True)]
    low, high = scipy_stats.t.interval(0.95, 2, loc=statistics.fmean(diffs), scale=scipy_stats.sem(diffs))
    assert (row["n"], row["metric"], row["source"], row["variant"]) == (3, "test/acc", "P1", "precond")
    assert row["effect"] == pytest.approx(statistics.fmean(diffs))
    assert (row["ci_low"], row["ci_high"]) == (pytest.approx(low), pytest.approx(high))
    assert set(row) == set(exports.CLAIM_FIELDS)


def test_what_trained_a_run_is_read_from_its_sessions_and_a_strange_value_is_left_out():
    from launch.analysis.records import provenance

    summary = {
        "sessions": [
            {"host": "node1", "torch": "2.14.1+cpu", "code": {"git": "abc123"}},
            {"host": "node2", "torch": "2.14.1+cpu", "code": {"git": "abc123"}},
            {"host": "x; rm -rf /", "torch": ["not", "a", "string"], "code": "not a dict"},
            "not a session",
        ]
    }
    assert provenance(summary) == {"host": "node1 node2", "commit": "abc123", "torch": "2.14.1+cpu"}
    assert provenance({"sessions": "no list"}) == {"host": "", "commit": "", "torch": ""}
    assert exports.made_by([]) == {"host": None, "commit": None, "torch": None}
