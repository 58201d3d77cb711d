"""A record that never lies: a rerun never mixes configurations, never rewrites a finished
record without training, never duplicates or glues rows, never rotates a bad checkpoint over a
good one; non-finite values are plain JSON, and skipping them has limits.

The runs are the digits default, 20 steps (checkpoints every 5), in this process; a "kill" is a
KeyboardInterrupt raised as the loop is about to train a given step.

Longer than 300 lines: one subject, the record's integrity, on one shared fixture run.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import pytest
import torch
from conftest import CONF, compose
from omegaconf import OmegaConf

from src.engine import train
from src.engine.loop.trainer import NonFiniteLoss, Trainer
from src.engine.record import checkpoint
from src.engine.record.checkpoint import CheckpointError
from src.engine.record.files import read_metrics
from src.engine.record.identity import IdentityMismatch
from src.engine.record.session import RecordExists
from tasks.classification import ImageClassification

SHORT = [
    "trainer.max_steps=20",
    "trainer.checkpoint_every=5",
    "trainer.val_every=5",
    "trainer.log_every=5",
    "trainer.monitor_every=0",
]


def config(tmp_path: Path, *extra: str):
    return compose([*SHORT, *extra], tmp_path)


def run(tmp_path: Path, name: str, *extra: str, cfg=None) -> dict:
    return train(cfg if cfg is not None else config(tmp_path, *extra), tmp_path / name)


@contextlib.contextmanager
def stopped_before(step: int):
    """Runs inside the block are killed as they are about to train ``step``."""
    original = Trainer._optimizer_step

    def step_or_kill(self, batches):
        if self.state.step + 1 == step:
            raise KeyboardInterrupt
        return original(self, batches)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Trainer, "_optimizer_step", step_or_kill)
        yield


def killed(tmp_path: Path, name: str, step: int, *extra: str) -> Path:
    with stopped_before(step), pytest.raises(KeyboardInterrupt):
        run(tmp_path, name, *extra)
    return tmp_path / name


@contextlib.contextmanager
def nan_loss_at(*steps: int):
    """The training loss is NaN at ``steps`` (every step from the first, with a trailing ``...``)."""
    original, counter = ImageClassification.train_loss, {"step": 0}
    always_after = steps[-1] is Ellipsis
    steps = steps[:-1] if always_after else steps

    def planted(self, model, batch):
        counter["step"] += 1
        loss = original(self, model, batch)
        hit = counter["step"] in steps or (always_after and counter["step"] >= steps[-1])
        return loss * float("nan") if hit else loss

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ImageClassification, "train_loss", planted)
        yield counter


def files(folder: Path) -> dict[str, bytes]:
    """Every file of a record (superseded records and the lock aside), by relative path."""
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and "superseded" not in p.relative_to(folder).parts and p.name != ".lock"
    }


def comparable(folder: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "throughput"} for r in read_metrics(folder)]


def strict_json(path: Path):
    def refuse(constant):
        raise ValueError(f"{path} holds {constant}, which is not JSON")

    return json.loads(path.read_text(), parse_constant=refuse)


# -- 1. a rerun never resumes another configuration --------------------------------------------


def test_a_rerun_with_another_config_refuses_naming_the_keys_and_leaves_the_record(tmp_path):
    folder = killed(tmp_path, "run", 13)  # checkpoint at step 10, rows to step 10
    before = files(folder)
    edited = config(tmp_path)
    edited.optim.lr = 0.01  # as an edited group default or a --config-dir file would change it
    edited.trainer.val_every = 4
    with pytest.raises(IdentityMismatch) as error:
        run(tmp_path, "run", cfg=edited)
    message = str(error.value)
    assert "optim.lr: 0.002 → 0.01" in message and "trainer.val_every: 5 → 4" in message
    assert "trainer.resume=restart" in message and f"{folder / 'superseded'}/<n>/" in message
    assert files(folder) == before  # not a byte changed

    edited.trainer.resume = "never"
    with pytest.raises(RecordExists, match="already holds a record"):
        run(tmp_path, "run", cfg=edited)

    edited.trainer.resume = "restart"
    summary = run(tmp_path, "run", cfg=edited)
    assert summary["steps"] == 20 and summary["status"] == "completed"
    assert files(folder / "superseded" / "1") == before  # moved aside whole, never deleted
    assert OmegaConf.load(folder / "config.yaml").optim.lr == 0.01
    assert [r["step"] for r in read_metrics(folder) if r["split"] == "val"] == [0, 4, 8, 12, 16, 20]


def test_changed_code_resumes_with_one_warning_and_the_summary_lists_its_sessions(tmp_path, monkeypatch):
    killed(tmp_path, "run", 13)
    import src.engine.record.session as session_module

    first = session_module.code_version()
    monkeypatch.setattr(session_module, "code_version", lambda: {"git": "abc123-new", "source": "0" * 16})
    with pytest.warns(UserWarning, match=r"the code changed since checkpoint .*last\.pt was written") as seen:
        summary = run(tmp_path, "run")
    assert len([w for w in seen if "code changed" in str(w.message)]) == 1
    sessions = summary["sessions"]
    assert [s["code"] for s in sessions] == [first, {"git": "abc123-new", "source": "0" * 16}]
    assert (sessions[0]["from_step"], sessions[0]["to_step"]) == (0, 10)
    assert (sessions[1]["from_step"], sessions[1]["to_step"]) == (10, 20)


def test_another_data_folder_is_another_configuration(tmp_path):
    killed(tmp_path, "run", 13)
    with pytest.raises(IdentityMismatch, match=r"paths\.data_dir: \".*\" → \"/elsewhere/data\""):
        run(tmp_path, "run", "paths.data_dir=/elsewhere/data")


def test_checkpoint_and_numerics_settings_resume_the_same_record(tmp_path):
    """Keys that do not bear on the result (src/engine/record/identity.py) may change between sessions."""
    whole = run(tmp_path, "whole")
    killed(tmp_path, "run", 13)
    resumed = run(tmp_path, "run", "trainer.checkpoint_every=3", "trainer.num_workers=1")
    assert resumed["final"] == whole["final"]  # bit for bit: no bearing on the result
    assert comparable(tmp_path / "run") == comparable(tmp_path / "whole")


# -- 2. a session that does not train never rewrites a record ------------------------------------


def test_a_completed_record_is_left_as_it_is_by_a_rerun_that_cannot_resume(tmp_path):
    done = run(tmp_path, "run")
    folder = tmp_path / "run"
    for name in ("last.pt", "previous.pt"):
        (folder / "checkpoints" / name).write_bytes(b"unreadable")
    with open(folder / "metrics.jsonl", "a") as f:
        f.write('{"step": 21, "spl')  # torn
    damaged = files(folder)
    assert run(tmp_path, "run") == done  # complete: nothing to train, nothing read or written
    assert files(folder) == damaged

    with pytest.raises(IdentityMismatch, match=r"backbone\.model\.depth: 4 → 3"):
        run(tmp_path, "run", "backbone.model.depth=3")  # another architecture
    assert files(folder) == damaged and json.loads((folder / "summary.json").read_text()) == done


def test_a_failed_resume_appends_its_failure_and_keeps_the_summary(tmp_path, monkeypatch):
    folder = tmp_path / "run"
    with nan_loss_at(13), pytest.raises(NonFiniteLoss):
        run(tmp_path, "run")
    summary = (folder / "summary.json").read_bytes()
    assert json.loads(summary)["status"] == "failed" and json.loads(summary)["steps"] == 12

    original = ImageClassification.build_model

    def grown(self, backbone):  # the code changed the model since the checkpoint
        model = original(self, backbone)
        model.extra = torch.nn.Linear(2, 2)
        return model

    monkeypatch.setattr(ImageClassification, "build_model", grown)
    unfit = r"does not fit this model \(2 missing weights, e\.g\. extra\.weight\)"
    with pytest.raises(CheckpointError, match=unfit):
        run(tmp_path, "run")
    monkeypatch.undo()
    for name in ("last.pt", "previous.pt"):
        (folder / "checkpoints" / name).write_bytes(b"unreadable")
    with pytest.raises(CheckpointError, match="no readable checkpoint"):
        run(tmp_path, "run")

    assert (folder / "summary.json").read_bytes() == summary  # still what the session that trained wrote
    failures = [json.loads(line) for line in (folder / "failures.jsonl").read_text().splitlines()]
    kinds = [f["error"].split(":")[0] for f in failures]
    assert kinds == ["NonFiniteLoss", "CheckpointError", "CheckpointError"]
    assert [f["trained"] for f in failures] == [True, False, False]
    assert [f["step"] for f in failures] == [12, 10, 10] and all(f["code"]["source"] for f in failures)


# -- 3. rows: no duplicates after a kill, no glued lines ---------------------------------------


def test_a_run_killed_before_its_first_checkpoint_starts_its_rows_over(tmp_path):
    run(tmp_path, "whole", "trainer.checkpoint_every=100")
    folder = killed(tmp_path, "run", 13, "trainer.checkpoint_every=100")
    assert [r["step"] for r in read_metrics(folder)] == [0, 5, 5, 10, 10]  # val at 0 (val_at_start)
    assert not (folder / "checkpoints" / "last.pt").exists()  # best.pt may be: validation writes it
    run(tmp_path, "run", "trainer.checkpoint_every=100")
    assert comparable(folder) == comparable(tmp_path / "whole")  # rows 5-10 once, not twice


def test_a_torn_last_row_is_dropped_with_one_warning_and_never_glued(tmp_path):
    run(tmp_path, "whole")
    folder = killed(tmp_path, "run", 13)
    with open(folder / "metrics.jsonl", "a") as f:
        f.write('{"step": 12, "split": "tr')  # the last write of a killed session, cut short
    with pytest.warns(UserWarning, match=rf"{folder / 'metrics.jsonl'}: dropped a torn last line") as seen:
        run(tmp_path, "run")
    assert len([w for w in seen if "torn" in str(w.message)]) == 1
    assert comparable(folder) == comparable(tmp_path / "whole")


# -- 5. an unreadable checkpoint is set aside, never rotated over the good one --------------------


class Payload:
    """What a crafted checkpoint would carry: unpickling it runs a command."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_crafted_last_checkpoint_runs_nothing_and_is_never_rotated_into_previous(tmp_path):
    folder = killed(tmp_path, "run", 13)  # last.pt at step 10, previous.pt at step 5
    marker = tmp_path / "pwned"
    last = folder / "checkpoints" / "last.pt"
    torch.save({"model": Payload(marker)}, last)
    crafted = last.read_bytes()
    with stopped_before(13), pytest.warns(UserWarning) as seen, pytest.raises(KeyboardInterrupt):
        run(tmp_path, "run")  # resumes at step 5, saves step 10, is killed again
    (warning,) = [str(w.message) for w in seen if "unreadable checkpoint" in str(w.message)]
    assert "refused by torch's safe loader: Trying to load unsupported GLOBAL" in warning
    assert "moved to last.pt.corrupt; resuming from" in warning and "(step 5)" in warning
    assert not marker.exists()
    assert (folder / "checkpoints" / "last.pt.corrupt").read_bytes() == crafted
    assert checkpoint.load(folder / "checkpoints" / "previous.pt")["loop"]["step"] == 5  # the good one, kept
    assert checkpoint.load(last)["loop"]["step"] == 10


# -- 6. non-finite values and their limits ------------------------------------------------------


def test_non_finite_metrics_are_null_in_the_summary_and_the_rows_and_never_best(tmp_path, monkeypatch):
    original, calls = ImageClassification.eval_sums, {"n": 0}

    def nan_at_second_validation(self, model, batch):
        sums = original(self, model, batch)
        calls["n"] += 1
        if calls["n"] == 2:  # the validation at step 10 (one batch each)
            sums["val/acc"] = (torch.tensor(float("nan")), sums["val/acc"][1])
        sums["val/loss"] = (torch.tensor(float("inf")), sums["val/loss"][1])
        return sums

    monkeypatch.setattr(ImageClassification, "eval_sums", nan_at_second_validation)
    summary = run(tmp_path, "run", "task.eval_batch_size=1000")
    saved = strict_json(tmp_path / "run" / "summary.json")
    assert saved["final"]["val/loss"] is None and saved["nonfinite"]["final.val/loss"] == "inf"
    assert saved["best"]["step"] != 10 and summary["status"] == "completed"
    rows = [strict_json_line(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    val = [r for r in rows if r["split"] == "val"]
    assert all(r["val/loss"] is None and r["nonfinite"]["val/loss"] == "inf" for r in val)
    assert val[1]["val/acc"] is None and val[1]["nonfinite"]["val/acc"] == "nan"


def strict_json_line(line: str):
    return json.loads(line, parse_constant=lambda c: pytest.fail(f"{c} in metrics.jsonl"))


def test_skipping_non_finite_batches_stops_after_its_limit(tmp_path):
    with nan_loss_at(3, ...), pytest.raises(NonFiniteLoss) as error:
        run(tmp_path, "run", "trainer.nonfinite=skip", "trainer.checkpoint_every=1")
    message = str(error.value)
    assert "at step 13 (11 batches in a row and 11 in all skipped" in message
    assert "trainer.nonfinite_limit_consecutive=10" in message
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["error"].startswith("NonFiniteLoss")


def test_the_stop_message_names_what_resumes_the_kept_checkpoint(tmp_path):
    with nan_loss_at(13), pytest.raises(NonFiniteLoss) as error:
        run(tmp_path, "run")
    message = str(error.value)
    assert "checkpoints/last.pt (step 10)" in message
    assert "rerun the same command with trainer.nonfinite=skip (same folder" in message
    # ... and it does: the setting is neither in the folder's name nor in the run's identity
    exclude = OmegaConf.load(CONF / "config.yaml").hydra.job.config.override_dirname.exclude_keys
    assert {"trainer.nonfinite", "trainer.resume"} <= set(exclude)
    with nan_loss_at(3):  # the same batch again: the resumed session's third step is step 13
        summary = run(tmp_path, "run", "trainer.nonfinite=skip")
    assert summary["status"] == "completed" and summary["skipped_batches"] == 1
    assert summary["sessions"][-1]["from_step"] == 10
