"""Extending the suite touches the files its README names and nothing else.

Each test copies the suite's code and configs into a temporary folder, adds one module and one
config there, and runs the real commands from that copy: the new part must show up in the
registry, in a run and in the tables without any other edit.
"""

from __future__ import annotations

import csv
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


@pytest.mark.minutes(0.4)
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


@pytest.mark.minutes(0.5)
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


#: a few steps at a high rate without warm-up: cheap, and the seeds' finals differ
PAIRED = [
    *("trainer.max_steps=30", "trainer.val_every=10", "trainer.monitor_every=0", "trainer.progress=none"),
    *("optim.lr=1e-2", "sched.warmup_steps=0"),
]


@pytest.mark.minutes(0.6)
def test_a_new_variant_gets_its_paired_effect_interval_and_verdict_against_standard(
    suite_with_toy_variant, tmp_path
):
    """The toy variant trained beside ``standard`` on three seeds of digits: its row of results.csv
    and results.json carries the effect, the 95% interval, the paired seeds, δ and the verdict that
    scipy's paired t-test gives on the seeds' finals read from the run folders themselves."""
    from scipy import stats

    root, out, report = suite_with_toy_variant, tmp_path / "out", tmp_path / "report"
    python(
        root,
        "-m",
        "src.run",
        "-m",
        "attn=standard,scale_out",
        "seed=0,1,2",
        f"paths.output_dir={out}",
        *PAIRED,
    )
    python(root, "-m", "launch.analysis.report", str(out), "--out", str(report), "--margin", "0.05")

    summaries = [json.loads(p.read_text()) for p in out.rglob("summary.json")]
    # the report's numbers: test numbers, since every run of digits has one (trainer.test_after)
    final = {(s["attn"], s["seed"]): s["test"]["test/acc"] for s in summaries}
    mine, theirs = ([final[attn, seed] for seed in (0, 1, 2)] for attn in ("scale_out", "standard"))
    diffs = [a - b for a, b in zip(mine, theirs, strict=True)]
    assert len(set(diffs)) > 1, diffs  # a spread to test: the setting still separates the seeds
    paired = stats.ttest_rel(mine, theirs)
    low, high = paired.confidence_interval(0.95)
    inside = paired.confidence_interval(0.90)  # TOST at 5%: the 90% interval inside ±δ
    if stats.ttest_rel(mine, theirs, alternative="greater").pvalue < 0.025:
        expected = "better"
    elif stats.ttest_rel(mine, theirs, alternative="less").pvalue < 0.025:
        expected = "worse"
    elif -0.05 < inside.low and inside.high < 0.05:
        expected = "equivalent"
    else:
        expected = "inconclusive"

    with open(report / "results.csv", newline="") as f:
        from_csv = [row for row in csv.DictReader(f) if row["kind"] == "group"]
    from_json = [row for row in json.loads((report / "results.json").read_text()) if row["kind"] == "group"]
    for rows, number in ((from_csv, float), (from_json, lambda x: x)):
        (toy,) = [r for r in rows if r["attn"] == "scale_out"]
        assert number(toy["effect"]) == pytest.approx(sum(diffs) / 3, abs=1e-12)
        assert number(toy["ci_low"]) == pytest.approx(low, abs=1e-12)
        assert number(toy["ci_high"]) == pytest.approx(high, abs=1e-12)
        assert (int(toy["n_paired"]), number(toy["margin"]), toy["verdict"]) == (3, 0.05, expected)
        (base,) = [r for r in rows if r["attn"] == "standard"]
        assert base["effect"] in ("", None) and base["verdict"] in ("", None)  # the baseline itself
    text = (report / "report.md").read_text()
    section = text.split("## Effects against `standard`")[1].split("\n## ")[0]
    (row,) = [line for line in section.splitlines() if "scale_out" in line]
    assert row.startswith("| digits | scale_out | vit_digits |") and "| 3 |" in row
    assert f"**{expected}**" in row
    assert (report / "forest_digits.png").read_bytes()[:4] == b"\x89PNG"
    assert (report / "differences_digits_vit_digits.png").read_bytes()[:4] == b"\x89PNG"
