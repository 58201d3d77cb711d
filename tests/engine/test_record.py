"""The record's files: one reader for the rows (torn and damaged lines), plain JSON for
non-finite values, whole-or-nothing writes, and a restart that moves the record aside."""

from __future__ import annotations

import errno
import json
import math

import pytest

from src.engine.record import files as record_module
from src.engine.record.files import RecordError, RunRecord, plain_json, read_metrics, write_atomic


def strict_json(text: str):
    """JSON as strict parsers read it: no NaN, no Infinity."""

    def refuse(constant):
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def write_rows(folder, rows, tail: str = "") -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + tail)


ROWS = [{"step": s, "split": "train", "train/loss": 1.0 / s} for s in (5, 10, 15)]


def test_a_torn_last_line_is_dropped_with_one_warning_naming_the_file(tmp_path):
    write_rows(tmp_path, ROWS, tail='{"step": 20, "split": "tr')  # power went at the last write
    with pytest.warns(UserWarning, match=rf"{tmp_path / 'metrics.jsonl'}: dropped a torn last line") as seen:
        assert read_metrics(tmp_path) == ROWS
    assert len(seen) == 1


def test_a_damaged_line_before_the_last_names_the_file_and_the_line(tmp_path):
    glued = '{"step": 20, "split": "tr{"step": 5, "split": "train"}'  # a torn row, then the next one
    write_rows(tmp_path, ROWS[:1], tail=glued + "\n" + json.dumps(ROWS[1]) + "\n")
    with pytest.raises(RecordError, match=rf"{tmp_path / 'metrics.jsonl'}:2 is damaged"):
        read_metrics(tmp_path)


def test_a_resumed_session_continues_the_rows_at_its_step_at_its_first_write(tmp_path):
    write_rows(tmp_path, ROWS, tail='{"step": 2')
    record = RunRecord(tmp_path)
    record.continue_after(10)
    assert (tmp_path / "metrics.jsonl").read_text().endswith('{"step": 2')  # nothing rewritten yet
    with pytest.warns(UserWarning, match="torn last line"):
        record.log(15, "train", {"train/loss": 0.5})
    assert read_metrics(tmp_path) == [*ROWS[:2], {"step": 15, "split": "train", "train/loss": 0.5}]
    assert record.touched


def test_non_finite_values_are_null_and_named(tmp_path):
    record = RunRecord(tmp_path)
    record.log(3, "val", {"val/loss": float("nan"), "val/ppl": float("inf"), "val/acc": 0.5})
    record.write_summary({"final": {"val/loss": float("-inf"), "val/acc": 0.5}, "status": "completed"})
    (row,) = [strict_json(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert row == {
        "step": 3,
        "split": "val",
        "val/loss": None,
        "val/ppl": None,
        "val/acc": 0.5,
        "nonfinite": {"val/loss": "nan", "val/ppl": "inf"},
    }
    summary = strict_json((tmp_path / "summary.json").read_text())
    assert summary["final"] == {"val/loss": None, "val/acc": 0.5}
    assert summary["nonfinite"] == {"final.val/loss": "-inf"}


def test_plain_json_takes_tensors_and_numpy_scalars():
    import numpy as np
    import torch

    value, bad = plain_json({"a": torch.tensor(float("nan")), "b": [np.float32(2.0), math.inf]})
    assert value == {"a": None, "b": [2.0, None]} and bad == {"a": "nan", "b.1": "inf"}


def test_a_failed_write_names_the_file_and_leaves_the_old_one_and_no_temporary(tmp_path, monkeypatch):
    target = tmp_path / "summary.json"
    target.write_text('{"status": "completed"}\n')

    def disk_full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(record_module.os, "fsync", disk_full)
    with pytest.raises(RecordError, match=rf"cannot write {target} \(No space left on device; \d+ MB free"):
        write_atomic(target, "{}")
    assert target.read_text() == '{"status": "completed"}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]


def test_a_restart_moves_the_record_aside_with_its_log_and_keeps_hydras_files(tmp_path):
    for name in ("config.yaml", "metrics.jsonl", "summary.json", "run.log", ".lock"):
        (tmp_path / name).write_text(name)
    (tmp_path / ".hydra").mkdir()
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "last.pt").write_text("weights")
    record = RunRecord(tmp_path)
    first = record.supersede()
    assert first == tmp_path / "superseded" / "1"
    moved = ["checkpoints", "config.yaml", "metrics.jsonl", "run.log", "summary.json"]  # the log: issue 39
    assert sorted(p.name for p in first.iterdir()) == moved
    assert (first / "checkpoints" / "last.pt").read_text() == "weights"
    assert (first / "run.log").read_text() == "run.log"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".hydra", ".lock", "superseded"]
    (tmp_path / "metrics.jsonl").write_text("again")
    assert record.supersede() == tmp_path / "superseded" / "2"
    assert (tmp_path / "superseded" / "1" / "metrics.jsonl").read_text() == "metrics.jsonl"  # untouched
