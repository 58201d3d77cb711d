"""launch.ask: a question no claim makes, answered in one line on digits at a tiny budget, the line's
numbers those of scipy's paired t-test on the records, and a rerun that trains nothing."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
from conftest import main_in_process, one_error_line
from scipy import stats
from test_settle import GAIN, FakeSweep

from launch import ask
from launch.analysis.settle import Plan, settle
from launch.analysis.verdicts import COMPARED, effects

#: ``cond_init+spectral`` (attn=compose), which no claim names, 20 steps a run
TINY = [
    "task=digits",
    "attn=compose",
    *("trainer.max_steps=20", "trainer.val_every=10", "trainer.monitor_every=0", "trainer.threads=1"),
    "trainer.progress=none",
]
VARIANT = "cond_init+spectral"
LOOKS = ["--first", "2", "--batch", "1", "--cap", "3", "--margin", "0.05"]
LINE = re.compile(
    r"^cond_init\+spectral vs standard on digits/vit_digits: ([+−][\d.]+) \[([+−][\d.]+), ([+−][\d.]+)\] "
    r"points of test/acc \(test split, 95% interval\), (\d+) paired seeds: (\w+)"
)


def number(text: str) -> float:
    return float(text.replace("−", "-"))


def records(root: Path) -> dict[tuple[str, int], float]:
    """``{(attn, seed): test accuracy}`` read from the run folders' own files."""
    out = {}
    for path in root.rglob("summary.json"):
        summary = json.loads(path.read_text())
        test = json.loads((path.parent / "eval-test.json").read_text())
        out[summary["attn"], summary["seed"]] = test["metrics"]["test/acc"]
    return out


def level(n: int, alpha: float, looks: tuple[int, ...] = (2, 3)) -> float:
    """The alpha O'Brien–Fleming-shaped Lan–DeMets spending gives the look at ``n`` seeds."""

    def spent(t: float) -> float:
        return 2 - 2 * stats.norm.cdf(stats.norm.ppf(1 - alpha / 2) / t**0.5)

    i = looks.index(n)
    return spent(n / looks[-1]) - (spent(looks[i - 1] / looks[-1]) if i else 0.0)


def expected_verdict(diffs: list[float], margin: float) -> str:
    """better / worse / equivalent / inconclusive at the look of ``len(diffs)`` seeds (scipy's tests)."""
    n = len(diffs)
    if stats.ttest_1samp(diffs, 0, alternative="greater").pvalue < level(n, 0.025):
        return "better"
    if stats.ttest_1samp(diffs, 0, alternative="less").pvalue < level(n, 0.025):
        return "worse"
    above = stats.ttest_1samp(diffs, -margin, alternative="greater").pvalue
    below = stats.ttest_1samp(diffs, margin, alternative="less").pvalue
    return "equivalent" if max(above, below) < level(n, 0.05) else "inconclusive"


@pytest.fixture(scope="module")
def asked(tmp_path_factory) -> tuple[list[str], Path]:
    out = tmp_path_factory.mktemp("ask") / "outputs"
    return [*TINY, f"paths.output_dir={out}", *LOOKS], out


@pytest.mark.minutes(1)
def test_the_answer_is_one_line_equal_to_scipys_paired_t_and_a_rerun_trains_nothing(asked, capsys):
    argv, out = asked
    code, answer, err = main_in_process(ask.main, capsys, *argv)
    assert code == 0, err[-3000:]
    (line,) = answer.splitlines()
    (root,) = (out / "multirun" / "ask" / "digits" / "vit_digits" / f"{VARIANT}-vs-standard").iterdir()

    found = records(root)
    seeds = sorted(s for a, s in found if a == "standard")
    assert sorted(s for a, s in found if a != "standard") == seeds and seeds in ([0, 1], [0, 1, 2])
    mine = [found[VARIANT, s] for s in seeds]
    theirs = [found["standard", s] for s in seeds]
    paired = stats.ttest_rel(mine, theirs)
    low, high = paired.confidence_interval(0.95)
    diffs = [a - b for a, b in zip(mine, theirs, strict=True)]
    effect, shown_low, shown_high, n, verdict = LINE.match(line).groups()
    for shown, value in ((effect, sum(diffs) / len(diffs)), (shown_low, low), (shown_high, high)):
        assert abs(number(shown) - 100 * value) <= 0.005 + 1e-9, (line, value)
    assert int(n) == len(seeds) and verdict == expected_verdict(diffs, 0.05)
    if verdict == "inconclusive":
        assert re.search(r"; δ 5\.00 would need (\d+|> 1000) seeds", line)
    assert "· budget 20 steps" in line and "seeds (cap 3)" in line
    assert (root / "report" / "forest_digits.png").read_bytes()[:4] == b"\x89PNG"
    rows = json.loads((root / "report" / "results.json").read_text())
    (row,) = [r for r in rows if r["effect"] is not None]
    assert (row["n_paired"], row["verdict_holm"]) == (len(seeds), verdict)

    folders = sorted(p.parent for p in root.rglob("summary.json"))
    written = {p: p.stat().st_mtime_ns for p in root.rglob("metrics.jsonl")}
    again, answer_again, err = main_in_process(ask.main, capsys, *argv)
    assert again == 0 and answer_again == answer, err[-3000:]
    assert " more of " not in err  # no look launched seeds
    assert sorted(p.parent for p in root.rglob("summary.json")) == folders
    assert {p: p.stat().st_mtime_ns for p in root.rglob("metrics.jsonl")} == written

    elsewhere = out.parent / "elsewhere"  # another output folder: the records found by identity
    argv = [a if not a.startswith("paths.output_dir=") else f"paths.output_dir={elsewhere}" for a in argv]
    code, answer_elsewhere, err = main_in_process(ask.main, capsys, *argv, "--reuse", root)
    assert code == 0 and not list(elsewhere.rglob("summary.json")), err[-3000:]
    assert LINE.match(answer_elsewhere).groups()[:4] == LINE.match(line).groups()[:4]


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["task=digits"], "name the variant"),
        (["attn=compose", "seed=0,1"], "one value per key"),
        (["attn=compose", "--margin", "1.0"], "0.01 is one point"),
        (["attn=compose", "attn.nonesuch=1"], "nonesuch"),
        (["attn=standard"], "the baseline 'standard' itself"),
        (["attn=compose", "--first", "1"], "2 ≤ first ≤ cap"),
        (["attn=compose", "--baseline", "standrd"], "did you mean standard"),
    ],
)
def test_a_bad_question_is_one_error_line_and_nothing_is_trained(argv, said, tmp_path, capsys):
    code, answer, err = main_in_process(ask.main, capsys, *argv, f"paths.output_dir={tmp_path}")
    assert code == 2 and answer == "" and said in one_error_line(err), err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("effect", "sd"), [(0.02, 0.01), (-0.02, 0.01), (0.0, 0.003), (0.012, 0.012)])
def test_settle_judging_the_claimless_effect_row_stops_where_it_does_on_the_claim(effect, sd, tmp_path):
    """The loop ask runs (settle with ``effects`` as its judge, on validation) against settle's own on a
    claim of the same comparison and δ, over simulated sweeps: the same look, seeds and verdict
    each time (*better* for *reproduced*, *worse* for *contradicted*): better, worse and equivalent
    before the cap (5 or 7 seeds of 9), better or inconclusive at it."""
    claim = dataclasses.replace(GAIN, margin=0.006)  # spectral on digits: P2-image's δ names the row too
    plan = Plan(first=3, batch=2, cap=9)
    for i in range(8):
        ends = []
        for name, judge in (("claim", None), ("effect", lambda runs, lv: effects(runs, levels=lv, on="val"))):
            sweep = FakeSweep(effect, sd, rng_seed=i)
            root = tmp_path / f"{name}{i}"
            root.mkdir()
            (row,) = settle(root, plan, sweep.read, sweep.launch, [claim], say=lambda _: None, judge=judge)
            ends.append((row.n, COMPARED.get(row.adjusted, row.adjusted), sorted(sweep.launched)))
        assert ends[0] == ends[1]
