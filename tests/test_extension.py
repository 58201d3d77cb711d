"""Extending the suite touches the files its README names and nothing else.

Each test copies the suite's code and configs into a temporary folder, adds one module and one
config there, and runs the real commands from that copy: the new part must show up in the
registry, in a run and in the tables without any other edit.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import ROOT

#: ``tests/attention/toy_variant.py``, registered: what a user writes as ``src/attention/scale_out.py``
TOY_VARIANT = (ROOT / "tests" / "attention" / "toy_variant.py").read_text() + "\n\nregister(ScaleOut)\n"

TOY_VARIANT_CONFIG = """\
_target_: src.attention.build
variant: scale_out
factor: 0.5
"""

TOY_TASK = '''
"""A toy task for the extension test: which quadrant of a noise image is brightest (4 classes)."""

import torch
from torch.utils.data import TensorDataset

from src.engine.task import ClassificationTask


class Quadrants(ClassificationTask):
    def __init__(self, img_size: int, in_chans: int, num_classes: int, size: int, **common) -> None:
        super().__init__(**common)
        self.img_size, self.size = img_size, size

    def datasets(self, data_dir):
        g = torch.Generator().manual_seed(0)
        x = torch.randn(self.size, 1, self.img_size, self.img_size, generator=g)  # (N, 1, H, W)
        half = self.img_size // 2
        y = torch.randint(0, 4, (self.size,), generator=g)
        rows, cols = (y // 2) * half, (y % 2) * half
        for i in range(self.size):
            x[i, :, rows[i] : rows[i] + half, cols[i] : cols[i] + half] += 1.5
        cut = self.size * 4 // 5
        return TensorDataset(x[:cut], y[:cut]), TensorDataset(x[cut:], y[cut:])
'''

TOY_TASK_CONFIG = """\
# @package _global_
defaults:
  - override /backbone: vit_digits
task:
  _target_: tasks.quadrants.Quadrants
  name: quadrants
  input: image
  img_size: 8
  in_chans: 1
  num_classes: 4
  size: 1000
  batch_size: 64
  eval_batch_size: 256
optim:
  lr: 2.0e-3
trainer:
  max_steps: 500
  val_every: 500
  monitor_every: 0
"""

FAST = ["trainer.max_steps=2", "trainer.val_every=2", "trainer.monitor_every=0", "trainer.progress=none"]


def copy_of_the_suite(tmp_path: Path) -> Path:
    """The suite's code and configs, without caches or outputs, under ``tmp_path/suite``."""
    root = tmp_path / "suite"
    for part in ("src", "tasks", "launch", "conf"):
        shutil.copytree(ROOT / part, root / part, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return root


def python(root: Path, *args: str, timeout: int = 300) -> str:
    """Run ``python *args`` from the copy (its ``src`` comes first on the path); its stdout."""
    env = {**os.environ, "PYTHONPATH": str(root), "WANDB_MODE": "disabled"}
    done = subprocess.run(
        [sys.executable, *args], cwd=root, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.fixture(scope="module")
def suite_with_toy_variant(tmp_path_factory) -> Path:
    root = copy_of_the_suite(tmp_path_factory.mktemp("variant"))
    (root / "src" / "attention" / "scale_out.py").write_text(TOY_VARIANT)
    (root / "conf" / "attn" / "scale_out.yaml").write_text(TOY_VARIANT_CONFIG)
    return root


def test_a_new_variant_module_is_registered_without_an_import_line(suite_with_toy_variant):
    shown = python(suite_with_toy_variant, "-c", "from src import attention; print(list(attention.VARIANTS))")
    names = eval(shown)  # a printed list of names
    assert names[-1] == "scale_out" and names[0] == "standard"  # after the ranked variants
    assert "scale_out" not in (ROOT / "src" / "attention" / "__init__.py").read_text()


def test_a_new_variant_trains_alone_and_in_a_composition(suite_with_toy_variant, tmp_path):
    root = suite_with_toy_variant
    out = tmp_path / "out"
    python(root, "-m", "src.run", "attn=scale_out", "attn.factor=0.25", f"paths.output_dir={out}", *FAST)
    python(
        root,
        "-m",
        "src.run",
        "attn=compose",
        "attn.parts=[cond_init,scale_out]",
        f"paths.output_dir={out}",
        *FAST,
    )
    summaries = {s["attn"]: s for s in map(json.loads, map(Path.read_text, out.rglob("summary.json")))}
    alone, both = summaries["scale_out"], summaries["cond_init+scale_out"]
    assert (
        alone["attn"] == "scale_out"
        and alone["attn_options"] == {"factor": 0.25}
        and alone["status"] == "completed"
    )
    assert both["attn"] == "cond_init+scale_out" and both["status"] == "completed"
    assert both["attn_options"] == {"cond_init": {"value": "per_head"}, "scale_out": {"factor": 0.5}}


def test_a_new_variant_joins_the_benchmark_table(suite_with_toy_variant, tmp_path):
    tiny = [
        "--model",
        "vit_tiny_patch16_224",
        "--img",
        "32",
        "--batch",
        "2",
        "--repeats",
        "3",
        "--warmup",
        "1",
    ]
    table = python(
        suite_with_toy_variant,
        "-m",
        "launch.tools.bench",
        *tiny,
        "--skip",
        "model",
        "memory",
        "overhead",
        "--out",
        str(tmp_path / "bench.json"),
    )
    rows = {line.split()[0] for line in table.splitlines() if line.strip()}
    assert {"standard", "scale_out", "spectral_svd"} <= rows


def test_a_new_task_is_one_module_and_one_config(tmp_path):
    root = copy_of_the_suite(tmp_path)
    (root / "tasks" / "quadrants.py").write_text(textwrap.dedent(TOY_TASK))
    (root / "conf" / "task" / "quadrants.yaml").write_text(TOY_TASK_CONFIG)
    out = tmp_path / "out"
    python(root, "-m", "src.run", "task=quadrants", "attn=compose", f"paths.output_dir={out}", timeout=600)
    (summary,) = [json.loads(p.read_text()) for p in out.rglob("summary.json")]
    assert (summary["task"], summary["backbone"], summary["status"]) == (
        "quadrants",
        "vit_digits",
        "completed",
    )
    assert summary["final"]["val/acc"] > 0.5  # chance is 0.25: the task's data reached the model
    refused = subprocess.run(
        [sys.executable, "-m", "src.run", "task=quadrants", "backbone=gpt_micro", f"paths.output_dir={out}"],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
    )
    assert refused.returncode == 2 and "Backbones for task=quadrants:" in refused.stderr
    assert "vit_digits" in refused.stderr.splitlines()[-1]
