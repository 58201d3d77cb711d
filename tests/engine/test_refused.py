"""A run refused before its first step (bad input found once its folder was opened: a missing data
folder) leaves no record a report lists: the session removes what it wrote, never what was there;
the folders older versions left are passed over by the report, a crash before the first step is not."""

from __future__ import annotations

import json

import pytest
from conftest import compose
from omegaconf import OmegaConf

from launch.analysis.records import read_run, read_runs
from src.engine import train
from src.engine.record.session import Session
from src.errors import DataError

MISSING_DATA = ["task=imagenet", "backbone=vit_micro", "trainer.max_steps=1", "trainer.device=cpu"]


def refused_run(tmp_path, run_dir):
    empty = tmp_path / "no-data"
    empty.mkdir(exist_ok=True)
    cfg = compose([*MISSING_DATA, f"paths.data_dir={empty}"], tmp_path)
    hydra_files = {"config.yaml": OmegaConf.to_yaml(cfg), "overrides.yaml": "[]\n"}  # as src.run passes them
    with pytest.raises(DataError, match="missing data folder"):
        train(cfg, run_dir, hydra_files)


def test_a_refused_run_leaves_no_folder_and_keeps_what_was_there(tmp_path):
    fresh = tmp_path / "runs" / "fresh"
    refused_run(tmp_path, fresh)
    assert not fresh.exists()  # the session made the folder: none is left
    kept = tmp_path / "runs" / "kept"
    kept.mkdir(parents=True)
    (kept / "notes.txt").write_text("mine")
    (kept / ".hydra").mkdir()
    (kept / ".hydra" / "overrides.yaml").write_text("- mine\n")
    refused_run(tmp_path, kept)
    assert sorted(p.name for p in kept.iterdir()) == [".hydra", "notes.txt"]
    assert (kept / ".hydra" / "overrides.yaml").exists()  # there before: never removed
    assert read_runs([tmp_path / "runs"]) == []


def test_an_older_versions_refused_folder_is_not_listed_but_a_crash_is(tmp_path, monkeypatch):
    monkeypatch.setattr(Session, "withdraw", lambda self: [])  # what a session before this one left
    left = tmp_path / "runs" / "left"
    refused_run(tmp_path, left)
    assert (left / "config.yaml").exists() and (left / "failures.jsonl").exists()
    assert read_run(left).status == "refused" and read_runs([tmp_path / "runs"]) == []
    summary = json.loads((left / "summary.json").read_text())
    (left / "summary.json").write_text(json.dumps({**summary, "error": "RuntimeError: boom"}))
    (crashed,) = read_runs([tmp_path / "runs"])
    assert crashed.status == "failed to start" and crashed.error == "RuntimeError: boom"
