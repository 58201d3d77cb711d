"""Every experiment file and every compatible task × backbone × attn composes and trains 2 steps
on tiny data in the real layout (see ``tests/smoke/``). Full-size backbones are marked slow.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
from pathlib import Path

import pytest
import smoke
from conftest import CONF, compose

from src import attention
from src.engine import train
from src.engine.experiment import compatible_backbones

TWO_STEPS = [
    "trainer.max_steps=2",
    "trainer.val_every=2",
    "trainer.monitor_every=1",
    "trainer.log_every=1",
    "trainer.checkpoint_every=2",
    "trainer.eval_batches=1",
]
FAMILIES = [importlib.import_module(f"smoke.{m.name}") for m in pkgutil.iter_modules(smoke.__path__)]
SMOKE = {task: overrides for family in FAMILIES for task, overrides in family.OVERRIDES.items()}


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("data")
    for family in FAMILIES:
        family.prepare(root)
    return root


def test_every_task_has_smoke_overrides():
    assert sorted(SMOKE) == sorted(p.stem for p in (CONF / "task").glob("*.yaml"))


def combinations():
    for task, overrides in sorted(SMOKE.items()):
        task_cfg = compose([f"task={task}", *overrides], Path("unused")).task
        for backbone in compatible_backbones(task_cfg):
            full = compose([f"task={task}", f"backbone={backbone}"], Path("unused")).backbone.scale == "full"
            for variant in attention.VARIANTS:
                yield pytest.param(
                    task,
                    backbone,
                    variant,
                    marks=[pytest.mark.slow] if full else [],
                    id=f"{task}-{backbone}-{variant}",
                )


def smoke_overrides(task: str, data_dir: Path) -> list[str]:
    return [f"task={task}", *SMOKE[task], *TWO_STEPS, f"paths.data_dir={data_dir}"]


def check_record(summary: dict, run_dir: Path) -> None:
    assert json.loads((run_dir / "summary.json").read_text()) == json.loads(json.dumps(summary, default=str))
    assert (
        summary["steps"] == 2 and summary["status"] == "completed" and summary["metric"] in summary["final"]
    )
    assert (run_dir / "checkpoints" / "last.pt").exists()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert {r["split"] for r in rows} == {"train", "val", "monitor"}


@pytest.mark.parametrize("task, backbone, variant", list(combinations()))
def test_combination_trains_two_steps(task, backbone, variant, data_dir, tmp_path):
    cfg = compose([*smoke_overrides(task, data_dir), f"backbone={backbone}", f"attn={variant}"], tmp_path)
    summary = train(cfg, tmp_path / "run")
    check_record(summary, tmp_path / "run")
    assert (summary["task"], summary["backbone"], summary["attn"]) == (task, backbone, variant)


@pytest.mark.parametrize(
    "experiment",
    sorted(
        str(p.relative_to(CONF / "experiment").with_suffix(""))
        for p in (CONF / "experiment").glob("**/*.yaml")
    ),
)
def test_experiment_composes_and_trains_two_steps(experiment, data_dir, tmp_path):
    task = compose([f"experiment={experiment}"], tmp_path).task.name
    cfg = compose([*smoke_overrides(task, data_dir), f"experiment={experiment}"], tmp_path)
    summary = train(cfg, tmp_path / "run")
    check_record(summary, tmp_path / "run")
