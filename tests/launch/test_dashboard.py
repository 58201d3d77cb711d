"""The W&B dashboard: its panels name keys that a real offline run sends, and its specification
is the library's own, read back unchanged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import compose
from wandb_file import offline_run

from launch.analysis import dashboard
from launch.analysis.dashboard_spec import load_spec, panel_metrics, spec_json
from launch.analysis.paper import PAPER
from src.engine import train


@pytest.fixture(scope="module")
def offline(tmp_path_factory):
    """History keys and summary of a 4-step digits run logged offline, the monitor on."""
    tmp = tmp_path_factory.mktemp("wandb")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WANDB_MODE", "offline")
        overrides = ["logger=wandb", "trainer.max_steps=4", "trainer.val_every=2", "trainer.monitor_every=2"]
        train(compose(overrides, tmp), tmp / "run")
    (wandb_file,) = (tmp / "run" / "wandb").glob("offline-run-*/run-*.wandb")
    return offline_run(wandb_file)


def dry_run(tmp_path, *extra: str) -> dict:
    out = tmp_path / "spec.json"
    assert dashboard.main(["--entity", "e", "--project", "p", *extra, "--dry-run", str(out)]) == 0
    return json.loads(out.read_text())


def test_every_panel_plots_a_key_the_run_sends(tmp_path, offline):
    history, summary = offline
    view, _ = load_spec(dry_run(tmp_path))
    panels = panel_metrics(view)
    lines = {k for title, keys in panels.items() if not title.startswith("final") for k in keys}
    bars = {k for title, keys in panels.items() if title.startswith("final") for k in keys}
    assert {"val/acc", "kappa/W_Q/median", "entropy/P/median"} <= lines
    assert lines - history == set()  # line plots read the history
    assert bars == {"final/val/acc"} and bars <= set(summary)  # the bar chart reads the summary


def test_the_specification_round_trips_through_the_library(tmp_path):
    spec = dry_run(tmp_path, "--task", "lm_char", "--sweep", "smoke")
    view, rep = load_spec(spec)
    assert spec_json(view, rep) == spec
    filters = json.dumps(spec["workspace"]["spec"]["section"]["runSets"][0]["filters"])
    assert '"smoke"' in filters and '"lm_char"' in filters  # --sweep and --task select the runs
    assert panel_metrics(view)["val/loss"] == ["val/loss"]  # the LM task's own main metric


def test_the_report_sets_the_papers_numbers_beside_ours(tmp_path):
    _, rep = load_spec(dry_run(tmp_path, "--task", "lra_text"))
    text = "\n".join(getattr(b, "text", "") for b in rep.blocks if isinstance(getattr(b, "text", None), str))
    rows = [n for n in PAPER if n.task == "lra_text"]
    assert rows and all(f"| {n.backbone} | {n.variant} | {n.metric} | {n.value:.4g} |" in text for n in rows)
    grids = [b for b in rep.blocks if type(b).__name__ == "PanelGrid"]
    assert len(grids) == 1 and grids[0].runsets  # our runs, beside the table


def test_an_unknown_task_is_one_message(tmp_path, capsys):
    assert dashboard.main(["--entity", "e", "--project", "p", "--task", "nope", "--dry-run", "x.json"]) == 2
    assert capsys.readouterr().err.startswith("error: --task nope: no conf/task/nope.yaml")


@pytest.mark.parametrize("where", ["/proc/nope/x.json", "a-folder"])
def test_a_specification_that_cannot_be_written_is_one_line_and_nothing_is_left(tmp_path, capsys, where):
    (tmp_path / "a-folder").mkdir()
    out = Path(where) if where.startswith("/") else tmp_path / where
    assert dashboard.main(["--entity", "e", "--project", "p", "--dry-run", str(out)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(
        "error: cannot write /proc/nope (" if where.startswith("/") else f"error: cannot write {out} ("
    )
    assert "MB free" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-folder"]  # no temporary file left beside it


def test_a_specification_is_written_whole_over_the_last_one(tmp_path):
    out = tmp_path / "spec.json"
    out.write_text("an earlier specification")
    dry_run(tmp_path)
    assert json.loads(out.read_text())["workspace"] and sorted(p.name for p in tmp_path.iterdir()) == [
        "spec.json"
    ]
