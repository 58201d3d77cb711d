"""GLUE fine-tuning: the task's metrics, its start from a checkpoint or from scratch, the pipeline's
resolver, and ``experiment=glue_tiny`` end to end (pretraining, two fine-tunings, the report's GLUE
section), each fine-tuned task beating chance by more than its dev set's sampling error."""

from __future__ import annotations

import json
import logging
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import compose, run_cli
from glue_fixtures import write_official
from hydra.utils import instantiate
from sklearn.metrics import f1_score, matthews_corrcoef

from src import resolvers
from src.errors import ConfigError

TINY = [
    "task.seq_len=32",
    "task.vocab_size=200",
    "backbone=crammed_bert_micro",
    "backbone.model.pretrained=null",
]


def glue_task(name: str, data_dir: Path, tmp_path: Path):
    cfg = compose([f"task={name}", *TINY, f"paths.data_dir={data_dir}"], tmp_path)
    task = instantiate(cfg.task)
    return task, task.datasets(data_dir), cfg


@pytest.fixture(scope="module")
def glue_files(tmp_path_factory) -> Path:
    return write_official(tmp_path_factory.mktemp("data")).parent


def evaluate(task, model, dataset) -> dict[str, float]:
    """One validation as the loop runs it: sums over batches, then the derived metrics."""
    batch = task.collate_fn([dataset[i] for i in range(len(dataset))])
    with torch.no_grad():
        sums = task.eval_sums(model, batch)
    means = {k: float(total) / count for k, (total, count) in sums.items()}
    return {**means, **task.derived_metrics(means)}


class Constant(torch.nn.Module):
    """Class logits that predict ``labels`` (the test's choice) whatever the input."""

    def __init__(self, predictions: torch.Tensor, classes: int) -> None:
        super().__init__()
        self.logits = torch.nn.functional.one_hot(predictions, classes).float() * 5

    def forward(self, ids, pad_mask):
        return self.logits[: len(ids)]


def test_mnli_reports_matched_and_mismatched_accuracy_in_one_validation(glue_files, tmp_path):
    task, (_, dev), _ = glue_task("glue_mnli", glue_files, tmp_path)
    labels, groups = torch.as_tensor(dev.labels), torch.as_tensor(dev.groups)
    assert set(groups.tolist()) == {0, 1}  # both dev sets, in order
    predictions = torch.where(groups == 0, labels, (labels + 1) % 3)  # right on matched, wrong on mismatched
    metrics = evaluate(task, Constant(predictions, 3), dev)
    assert metrics["val/acc"] == 1.0 and metrics["val/acc_mm"] == 0.0


@pytest.mark.parametrize("name, key", [("glue_cola", "val/matthews"), ("glue_mrpc", "val/f1")])
def test_the_official_metric_is_scikit_learns_on_the_whole_dev_set(name, key, glue_files, tmp_path):
    task, (_, dev), _ = glue_task(name, glue_files, tmp_path)
    labels = torch.as_tensor(dev.labels)
    predictions = labels.clone()
    predictions[::3] = 1 - predictions[::3]  # some wrong
    metrics = evaluate(task, Constant(predictions, 2), dev)
    official = matthews_corrcoef if key == "val/matthews" else f1_score
    assert metrics[key] == pytest.approx(official(labels.numpy(), predictions.numpy()))
    assert task.metric == key and metrics["val/loss"] > 0


def test_stsb_is_a_regression_with_one_output_and_squared_error(glue_files, tmp_path):
    task, (train, dev), cfg = glue_task("glue_stsb", glue_files, tmp_path)
    model = task.build_model(cfg.backbone).eval()  # no dropout: two passes agree
    assert model.head.out_features == 1 and dev.labels.dtype == np.float32
    batch = task.collate_fn([train[i] for i in range(4)])
    outputs = model(batch[0], batch[1])[:, 0]
    assert task.train_loss(model, batch).item() == pytest.approx(((outputs - batch[2]) ** 2).mean().item())


def test_without_a_checkpoint_it_says_so_in_one_warning_line(glue_files, tmp_path, caplog):
    task, _, cfg = glue_task("glue_rte", glue_files, tmp_path)
    with caplog.at_level(logging.WARNING):
        task.prepare_model(task.build_model(cfg.backbone))
    (line,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "random initialisation" in line and "\n" not in line


def test_a_missing_checkpoint_is_one_error_naming_it(glue_files, tmp_path):
    cfg = compose(["task=glue_rte", *TINY[:-1], "backbone.model.pretrained=no/last.pt"], tmp_path)
    with pytest.raises(ConfigError, match="backbone.model.pretrained=no/last.pt: no such checkpoint"):
        instantiate(cfg.task).datasets(glue_files)


def test_the_pretraining_run_is_the_sibling_of_the_same_command():
    multirun = "out/multirun/glue_tiny/glue_tiny_rte/crammed_bert_micro/standard/seed=2,experiment=glue_tiny"
    assert resolvers.sibling_run(multirun, "mlm_tiny", 2) == multirun.replace("glue_tiny_rte", "mlm_tiny")
    single = "/x/outputs/runs/glue_cola/crammed_bert/standard/seed=3"
    assert resolvers.sibling_run(single, "mlm", 0) == "/x/outputs/runs/mlm/crammed_bert/standard/seed=0"
    with pytest.raises(ValueError, match="not a run folder"):
        resolvers.sibling_run("/x/outputs/elsewhere/a/b", "mlm", 0)
    assert resolvers.pretrained_by("mlm", 0, "mlm") is None  # the pretraining run itself
    with pytest.raises(ValueError, match="set backbone.model.pretrained"):  # outside a Hydra run
        resolvers.pretrained_by("mlm", 0, "glue_cola")


@pytest.mark.slow
@pytest.mark.minutes(1.3)
def test_glue_tiny_pretrains_fine_tunes_and_beats_chance_on_each_task(tmp_path):
    result = run_cli(
        ["-m", "experiment=glue_tiny", "attn=standard", "seed=0", "paths.data_dir=data"],
        cwd=tmp_path,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    sweep = tmp_path / "outputs" / "multirun" / "glue_tiny"
    (pretrained,) = sweep.glob("mlm_tiny/*/standard/seed=0,*/checkpoints/last.pt")
    for task in ("glue_tiny_sst2", "glue_tiny_rte"):
        (run,) = sweep.glob(f"{task}/*/standard/seed=0,*/")
        summary = json.loads((run / "summary.json").read_text())
        config = (run / "config.yaml").read_text()
        assert f"pretrained: {pretrained}" in config  # fine-tuned from the sibling pretraining run
        chance = 0.5 + 3 * math.sqrt(0.25 / 400)  # 400 balanced dev examples: 3 sampling sigmas above 0.5
        assert summary["final"]["val/acc"] > chance, (task, summary["final"])
    out = subprocess.run(
        [sys.executable, "-m", "launch.analysis.report", str(sweep), "--out", str(tmp_path / "report")],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert out.returncode == 0, out.stderr[-2000:]
    section = (tmp_path / "report" / "report.md").read_text().split("## GLUE")[1]
    assert (
        "| glue_tiny | crammed_bert_micro | standard |" in section
        and "rte:accuracy, sst2:accuracy" in section
    )
