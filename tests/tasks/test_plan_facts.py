"""What a task tells a plan without its data (src.engine.task.Task's train_size, model_arguments,
example_inputs, planned_model) is what its data and its run then give: for every task whose data is
embedded or generated here, the planned sample has a real sample's shape and dtype, the planned model
(on the meta device) has the run's model's parameters (GLUE's: its WordPiece's asked-for vocabulary,
at least what it trains), and a stated training-set size is the length of the training set the task
reads."""

from __future__ import annotations

import pytest
import torch
from conftest import compose
from hydra.utils import instantiate

from launch.tools.flops import model_and_inputs
from src.engine.loop.model import build_model

EMBEDDED = ["digits", "lm_char", "modadd", "lra_listops_small", "glue_tiny_sst2", "glue_tiny_rte"]


@pytest.mark.parametrize("task_name", EMBEDDED)
def test_the_plans_facts_are_the_runs(task_name, tmp_path):
    cfg = compose([f"task={task_name}", f"paths.data_dir={tmp_path / 'data'}"], tmp_path / "out")
    task = instantiate(cfg.task)
    stated = task.train_size
    train, _ = task.datasets(tmp_path / "data")
    if stated is not None:
        assert stated == len(train)
    batch = task.collate_fn([train[0], train[1]])
    real = task.model_inputs(task.on_device(batch, train=False))
    planned = task.example_inputs()
    glue = task_name.startswith("glue")  # its sample is seq_len tokens, no padding: the mask left out
    assert len(planned) == len(real) - glue
    for one, two in zip(planned, real[: len(planned)], strict=True):
        assert one.shape[0] == 1 and one.dtype == two.dtype and one.ndim == two.ndim
        assert one.shape[1:] == two.shape[1:] or (glue and one.shape[1] >= two.shape[1])
    model = build_model(cfg, task)
    meta, _, note = model_and_inputs(cfg)
    assert note == ""
    planned_params, params = (sum(p.numel() for p in m.parameters()) for m in (meta, model))
    # GLUE's: the vocabulary asked for (vocab_size), which a WordPiece trained on a small corpus may not fill
    if glue:
        assert params <= planned_params <= 1.01 * params
    else:
        assert planned_params == params
    assert torch.device(next(meta.parameters()).device).type == "meta"
