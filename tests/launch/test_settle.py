"""Seeds until settled (launch.analysis.settle): the looks' alpha, where the loop stops, and a kill."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import main_in_process
from scipy import stats as scipy_stats
from test_claims import run

from launch.analysis import stats
from launch.analysis.claims import Claim
from launch.analysis.records import Run, read_runs
from launch.analysis.settle import Plan, settle
from launch.analysis.verdicts import verdicts
from src.engine.record.identity import Identity

GAIN = Claim("T-gain", "T", "the variant trains better", "spectral", "final", "metric", ("digits",))


def test_the_looks_spend_exactly_alpha_and_little_early():
    plan = Plan(first=4, batch=2, cap=12)
    assert plan.looks == [4, 6, 8, 10, 12]
    levels = stats.look_levels(plan.looks)
    assert sum(lv.side for lv in levels) == pytest.approx(stats.SIDE_ALPHA)
    assert sum(lv.equivalent for lv in levels) == pytest.approx(stats.EQUIV_ALPHA)
    assert all(lv.side > 0 for lv in levels)
    assert levels[0].side < levels[-1].side / 10  # O'Brien–Fleming: most of it kept for the end
    pocock = stats.look_levels(plan.looks, "pocock")
    assert pocock[0].side > levels[0].side and sum(lv.side for lv in pocock) == pytest.approx(0.025)
    assert Plan(5, 3, 10).looks == [5, 8, 10]  # the cap is always a look


def test_sequential_looks_at_the_spent_alpha_keep_the_false_verdict_rate_but_naive_looks_do_not():
    """10,000 null experiments looked at after every batch: stopping at the first look whose
    interval clears 0 at the fixed 2.5% is a false *reproduced* far more often than 2.5%; at each
    look's spent alpha it stays under it."""
    rng = np.random.default_rng(7)
    plan = Plan(first=3, batch=1, cap=12)
    diffs = rng.normal(0.0, 1.0, size=(10_000, plan.cap))
    levels = stats.look_levels(plan.looks)
    naive = np.zeros(len(diffs), bool)
    spent = np.zeros(len(diffs), bool)
    for n, level in zip(plan.looks, levels, strict=True):
        x = diffs[:, :n]
        t = x.mean(1) / (x.std(1, ddof=1) / np.sqrt(n))
        p_for = scipy_stats.t.sf(t, n - 1)
        naive |= p_for < stats.SIDE_ALPHA
        spent |= p_for < level.side
    assert naive.mean() > 0.05  # ten looks at the fixed level: the error grows
    assert spent.mean() <= stats.SIDE_ALPHA + 0.004  # 3 standard errors of 10,000 trials


class FakeSweep:
    """A task whose effect is set: seed s of ``standard`` scores ``0.9 + u_s``, of the variant
    ``0.9 + u_s + effect + e_s`` (``u``, ``e`` normal, ``e``'s spread ``sd``), in memory or as run
    folders under ``root`` (``on_disk``). ``launched`` lists every (variant, seed) asked for."""

    def __init__(self, effect: float, sd: float, rng_seed: int, root: Path | None = None) -> None:
        rng = np.random.default_rng(rng_seed)
        self.shared, self.noise = rng.normal(0, 0.01, 200), rng.normal(0, sd, 200)
        self.effect, self.root, self.runs, self.launched = effect, root, [], []
        for seed in range(3):
            self.add("standard", seed)
            self.add("spectral", seed)

    def score(self, attn: str, seed: int) -> float:
        extra = self.effect + self.noise[seed] if attn == "spectral" else 0.0
        return 0.9 + self.shared[seed] + extra

    def add(self, attn: str, seed: int) -> None:
        if self.root is None:
            self.runs.append(run(attn, seed, self.score(attn, seed)))
        else:
            write_run(self.root, attn, seed, self.score(attn, seed))

    def read(self) -> list[Run]:
        return self.runs if self.root is None else read_runs([self.root])

    def launch(self, members: list[Run], seeds: list[int]) -> None:
        for seed in seeds:
            self.launched.append((members[0].attn, seed))
            self.add(members[0].attn, seed)


def write_run(root: Path, attn: str, seed: int, acc: float) -> None:
    folder = root / "digits" / "vit" / attn / f"seed={seed}"
    folder.mkdir(parents=True)
    config = {"task": {"name": "digits", "metric": "val/acc"}, "backbone": {"name": "vit"}}
    config |= {"attn": {"variant": attn}, "seed": seed}
    (folder / "config.yaml").write_text(json.dumps(config))  # JSON is YAML
    (folder / "metrics.jsonl").write_text(json.dumps({"step": 100, "split": "val", "val/acc": acc}) + "\n")
    summary = {"status": "completed", "metric": "val/acc", "metric_mode": "max", "final": {"val/acc": acc}}
    (folder / "summary.json").write_text(json.dumps(summary | {"steps": 100}))


def stop_at(effect: float, sd: float, plan: Plan, rng_seed: int, tmp: Path) -> int:
    sweep = FakeSweep(effect, sd, rng_seed)
    found = settle(tmp, plan, sweep.read, sweep.launch, claims=[GAIN], say=lambda _: None)
    (tmp / "settle.json").unlink()
    return next(v.n for v in found if v.claim is GAIN)


def test_the_loop_stops_where_the_power_calculation_says(tmp_path):
    """The power calculation at each look's level predicts the first look by which 80% of
    experiments have settled; over 120 simulated settles the 80th percentile of where the loop
    stops is that look, within one batch."""
    effect, sd, plan = 0.012, 0.012, Plan(first=3, batch=2, cap=21)
    levels = stats.look_levels(plan.looks)
    predicted = next(
        n for n, lv in zip(plan.looks, levels, strict=True) if stats.power(effect, sd, n, lv.side) >= 0.8
    )
    stops = [stop_at(effect, sd, plan, i, tmp_path) for i in range(120)]
    assert 5 < predicted < plan.cap  # the case is one the loop can resolve before its cap
    assert abs(np.quantile(stops, 0.8) - predicted) <= plan.batch
    assert min(stops) >= plan.first and max(stops) <= plan.cap


def test_a_null_row_without_a_margin_runs_to_the_cap_and_every_seed_is_kept(tmp_path):
    sweep = FakeSweep(0.0, 0.02, rng_seed=1)
    plan = Plan(first=3, batch=2, cap=7)
    found = settle(tmp_path, plan, sweep.read, sweep.launch, claims=[GAIN], say=lambda _: None)
    (row,) = found
    assert row.n == 7 and row.adjusted == "inconclusive"
    assert sorted(sweep.launched) == sorted((a, s) for a in ("spectral", "standard") for s in range(3, 7))
    state = json.loads((tmp_path / "settle.json").read_text())
    assert [look["rows"][0]["target"] for look in state["looks"]][-1] == 7


def test_a_killed_settle_resumes_without_running_a_seed_twice(tmp_path):
    """Killed after the first new seed of a batch, then rerun: every seed is launched once and the
    verdicts are those of an uninterrupted settle."""
    plan = Plan(first=3, batch=2, cap=9)
    whole = FakeSweep(0.0, 0.02, rng_seed=3, root=tmp_path / "whole")
    expected = settle(tmp_path / "whole", plan, whole.read, whole.launch, claims=[GAIN], say=lambda _: None)

    root = tmp_path / "killed"
    sweep = FakeSweep(0.0, 0.02, rng_seed=3, root=root)

    def dies_after_one(members: list[Run], seeds: list[int]) -> None:
        sweep.launch(members, seeds[:1])
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        settle(root, plan, sweep.read, dies_after_one, claims=[GAIN], say=lambda _: None)
    assert sweep.launched == [("spectral", 3)] or sweep.launched == [("standard", 3)]
    found = settle(root, plan, sweep.read, sweep.launch, claims=[GAIN], say=lambda _: None)
    assert len(sweep.launched) == len(set(sweep.launched)) == len(whole.launched)
    assert [(v.n, v.effect, v.adjusted) for v in found] == [(v.n, v.effect, v.adjusted) for v in expected]


def test_settle_refuses_a_folder_that_is_not_a_sweep_in_one_line(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "launch.analysis.settle", str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2
    assert (
        done.stderr.startswith("error: ") and done.stderr.count("\n") == 1 and "multirun.yaml" in done.stderr
    )


@pytest.mark.minutes(1.2)
def test_settle_repeats_the_sweeps_own_command_with_new_seeds_and_the_report_states_the_rule(
    tmp_path, capsys
):
    """A real two-seed sweep, settled to three: the new seed of each reading is launched with the
    run's own overrides into the same sweep folder, pairs with its partner, and the report reads
    the rows at the plan's last look and prints the stopping rule. The sweep and the runs settle
    launches are processes of their own; settle and the report are called in this process (their
    process boundary is the refusal test's above)."""
    from launch.analysis import report
    from launch.analysis import settle as settle_command

    root = tmp_path / "sweep"
    short = [
        "trainer.max_steps=2",
        "trainer.val_every=1",
        "trainer.monitor_every=1",
        "trainer.checkpoint_every=2",
    ]
    sweep = [sys.executable, "-m", "src.run", "-m", "task=digits", "reading=standard,spectral_q", "seed=0,1"]
    subprocess.run([*sweep, *short, f"hydra.sweep.dir={root}"], check=True, capture_output=True)
    settled, _, err = main_in_process(settle_command.main, capsys, root, "--cap", "3", "--batch", "1")
    assert settled == 0, err[-2000:]
    runs = read_runs([root])
    assert sorted((r.attn, r.seed, r.status) for r in runs) == [
        (attn, seed, "completed") for attn in ("spectral", "standard") for seed in range(3)
    ]
    assert len({r.experiment for r in runs}) == 2  # seed 2 is the same experiment as seeds 0-1
    state = json.loads((root / "settle.json").read_text())
    assert sorted(state["targets"].values()) == [3, 3]
    # the same command again (after a kill, say): its plan, nothing launched
    again, out, err = main_in_process(settle_command.main, capsys, root, "--cap", "3", "--batch", "1")
    assert again == 0 and " more of " not in out, err[-2000:]
    code, reported, _ = main_in_process(report.main, capsys, root, "--print")  # report.md as printed
    assert code == 0
    assert "looks at 2 (0.0060/0.0164), 3 (0.0190/0.0336) seeds" in reported
    rows = reported.splitlines()
    assert any(
        line.startswith(
            "| digits | spectral | `spectral_q` default | 2 steps · 0.1 epochs · 128 samples | 3 |"
        )
        for line in rows
    )

    def confirm() -> tuple[int, str, str]:
        return main_in_process(settle_command.main, capsys, root, "--confirm", "spectral_q", "--seeds", "2")

    confirmed, _, err = confirm()
    assert confirmed == 0, err[-2000:]
    fresh = [r for r in read_runs([root]) if r.identity.config.get("stage") == "confirm"]
    assert sorted((r.attn, r.seed) for r in fresh) == [
        (a, s) for a in ("spectral", "standard") for s in (1000, 1001)
    ]
    assert {r.identity.without("stage").hash for r in fresh} == {r.experiment for r in runs}  # same settings
    code, reported, _ = main_in_process(report.main, capsys, root, "--print")
    assert code == 0
    assert any(
        line.startswith(
            "| digits | spectral | `spectral_q` default (confirm) | 2 steps · 0.1 epochs · 128 samples | 2 |"
        )
        for line in reported.splitlines()
    )
    assert "fresh seeds of" not in confirm()[1]  # a second call launches nothing


def test_confirm_runs_pair_among_themselves_and_are_a_family_of_their_own():
    """Exploratory seeds 0-4 of three readings and confirm seeds 1000-1004 of one: the confirm row
    pairs only with confirm seeds of standard, and its Holm family is itself (its adjusted verdict
    is its raw one), whatever the exploratory readings beside it."""

    def confirm_run(attn: str, seed: int, acc: float, **options) -> Run:
        r = run(attn, seed, acc, **options)
        r.identity = Identity({**r.identity.config, "stage": "confirm"})
        return r

    explored = [run("standard", s, 0.90) for s in range(5)]
    explored += [run("spectral", s, 0.90 + 0.01 * (s % 2), lam=lam) for s in range(5) for lam in (1, 2, 3)]
    confirmed = [confirm_run("standard", s, 0.90) for s in range(1000, 1005)]
    confirmed += [confirm_run("spectral", s, 0.92 + 0.001 * (s % 2), lam=2) for s in range(1000, 1005)]
    found = verdicts(explored + confirmed, [GAIN])
    assert len(found) == 4
    (row,) = [v for v in found if v.stage == "confirm"]
    assert row.n == 5 and row.reading == "lam=2 (confirm)" and row.effect == pytest.approx(0.0204)
    assert row.adjusted == row.verdict == "reproduced"


def test_primary_only_leaves_exploratory_rows_at_their_seeds(tmp_path):
    """``--primary``: a row whose reading is not its claim's primary gets no seeds."""
    from launch.analysis.settle import readings_filter

    sweep = FakeSweep(0.0, 0.02, rng_seed=2)
    plan = Plan(first=3, batch=2, cap=7)
    (row,) = settle(
        tmp_path, plan, sweep.read, sweep.launch, [GAIN], wanted=readings_filter(None, True), say=print
    )
    assert row.role == "exploratory" and row.n == 3 and sweep.launched == []


def test_rows_the_settle_never_judged_keep_the_fixed_levels(tmp_path):
    """Under ``--primary`` an exploratory row is never looked at sequentially: the report reads it
    at the fixed levels, not at a look's spent alpha; settled as a wanted row, at its last look's."""
    from launch.analysis.settle import read_plan, readings_filter

    plan = Plan(3, 2, 7)
    only_primary, every_row = tmp_path / "primary", tmp_path / "all"
    for root, wanted in ((only_primary, readings_filter(None, True)), (every_row, readings_filter(None))):
        root.mkdir()
        sweep = FakeSweep(0.0, 0.02, rng_seed=2)
        settle(root, plan, sweep.read, sweep.launch, [GAIN], wanted=wanted, say=lambda _: None)
    assert read_plan(only_primary)[1] == {}
    assert set(read_plan(every_row)[1].values()) == {plan.levels(7)}
