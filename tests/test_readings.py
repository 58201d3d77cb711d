"""The readings sweep in miniature (``experiment=readings/smoke``, at 4 steps a run), through the
real entry point: every reading of every variant runs, the collapse guard warns where (and only
where) the softmax is one-hot at init, and the report gives each reading its own verdict for each claim."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import CONF, run_cli

from launch.analysis.claims import CLAIMS
from launch.analysis.records import read_runs
from launch.analysis.verdicts import verdicts
from src.conditioning.collapse import collapse_warning

READINGS = sorted(p.stem for p in (CONF / "reading").glob("*.yaml"))
VARIANT_OF = {  # each reading's `override /attn: <variant>`
    r: (CONF / "reading" / f"{r}.yaml").read_text().split("override /attn:")[1].split()[0] for r in READINGS
}
COLLAPSING = {"spectral_qk", "spectral_qkv"}  # lam = 10 on both W_Q and W_K


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("readings")
    short = [
        "trainer.max_steps=4",
        "trainer.val_every=2",
        "trainer.monitor_every=2",
        "trainer.checkpoint_every=4",
    ]
    result = run_cli(["-m", "experiment=readings/smoke", *short, f"paths.output_dir={out}"], cwd=out)
    assert result.returncode == 0, result.stderr[-3000:]
    return out / "multirun" / "readings" / "smoke"


@pytest.mark.minutes(1.1)
def test_every_reading_runs_both_seeds_and_logs_its_state_at_init(sweep):
    runs = read_runs([sweep])
    assert sorted(r.status for r in runs) == ["completed"] * 2 * len(READINGS)
    for r in runs:
        init = [row for row in r.rows if row["split"] == "monitor" and row["step"] == 0]
        assert init and 0 <= init[0]["entropy/P/median"] <= 1, r.name


def test_the_collapse_guard_warns_once_exactly_where_attention_is_one_hot(sweep):
    for log in sweep.glob("**/run.log"):
        reading = log.parent.name.split("reading=")[1].split(",")[0]
        warnings = log.read_text().count("attention is collapsed at init")
        assert warnings == (reading in COLLAPSING), log
        if warnings:
            assert "attn.targets=" in log.read_text() and "attn.lam=10" in log.read_text()


def test_each_reading_of_each_variant_gets_its_own_verdict(sweep):
    found = verdicts(read_runs([sweep]))
    for claim in (c for c in CLAIMS if "digits" in c.tasks and c.measure != "stages"):
        rows = [v for v in found if v.claim == claim]
        expected = sum(variant == claim.variant for variant in VARIANT_OF.values())
        points = 3 if claim.measure.startswith("monitor:") else 1  # κ: at init, during, at the end
        assert len({v.reading_file for v in rows}) == expected and len(rows) == expected * points, claim.key
        assert all(v.n == 2 for v in rows) and sum(v.role == "primary" for v in rows) == points, claim.key


class Named:
    def __init__(self, name: str, cause: str = "") -> None:
        self.name, self.cause = name, cause

    def collapse_cause(self) -> str:
        return self.cause


def test_the_warning_names_the_variant_and_its_option_and_stays_quiet_otherwise():
    spectral = Named("spectral", "attn.lam=10 on both W_Q and W_K")
    message = collapse_warning({"entropy/P/median": 0.004}, [spectral], 0.05)
    assert "0.004" in message and "attn.lam=10" in message
    assert collapse_warning({"entropy/P/median": 0.3}, [spectral], 0.05) is None
    assert collapse_warning({"kappa/X/median": 3.0}, [spectral], 0.05) is None  # no P in the row
