"""launch.plan asks each task for its facts: a task it has never seen (one module and one yaml, written
here into a temporary folder that Hydra searches) is planned with its own training-set size, model
arguments and sample shape, and ``launch/plan.py`` and ``launch/tools/flops.py`` name no task."""

from __future__ import annotations

import ast
import math
import textwrap
from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate

from launch.plan import main, plan
from launch.tools.flops import count_step, forward_backward
from src.configs import compose

ROOT = Path(__file__).resolve().parents[2]

#: The toy's facts, stated once in its module below and checked against an independent build here.
VOCAB, CLASSES, SEQ_LEN, TRAIN_SIZE, BATCH, EPOCHS = 37, 5, 48, 12_345, 50, 3

TOY_MODULE = f'''
"""A task no planner knows: the most frequent of {VOCAB} tokens in a sequence of {SEQ_LEN}."""

import torch

from src.engine.task import ClassificationTask


class MostFrequent(ClassificationTask):
    train_size = {TRAIN_SIZE}  # samples: the plan can learn it only from here

    def __init__(self, seq_len: int, **common) -> None:
        super().__init__(**common)
        self.seq_len = seq_len

    def model_arguments(self) -> dict:
        return {{"vocab_size": {VOCAB}, "num_classes": {CLASSES}, "max_positions": self.seq_len,
                "dual": False}}

    def example_inputs(self, device="cpu") -> tuple:
        ids = torch.zeros(1, self.seq_len, dtype=torch.long, device=device)
        return ids, torch.ones(1, self.seq_len, dtype=torch.bool, device=device)
'''

TOY_CONFIG = f"""\
# @package _global_
# The most frequent token (tests/launch/test_plan_new_task.py).
defaults:
  - override /backbone: lra_transformer
task:
  _target_: plan_toy_task.MostFrequent
  name: most_frequent
  input: sequence
  seq_len: {SEQ_LEN}
  batch_size: {BATCH}
  eval_batch_size: {BATCH}
trainer:
  max_epochs: {EPOCHS}
"""


@pytest.fixture
def toy(tmp_path, monkeypatch) -> list[str]:
    """The toy task's module on the import path and its yaml in a config folder Hydra searches:
    the overrides that select it."""
    (tmp_path / "plan_toy_task.py").write_text(textwrap.dedent(TOY_MODULE))
    (tmp_path / "conf" / "task").mkdir(parents=True)
    (tmp_path / "conf" / "task" / "most_frequent.yaml").write_text(TOY_CONFIG)
    monkeypatch.syspath_prepend(str(tmp_path))
    return ["task=most_frequent", f"hydra.searchpath=[file://{tmp_path / 'conf'}]"]


def test_a_new_task_is_planned_with_its_own_size_arguments_and_shapes(toy):
    """Steps from the toy's training-set size; parameters and FLOPs of the backbone built with the
    toy's vocabulary, classes and positions on its (ids, mask) sample, counted here apart."""
    rows = plan([*toy, "attn=standard,precond", "seed=0,1"])
    assert [(r.task, r.backbone, r.attn, r.runs) for r in rows] == [
        ("most_frequent", "lra_transformer", "standard", 2),
        ("most_frequent", "lra_transformer", "precond", 2),
    ]
    assert {r.steps for r in rows} == {EPOCHS * math.ceil(TRAIN_SIZE / BATCH)}  # 741
    cfg = compose([*toy, "attn=standard"])
    model = instantiate(
        cfg.backbone.model, vocab_size=VOCAB, num_classes=CLASSES, max_positions=SEQ_LEN, dual=False
    )
    ids, mask = torch.zeros(1, SEQ_LEN, dtype=torch.long), torch.ones(1, SEQ_LEN, dtype=torch.bool)
    flops, _ = count_step(lambda: forward_backward(model, (ids, mask)))
    standard, precond = rows
    assert standard.params == sum(p.numel() for p in model.parameters())
    assert standard.flops_per_step == BATCH * flops
    assert "not applied" not in precond.note and precond.flops_per_step >= standard.flops_per_step


def test_the_command_plans_the_new_task_and_refuses_a_batch_of_more_than_four_of_its_epochs(toy, capsys):
    assert main(["-m", *toy, "attn=standard", "seed=0,1,2"]) == 0
    gpu_table = capsys.readouterr().out.split("On this machine's CPU")[
        0
    ]  # a CPU-sized sweep: its CPU table after
    rows = [line for line in gpu_table.splitlines() if line.startswith("| most_frequent")]
    (cells,) = [[c.strip() for c in line.strip("|").split("|")] for line in rows]
    assert cells[:4] == ["most_frequent", "lra_transformer", "standard", "3"] and cells[7] == "741"
    assert main([*toy, "task.batch_size=50000"]) == 2  # 4 epochs of 12,345 samples is 49,380
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: the global batch 50,000") and "12,345 samples an epoch" in line


def names_a_task(path: Path, names: set[str]) -> set[str]:
    """The string constants of ``path`` that are a task's (or a tokenizer's) name."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value in names}


@pytest.mark.parametrize("module", ["plan.py", "tools/flops.py"])
def test_the_planner_names_no_task(module):
    """No table or branch keyed by a task (``conf/task``'s names) or a tokenizer: each task states
    its own facts (src.engine.task.Task's train_size, model_arguments, example_inputs, planned_model)."""
    names = {p.stem for p in (ROOT / "conf" / "task").glob("*.yaml")} | {"gpt2", "bpe", "bytes", "wordpiece"}
    assert "imagenet" in names and "glue_stsb" in names
    assert names_a_task(ROOT / "launch" / module, names) == set()
