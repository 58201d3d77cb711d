"""Every experiment file and every compatible task × backbone × attn composes and trains 2 steps
on tiny data in the real layout (digits from scikit-learn, ImageNet as a generated ImageFolder).
"""

from __future__ import annotations

import json

import pytest
from conftest import CONF, compose
from omegaconf import OmegaConf

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
TINY_IMAGENET = [
    "task=imagenet",
    "task.img_size=32",
    "task.batch_size=4",
    "task.eval_batch_size=4",
    "task.num_classes=3",
    "trainer.num_workers=0",
]
TASK_OVERRIDES = {"digits": [], "imagenet": TINY_IMAGENET}
BASE = {"vit_base", "deit_base", "swin_base", "xcit_medium", "davit_base"}


def combinations():
    for task, extra in TASK_OVERRIDES.items():
        task_cfg = OmegaConf.create({"input": "image", "img_size": 32 if extra else 8})
        for backbone in compatible_backbones(task_cfg):
            for variant in attention.VARIANTS:
                marks = [pytest.mark.slow] if backbone in BASE else []
                yield pytest.param(task, backbone, variant, marks=marks, id=f"{task}-{backbone}-{variant}")


def check_record(run_dir, steps: int = 2) -> dict:
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == steps and summary["status"] == "completed"
    assert summary["metric"] in summary["final"] and (run_dir / "checkpoints" / "last.pt").exists()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert {r["split"] for r in rows} == {"train", "val", "monitor"}
    return summary


@pytest.mark.parametrize("task, backbone, variant", list(combinations()))
def test_combination_trains_two_steps(task, backbone, variant, image_folder, tmp_path):
    cfg = compose(
        [
            *TASK_OVERRIDES[task],
            f"backbone={backbone}",
            f"attn={variant}",
            *TWO_STEPS,
            f"paths.data_dir={image_folder}",
        ],
        tmp_path,
    )
    summary = check_record_after(train(cfg, tmp_path / "run"), tmp_path / "run")
    assert (summary["task"], summary["backbone"], summary["attn"]) == (task, backbone, variant)


def check_record_after(summary: dict, run_dir) -> dict:
    assert check_record(run_dir) == json.loads(json.dumps(summary, default=str))
    return summary


@pytest.mark.parametrize("experiment", sorted(p.stem for p in (CONF / "experiment").glob("**/*.yaml")))
def test_experiment_composes_and_trains_two_steps(experiment, image_folder, tmp_path):
    cfg = compose([f"experiment={experiment}", *TWO_STEPS, f"paths.data_dir={image_folder}"], tmp_path)
    if cfg.task.name == "imagenet":
        cfg = compose(
            [f"experiment={experiment}", *TINY_IMAGENET, *TWO_STEPS, f"paths.data_dir={image_folder}"],
            tmp_path,
        )
    check_record_after(train(cfg, tmp_path / "run"), tmp_path / "run")
