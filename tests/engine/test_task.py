"""The Task base class: every task derives from it, its hooks do nothing by default, the
classification helper's numbers, and one path for a task that brings its own loop (the record,
summary and failures written as for the shared loop)."""

from __future__ import annotations

import importlib
import json

import pytest
import torch
import torch.nn.functional as F
from conftest import CONF, compose
from omegaconf import OmegaConf
from torch.utils.data import default_collate

from src.engine import train
from src.engine.record.files import read_metrics
from src.engine.task import ClassificationTask, Task, classification_sums

COMMON = dict(name="t", input="image", batch_size=2, eval_batch_size=2)


def test_every_task_of_the_config_groups_is_a_task():
    targets = {OmegaConf.load(p).task["_target_"] for p in sorted((CONF / "task").glob("*.yaml"))}
    assert len(targets) >= 10
    for target in targets:
        module, name = target.rsplit(".", 1)
        assert issubclass(getattr(importlib.import_module(module), name), Task), target


def test_the_hooks_do_nothing_unless_a_task_overrides_them():
    task = Task(**COMMON)
    items = [(torch.ones(2), 0), (torch.zeros(2), 1)]
    batch = task.collate_fn(items)
    assert all(torch.equal(a, b) for a, b in zip(batch, default_collate(items), strict=True))
    assert task.derived_metrics({"val/loss": 1.0}) == {} and task.tokens_per_sample is None
    assert task.after_backward(torch.nn.Linear(1, 1), 1, 0.5) is None and task.state_dict() is None
    assert (task.metric, task.metric_mode) == ("val/acc", "max")
    assert Task(**COMMON, metric="val/loss").metric == "val/loss"
    with pytest.raises(NotImplementedError, match="Task does not read data"):
        task.datasets(CONF)


def test_classification_sums_are_the_summed_loss_and_the_correct_count():
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0], [3.0, 0.0]], dtype=torch.bfloat16)
    labels = torch.tensor([0, 0, 0])
    sums = classification_sums(logits, labels)
    loss, n = sums["val/loss"]
    assert n == 3 and loss.dtype == torch.float32
    assert loss.item() == pytest.approx(F.cross_entropy(logits.float(), labels, reduction="sum").item())
    assert sums["val/acc"][0].item() == 2


def test_a_classification_task_feeds_all_but_the_labels_to_the_model():
    seen = []

    def model(*inputs):
        seen.append(len(inputs))
        return torch.tensor([[0.0, 5.0], [5.0, 0.0]])

    task = ClassificationTask(**COMMON)
    batch = (torch.zeros(2, 3), torch.ones(2, 3), torch.tensor([1, 0]))
    assert len(task.model_inputs(batch)) == 2
    assert task.eval_sums(model, batch)["val/acc"][0].item() == 2 and seen == [2]
    assert task.train_loss(model, batch).item() == pytest.approx(F.cross_entropy(model(), batch[-1]).item())


class OwnLoop(Task):
    """A task with its own loop, as detection's: it logs through the run's recorder."""

    def __init__(self, name, input, batch_size, eval_batch_size, metric, fail_at=0, **digits) -> None:
        super().__init__(name, input, batch_size, eval_batch_size, metric)
        self.fail_at = fail_at

    def fit(self, run) -> dict:
        run.recorder.start()
        for step in (1, 2):
            if step == self.fail_at:
                raise RuntimeError(f"stopped at {step}")
            run.recorder.log(step, "val", {"val/acc": 0.25 * step})
        return {"steps": 2, "final": {"val/acc": 0.5}, "best": {"val/acc": 0.5, "step": 2}}


def own_loop(tmp_path, *overrides: str):
    cfg = compose([f"task._target_={__name__}.OwnLoop", *overrides], tmp_path)
    return train(cfg, tmp_path / "run")


def test_a_task_with_its_own_loop_writes_the_record_as_the_shared_loop_does(tmp_path):
    summary = own_loop(tmp_path, "attn=spectral", "seed=3")
    saved = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert saved == summary and summary["status"] == "completed"
    what = (summary["task"], summary["attn"], summary["seed"], summary["steps"])
    assert what == ("digits", "spectral", 3, 2)
    assert summary["metric_mode"] == "max" and [s["to_step"] for s in summary["sessions"]] == [2]
    assert [(r["step"], r["val/acc"]) for r in read_metrics(tmp_path / "run")] == [(1, 0.25), (2, 0.5)]
    assert (tmp_path / "run" / "config.yaml").is_file()


def test_a_failure_in_its_own_loop_is_recorded_at_the_last_logged_step(tmp_path):
    with pytest.raises(RuntimeError, match="stopped at 2"):
        own_loop(tmp_path, "+task.fail_at=2")
    (failure,) = [json.loads(line) for line in (tmp_path / "run" / "failures.jsonl").read_text().splitlines()]
    assert failure["step"] == 1 and failure["trained"] and failure["error"] == "RuntimeError: stopped at 2"
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["steps"] == 1
