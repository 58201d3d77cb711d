"""One verdict engine: one row type, one Holm adjustment, one renderer, and a registry of measures
that every claim's measure is in and that a new measure joins by registering alone."""

from __future__ import annotations

import ast
import statistics
from pathlib import Path

import pytest
from scipy import stats as scipy_stats
from test_report import write_run

from launch.analysis import claims, measures, report
from launch.analysis.claims import CLAIMS, Claim
from launch.analysis.measures import Evidence, lookup, register
from launch.analysis.verdict_row import Verdict
from launch.analysis.verdicts import pairings

LAUNCH = Path(__file__).resolve().parents[2] / "launch"
#: what only a verdict row holds: its verdict, its Holm-adjusted verdict
ROW_FIELDS = {"verdict", "adjusted", "verdict_holm", "adjusted_verdict"}


def modules() -> dict[str, ast.Module]:
    return {str(p.relative_to(LAUNCH.parent)): ast.parse(p.read_text()) for p in sorted(LAUNCH.rglob("*.py"))}


def test_only_one_class_in_launch_defines_a_verdict_row():
    """A class with a field of :data:`ROW_FIELDS` (a dataclass's annotated field) is a verdict row:
    there is one, launch/analysis/verdict_row.py's Verdict (SeedVerdict and seed_sets' Row were two more)."""
    rows = [
        f"{path}:{node.name}"
        for path, tree in modules().items()
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
        and any(
            isinstance(item, ast.AnnAssign)
            and isinstance(item.target, ast.Name)
            and item.target.id in ROW_FIELDS
            for item in node.body
        )
    ]
    assert rows == ["launch/analysis/verdict_row.py:Verdict"]


def test_one_function_applies_holm_and_it_is_the_one_adjust():
    """Every call of ``holm`` in launch/ is inside one function, verdict_row.adjust; no other
    function is named adjust."""
    callers, adjusts = set(), []
    for path, tree in modules().items():
        for function in ast.walk(tree):
            if not isinstance(function, ast.FunctionDef):
                continue
            if function.name == "adjust":
                adjusts.append(path)
            for call in ast.walk(function):
                if isinstance(call, ast.Call):
                    name = getattr(call.func, "attr", getattr(call.func, "id", ""))
                    if name == "holm":
                        callers.add(f"{path}:{function.name}")
    assert callers == {"launch/analysis/verdict_row.py:adjust"}
    assert adjusts == ["launch/analysis/verdict_row.py"]


def test_no_module_but_the_renderer_writes_a_verdict_into_a_table_row():
    """A table row that prints a verdict (an f-string opening with ``|`` that formats ``.verdict``
    or ``.adjusted``) is written only by launch/analysis/verdict_row.py's renderer."""
    writers = []
    for path, tree in modules().items():
        for node in ast.walk(tree):
            if not isinstance(node, ast.JoinedStr) or not node.values:
                continue
            head = node.values[0]
            opens_a_row = isinstance(head, ast.Constant) and str(head.value).lstrip().startswith("|")
            prints_a_verdict = any(
                isinstance(a, ast.Attribute) and a.attr in ("verdict", "adjusted")
                for v in node.values
                if isinstance(v, ast.FormattedValue)
                for a in ast.walk(v.value)
            )
            if opens_a_row and prints_a_verdict:
                writers.append(path)
    assert writers == []


def test_every_claims_measure_is_registered_with_a_judge():
    for claim in CLAIMS:
        measure = lookup(claim.measure)
        assert measure.runs is not None or measure.sets is not None, claim.key
        if claim.measure in claims.SEED_SET_MEASURES:
            assert measure.sets is not None and measure.runs is None, claim.key
    assert lookup("monitor:kappa/W_Q/median").name == "monitor:"  # a prefix serves its keys
    assert (
        lookup("stages").runs is not None and lookup("stages").sets is not None
    )  # one measure, both evidences
    with pytest.raises(ValueError, match="unknown measure 'nothing'"):
        lookup("nothing")


#: a toy statistic: each seed's best validation value (not the final one), paired with standard's
TOY = Claim(
    "T-best",
    "T",
    "the variant's best validation accuracy is higher",
    "cond_init",
    "toy_best",
    "higher",
    ("imagenet",),
)


def best_verdicts(claim: Claim, evidence: Evidence) -> list[list[Verdict]]:
    """The toy measure's judge: the claim's readings on the task, one family."""
    from launch.analysis import stats

    rows = []
    for pair in pairings(claim, evidence.runs):
        mine = {r.seed: r.best[r.metric] for r in pair.members}
        theirs = {r.seed: r.best[r.metric] for r in pair.base}
        seeds = sorted(set(mine) & set(theirs))
        test = stats.paired_test([mine[s] - theirs[s] for s in seeds])
        baseline, value = (statistics.fmean(arm[s] for s in seeds) for arm in (theirs, mine))
        v = Verdict(
            claim,
            evidence.task,
            pair.label,
            len(seeds),
            baseline,
            value,
            test.mean,
            test.low,
            test.high,
            None,
        )
        v.test = test
        rows.append(v)
    return [rows]


def test_a_registered_measure_gets_its_verdict_through_the_report(tmp_path, monkeypatch):
    """Registering one judge and adding one claim row: the report's Claims section carries the toy
    claim's row, its effect and interval those of an independent paired t (scipy), its verdict
    and Holm's."""
    monkeypatch.setattr(measures, "MEASURES", dict(measures.MEASURES))
    register("toy_best", "runs")(best_verdicts)
    CLAIMS.append(TOY)  # the list the report reads (verdicts' default), restored below
    try:
        best = {"standard": [0.80, 0.81, 0.82, 0.79], "cond_init": [0.84, 0.845, 0.86, 0.83]}
        for attn, values in best.items():
            for seed, top in enumerate(values):
                write_run(tmp_path, attn, seed, [top * i / 10 for i in range(1, 9)] + [top, top - 0.1])
        assert report.main([str(tmp_path), "--out", str(tmp_path / "report")]) == 0
    finally:
        CLAIMS.remove(TOY)
    text = (tmp_path / "report" / "report.md").read_text()
    assert "### T best: the variant's best validation accuracy is higher" in text
    assert "Measure: `toy_best`" in text
    diffs = [a - b for a, b in zip(best["cond_init"], best["standard"], strict=True)]
    mean = statistics.fmean(diffs)
    low, high = scipy_stats.t.interval(0.95, len(diffs) - 1, loc=mean, scale=scipy_stats.sem(diffs))
    p_for = scipy_stats.ttest_1samp(diffs, 0.0, alternative="greater").pvalue
    verdict = "reproduced" if p_for < 0.025 else "inconclusive"
    section = text[text.index("### T best") :]
    row = next(line for line in section.splitlines() if line.startswith("| imagenet | cond_init |"))
    ours = " → ".join(f"{statistics.fmean(best[arm]):.2f}" for arm in ("standard", "cond_init"))
    assert f"| 4 | {ours} | {mean:+.3f} [{low:+.3f}, {high:+.3f}] |" in row
    assert row.endswith(f"| **{verdict}** | {verdict} |") and verdict == "reproduced"
