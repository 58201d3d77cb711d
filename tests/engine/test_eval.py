"""Evaluating a checkpoint: ``best.pt`` kept by the task's direction, ``python -m src.eval``
reproducing the loop's own validation, test splits, and the test at the end of training."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch
from conftest import compose, main_in_process
from hydra.utils import instantiate
from smoke.lra import SMALL_LISTOPS, TINY, write_acl_imdb

from src.engine import train
from src.engine.loop import evaluation
from src.engine.loop.trainer import Trainer
from src.engine.record import checkpoint
from src.engine.record.files import read_metrics
from src.errors import ConfigError
from src.eval import main as eval_main
from tasks.classification import Digits
from tasks.lra import ListOpsSmall, Text

KEYS = {
    "split",
    "checkpoint",
    "checkpoint_file",
    "checkpoint_step",
    "identity",
    "record_identity",
    "overrides",
    "data_dir",
    "metric",
    "metric_mode",
    "metrics",
    "samples",
    "task",
    "wall_s",
    "time",
    "git",
}
#: (no validation at step 0: the scripted validations below are the loop's from the first val_every)
QUICK = ["trainer.log_every=1", "trainer.monitor_every=0", "trainer.threads=1", "trainer.val_at_start=false"]


def run(tmp_path: Path, name: str, *overrides: str) -> tuple[dict, Path]:
    cfg = compose([*QUICK, *overrides], tmp_path)
    return train(cfg, tmp_path / name), tmp_path / name


def script_validation(monkeypatch, values: list, weights: dict | None = None) -> None:
    """The loop's validations return ``values`` in turn (an exception is raised); ``weights``
    gets the model's weights at each validated step."""
    queue = iter(values)

    def scripted(self, model, prefix="val"):
        if weights is not None:
            weights[self.state.step] = {k: v.clone() for k, v in self.raw_model.state_dict().items()}
        value = next(queue)
        if isinstance(value, Exception):
            raise value
        return {"val/acc": value, "val/loss": 1.0}

    monkeypatch.setattr(Trainer, "evaluate", scripted)


def eval_cli(capsys, *args) -> tuple[int, str, str]:
    """``python -m src.eval <args>`` in this process: (exit status, stdout, stderr)."""
    return main_in_process(eval_main, capsys, *args)


@pytest.mark.parametrize("mode", ["max", "min"])
def test_best_pt_holds_the_best_validation_by_the_tasks_direction(tmp_path, monkeypatch, mode):
    values = [0.2, 0.5, 0.3, 0.4]
    best_step = 1 + values.index(max(values) if mode == "max" else min(values))
    monkeypatch.setattr(Digits, "metric_mode", mode)
    weights: dict = {}
    script_validation(monkeypatch, values, weights)
    summary, run_dir = run(
        tmp_path, "run", "trainer.max_steps=4", "trainer.val_every=1", "trainer.checkpoint_every=4"
    )
    folder = run_dir / "checkpoints"
    best = checkpoint.load(folder / "best.pt")
    assert best["step"] == summary["best"]["step"] == best_step
    assert best["value"] == values[best_step - 1] and best["metric"] == "val/acc"
    assert best["record"]["sessions"][-1]["to_step"] == best_step
    for key, tensor in weights[best_step].items():
        torch.testing.assert_close(best["model"][key], tensor, rtol=0, atol=0)
    # best.pt stays out of last.pt's rotation: one last.pt written, so no previous.pt
    assert checkpoint.load(folder / "last.pt")["loop"]["step"] == 4
    assert not (folder / "previous.pt").exists()


@pytest.mark.parametrize("resumed", [[0.15, 0.3], [0.15, 0.18]])
def test_a_resumed_run_improves_over_its_checkpoints_best_not_a_killed_sessions(
    tmp_path, monkeypatch, resumed
):
    """Killed at step 4 after a best (0.9) at step 3, past last.pt (step 2, best 0.2): the
    resumed session writes best.pt for validations that beat 0.2, never measuring against the
    killed 0.9; where none does, the stale best.pt stays and evaluation takes last.pt instead."""
    common = ["trainer.max_steps=4", "trainer.val_every=1", "trainer.checkpoint_every=2"]
    script_validation(monkeypatch, [0.1, 0.2, 0.9, RuntimeError("killed")])
    with pytest.raises(RuntimeError, match="killed"):
        run(tmp_path, "run", *common)
    best_path = tmp_path / "run" / "checkpoints" / "best.pt"
    assert checkpoint.load(best_path)["step"] == 3
    script_validation(monkeypatch, resumed)
    summary, _ = run(tmp_path, "run", *common)
    expected = {"step": 2, "val/acc": 0.2} if max(resumed) <= 0.2 else {"step": 4, "val/acc": 0.3}
    assert {k: summary["best"][k] for k in expected} == expected
    kept = checkpoint.load(best_path)  # never removed: overwritten by a better validation, or left
    assert (kept["step"], kept["value"]) == ((3, 0.9) if expected["step"] == 2 else (4, 0.3))
    notes = []
    opened = evaluation.open_checkpoint(tmp_path / "run", "best", notes.append, summary["best"]["step"])
    assert (opened.which, opened.path.name) == (
        ("last", "last.pt") if expected["step"] == 2 else ("best", "best.pt")
    )
    assert len(notes) == (expected["step"] == 2) and all("holds step 3" in n for n in notes)


def test_eval_of_a_finished_run_reproduces_the_loops_own_validation(tmp_path, capsys):
    summary, run_dir = run(tmp_path, "run", "trainer.max_steps=6", "trainer.val_every=2")
    record = {p: p.read_bytes() for p in (run_dir / "summary.json", run_dir / "metrics.jsonl")}
    code, out, err = eval_cli(capsys, run_dir, "split=val", "checkpoint=last")
    assert code == 0, err
    result = json.loads((run_dir / "eval-val.json").read_text())
    assert set(result) == KEYS
    assert result["metrics"] == summary["final"]  # exactly: the same code on the same weights
    assert (result["checkpoint"], result["checkpoint_step"], result["metric"]) == ("last", 6, "val/acc")
    cfg = compose([], tmp_path)
    assert result["samples"] == len(instantiate(cfg.task).eval_dataset(Path(cfg.paths.data_dir), "val"))
    assert out.count("\n") == 1 and str(run_dir / "eval-val.json") in out
    # best (the default): the validation row logged at the best step, reproduced
    assert eval_cli(capsys, run_dir)[0] == 0
    result = json.loads((run_dir / "eval-val.json").read_text())
    step = summary["best"]["step"]
    (row,) = [r for r in read_metrics(run_dir) if r["split"] == "val" and r["step"] == step]
    assert result["checkpoint_step"] == step and result["metrics"] == {k: row[k] for k in result["metrics"]}
    assert {p: p.read_bytes() for p in record} == record  # the record is never rewritten

    # test: the loop's own test at the end (trainer.test_after=last), reproduced
    tested = json.loads((run_dir / "eval-test.json").read_text())
    assert tested["metrics"] == summary["test"] and tested["checkpoint"] == "last"
    assert eval_cli(capsys, run_dir, "split=test", "checkpoint=last")[0] == 0
    assert json.loads((run_dir / "eval-test.json").read_text())["metrics"] == summary["test"]


def test_eval_of_a_split_the_task_lacks_is_refused_in_one_line(tmp_path, capsys):
    _, run_dir = run(tmp_path, "run", "trainer.max_steps=2", "trainer.val_every=2", "task.test_fraction=0")
    code, _, err = eval_cli(capsys, run_dir, "split=test")
    assert code == 2 and err.count("\n") == 1 and "no 'test' split" in err and "val" in err
    assert not (run_dir / "eval-test.json").exists()


def test_eval_refuses_a_folder_without_a_record_or_a_checkpoint_in_one_line(tmp_path, capsys):
    code, _, err = eval_cli(capsys, tmp_path / "nowhere")
    assert code == 2 and err.count("\n") == 1 and "no run folder" in err
    code, _, err = eval_cli(capsys, tmp_path)
    assert code == 2 and err.count("\n") == 1 and "no run record" in err
    (tmp_path / "config.yaml").write_text(
        json.dumps({"task": {"_target_": "tasks.classification.Digits"}})
    )  # JSON is YAML
    code, _, err = eval_cli(capsys, tmp_path, "no.such.key=1")
    assert code == 2 and "no.such.key is not a key" in err


def test_digits_without_its_test_split_is_val_only(tmp_path):
    assert instantiate(compose([], tmp_path).task).eval_splits == ("val", "test")
    task = instantiate(compose(["task.test_fraction=null"], tmp_path).task)
    assert task.eval_splits == ("val",)
    with pytest.raises(ConfigError, match="no 'test' split.*its splits are val"):
        task.eval_dataset(tmp_path, "test")


def listops_rows(path: Path) -> list[int]:
    with open(path, newline="") as f:
        return [int(row[1]) for row in list(csv.reader(f, delimiter="\t"))[1:] if row]


def test_listops_test_split_is_read_from_basic_test_tsv(tmp_path):
    sizes = {"num_train": 12, "num_val": 5, "num_test": 9, "min_length": 5, "max_length": 60}
    task = ListOpsSmall(
        generate=sizes, name="l", input="sequence", folder="lo", num_classes=10, max_length=60,
        pad_length=64, batch_size=4, eval_batch_size=4,
    )  # fmt: skip
    test, val = task.eval_dataset(tmp_path, "test"), task.eval_dataset(tmp_path, "val")
    assert test.labels.tolist() == listops_rows(tmp_path / "lo" / "basic_test.tsv")
    assert val.labels.tolist() == listops_rows(tmp_path / "lo" / "basic_val.tsv")
    assert (len(test), len(val)) == (sizes["num_test"], sizes["num_val"])


def test_imdb_val_is_its_test_split_as_in_lra(tmp_path):
    write_acl_imdb(tmp_path / "aclImdb", per_class=3)
    task = Text(
        name="t", input="sequence", folder=".", num_classes=2, max_length=64, pad_length=64,
        batch_size=2, eval_batch_size=2,
    )  # fmt: skip
    val, test = task.eval_dataset(tmp_path, "val"), task.eval_dataset(tmp_path, "test")
    assert val.labels.tolist() == test.labels.tolist() and len(val) == 6
    assert all(torch.equal(val[i][0], test[i][0]) for i in range(len(val)))


def test_test_after_best_evaluates_the_best_checkpoint_on_the_test_split(tmp_path, monkeypatch, capsys):
    data = tmp_path / "data"
    script_validation(monkeypatch, [0.2, 0.5, 0.3, 0.4])  # the best (step 2) is not the last
    summary, run_dir = run(
        tmp_path,
        "run",
        "task=lra_listops_small",
        *TINY,
        *SMALL_LISTOPS,
        f"paths.data_dir={data}",
        "trainer.max_steps=4",
        "trainer.val_every=1",
        "trainer.checkpoint_every=4",
        "trainer.test_after=best",
    )
    result = json.loads((run_dir / "eval-test.json").read_text())
    assert set(result) == KEYS and result["checkpoint"] == "best"
    assert result["checkpoint_step"] == summary["best"]["step"] == 2
    assert summary["test"] == result["metrics"] and set(result["metrics"]) == {"test/acc", "test/loss"}
    assert result["samples"] == len(listops_rows(data / "listops_small" / "basic_test.tsv"))
    monkeypatch.undo()
    # python -m src.eval builds the model afresh from the record: the same numbers
    code, _, err = eval_cli(capsys, run_dir, "split=test")
    assert code == 0, err
    again = json.loads((run_dir / "eval-test.json").read_text())
    assert again["metrics"] == result["metrics"] and again["checkpoint_step"] == 2


def test_a_copy_without_test_files_trains_to_the_end_and_says_how_to_test_later(tmp_path, caplog):
    from smoke.lm import HUB, prepare

    data = tmp_path / "data"
    prepare(data)
    for test_file in (data / "wikitext103").rglob("test-*.parquet"):
        test_file.unlink()
    summary, run_dir = run(
        tmp_path,
        "run",
        "task=lm_wikitext103",
        "backbone=gpt_micro",
        *HUB,
        f"paths.data_dir={data}",
        "trainer.max_steps=2",
        "trainer.val_every=2",
    )
    assert summary["status"] == "completed" and "test" not in summary
    assert not (run_dir / "eval-test.json").exists()
    (warning,) = [r.getMessage() for r in caplog.records if "trainer.test_after" in r.getMessage()]
    assert "missing WikiText-103 split 'test'" in warning and f"src.eval {run_dir} split=test" in warning
