"""Every experiment file and every compatible task × backbone × attn composes and trains 2 steps
on tiny data in the real layout (see ``tests/smoke/``). Full-size backbones are marked slow.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import pkgutil
from pathlib import Path

import pytest
import smoke
from conftest import CONF, compose
from hydra.utils import instantiate

from src import attention
from src.engine import train
from src.engine.experiment import check_compatible, compatible_backbones
from src.engine.record import read_metrics

TWO_STEPS = [
    "trainer.max_steps=2",
    "trainer.val_every=2",
    "trainer.monitor_every=2",
    "trainer.log_every=1",
    "trainer.checkpoint_every=2",
    "trainer.eval_batches=1",
]
FAMILIES = [importlib.import_module(f"smoke.{m.name}") for m in pkgutil.iter_modules(smoke.__path__)]
SMOKE = {task: overrides for family in FAMILIES for task, overrides in family.OVERRIDES.items()}
# every task config, including one a family does not know (it trains as configured, on its own data)
TASKS = sorted(p.stem for p in (CONF / "task").glob("*.yaml"))
# where a family says so (``FULL_SIZE_TRAINS_ON``), full-size backbones train two steps on some of
# its tasks and only compose on the others: {task that only composes: the tasks they train on}
FULL_SIZE_TRAINS_ON = {
    task: family.FULL_SIZE_TRAINS_ON
    for family in FAMILIES
    if hasattr(family, "FULL_SIZE_TRAINS_ON")
    for task in family.OVERRIDES
    if task not in family.FULL_SIZE_TRAINS_ON
}


def missing_modules(family) -> list[str]:
    """The modules a family's optional stack needs (its ``REQUIRES``) that are not installed."""
    return [m for m in getattr(family, "REQUIRES", []) if not installed(m)]


def installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # its parent package is missing
        return False


# a task whose family's optional extra is not installed is skipped, naming what is missing
SKIPS = {
    task: [pytest.mark.skip(reason=f"not installed: {', '.join(missing)}")] if missing else []
    for family in FAMILIES
    for missing in [missing_modules(family)]
    for task in family.OVERRIDES
}


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("data")
    for family in FAMILIES:
        family.prepare(root)
    return root


def combinations(trained: bool = True):
    """Every compatible task × backbone × variant: those that train two steps (``trained``), or
    the full-size ones that only compose (see ``FULL_SIZE_TRAINS_ON``)."""
    for task in TASKS:
        overrides = SMOKE.get(task, [])
        task_cfg = compose([f"task={task}", *overrides], Path("unused")).task
        for backbone in compatible_backbones(task_cfg):
            backbone_cfg = compose([f"task={task}", f"backbone={backbone}"], Path("unused")).backbone
            full = backbone_cfg.scale == "full"
            if trained == (full and task in FULL_SIZE_TRAINS_ON):
                continue
            for variant in backbone_cfg.get("attn_variants") or attention.VARIANTS:  # those it takes
                yield pytest.param(
                    task,
                    backbone,
                    variant,
                    marks=([pytest.mark.slow] if full and trained else []) + SKIPS.get(task, []),
                    id=f"{task}-{backbone}-{variant}",
                )


def smoke_overrides(task: str, data_dir: Path) -> list[str]:
    return [f"task={task}", *SMOKE.get(task, []), *TWO_STEPS, f"paths.data_dir={data_dir}"]


def check_record(summary: dict, run_dir: Path) -> None:
    assert json.loads((run_dir / "summary.json").read_text()) == json.loads(json.dumps(summary, default=str))
    assert (
        summary["steps"] == 2 and summary["status"] == "completed" and summary["metric"] in summary["final"]
    )
    assert (run_dir / "checkpoints" / "last.pt").exists()
    rows = read_metrics(run_dir)
    assert {r["split"] for r in rows} == {"train", "val", "monitor"}


def drop_weights(run_dir: Path) -> None:
    """Delete a run's weight files, ours (``checkpoints/``) and mmengine's (``mmdet/iter_*.pth``),
    passed or failed: a full-size model's are gigabytes each, and the next combination needs the
    disk. The config and metrics of a failed run stay for reading."""
    for path in [*run_dir.rglob("*.pt"), *run_dir.rglob("*.pth")]:
        path.unlink(missing_ok=True)


@pytest.mark.parametrize("task, backbone, variant", list(combinations()))
def test_combination_trains_two_steps(task, backbone, variant, data_dir, tmp_path):
    cfg = compose([*smoke_overrides(task, data_dir), f"backbone={backbone}", f"attn={variant}"], tmp_path)
    try:
        summary = train(cfg, tmp_path / "run")
        check_record(summary, tmp_path / "run")
        assert (summary["task"], summary["backbone"], summary["attn"]) == (task, backbone, variant)
    finally:
        drop_weights(tmp_path / "run")


@pytest.mark.parametrize("task, backbone, variant", list(combinations(trained=False)))
def test_full_size_combination_composes(task, backbone, variant, data_dir, tmp_path):
    """The full-size decoders on the hub LM tasks: the config composes and passes the
    compatibility check, the variant builds with its options, and the same backbone and
    variant train two steps on the family's embedded task (``test_combination_trains_two_steps``)."""
    cfg = compose([*smoke_overrides(task, data_dir), f"backbone={backbone}", f"attn={variant}"], tmp_path)
    check_compatible(cfg)
    assert instantiate(cfg.attn).name == variant
    assert (cfg.task.name, cfg.backbone.name, cfg.backbone.scale) == (task, backbone, "full")
    for other in FULL_SIZE_TRAINS_ON[task]:
        assert backbone in compatible_backbones(compose([f"task={other}"], tmp_path).task)


def experiments():
    """Every experiment file; those whose backbone is full-size are marked slow."""
    for path in sorted((CONF / "experiment").glob("**/*.yaml")):
        name = str(path.relative_to(CONF / "experiment").with_suffix(""))
        cfg = compose([f"experiment={name}"], Path("unused"))
        full = cfg.backbone.scale == "full"
        yield pytest.param(
            name, marks=([pytest.mark.slow] if full else []) + SKIPS.get(cfg.task.name, []), id=name
        )


@pytest.mark.parametrize("experiment", list(experiments()))
def test_experiment_composes_and_trains_two_steps(experiment, data_dir, tmp_path):
    task = compose([f"experiment={experiment}"], tmp_path).task.name
    cfg = compose([*smoke_overrides(task, data_dir), f"experiment={experiment}"], tmp_path)
    try:
        check_record(train(cfg, tmp_path / "run"), tmp_path / "run")
    finally:
        drop_weights(tmp_path / "run")
