"""Each task declares what one run needs on a cluster (its ``resources:`` node); hydra/launcher=slurm
submits at that size, an experiment or the command line overrides it, and a size that cannot keep
the recipe's global batch is refused before anything is submitted."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from conftest import CONF, QUIET, make_image_folder
from conftest import compose as compose_job
from omegaconf import OmegaConf

from launch.cluster.callbacks import check_world
from src.configs import compose
from src.engine.record.identity import Identity
from src.errors import ConfigError

TASKS = sorted(p.stem for p in (CONF / "task").glob("*.yaml"))
#: resources key -> the submitit launcher's option that reads it (conf/hydra/launcher/slurm.yaml)
LAUNCHER = {
    "nodes": "nodes",
    "gpus_per_node": "gpus_per_node",
    "cpus_per_task": "cpus_per_task",
    "mem_gb": "mem_gb",
    "time_min": "timeout_min",
}


def slurm_config(overrides: list[str], tmp_path: Path):
    """The config a sweep on SLURM composes, its hydra node included; uncapped by a partition's
    MaxTime, which a cluster this runs on could have (tests/launch/test_slurm_time.py tests the cap)."""
    return compose(
        ["hydra/launcher=slurm", "resources.max_time_min=null", *overrides, *QUIET], tmp_path, hydra=True
    )


def launcher_numbers(cfg) -> dict:
    launcher = OmegaConf.to_container(cfg.hydra.launcher, resolve=True)
    return {key: launcher[option] for key, option in LAUNCHER.items()}


@pytest.mark.parametrize("task", TASKS)
def test_slurm_submits_each_task_at_the_size_its_file_declares(task, tmp_path):
    declared = yaml.safe_load((CONF / "task" / f"{task}.yaml").read_text())["resources"]
    assert set(declared) == set(LAUNCHER)
    folder = [f"task.data_dir={make_image_folder(tmp_path) / 'imagenet'}"] if task == "imagefolder" else []
    cfg = slurm_config([f"task={task}", *folder], tmp_path)  # (imagefolder's recipe reads its folder)
    assert launcher_numbers(cfg) == declared
    assert cfg.hydra.launcher.tasks_per_node == declared["gpus_per_node"]  # one process per GPU
    check_world(cfg)  # every task's own size keeps its global batch


def test_an_experiment_and_then_the_command_line_override_the_task(tmp_path):
    lra = slurm_config(["experiment=paper/lra"], tmp_path)
    assert launcher_numbers(lra)["time_min"] == 1440  # the experiment's, over lra_listops' 360
    assert launcher_numbers(lra)["gpus_per_node"] == 1 and lra.task.batch_size == 32
    wider = slurm_config(
        ["experiment=paper/lra", "resources.gpus_per_node=4", "resources.time_min=30"], tmp_path
    )
    assert launcher_numbers(wider) == {**launcher_numbers(lra), "gpus_per_node": 4, "time_min": 30}
    assert wider.hydra.launcher.tasks_per_node == 4
    check_world(wider)  # 4 processes x 8 keep LRA's 32


def test_a_job_size_that_cannot_keep_the_global_batch_is_refused_before_submitting(tmp_path):
    cfg = slurm_config(["experiment=paper/lra", "resources.gpus_per_node=3"], tmp_path)
    with pytest.raises(ConfigError) as refused:
        check_world(cfg)
    message = str(refused.value)
    assert "\n" not in message and "3 processes cannot keep the global batch 32" in message
    assert "1, 2, 4, 8, 16, 32" in message and "resources.gpus_per_node" in message
    detection = slurm_config(["task=coco", "resources.gpus_per_node=3"], tmp_path)
    check_world(detection)  # detection's batch is per process (mmdetection's): any world


@pytest.mark.parametrize(
    "task, recorded",
    [
        ("digits task.test_fraction=null", "21e31fbfdb0e34b5"),
        ("lra_listops trainer.precision=fp32", "69ab905a574d1134"),
    ],
)
def test_resources_leave_the_identity_of_existing_runs_as_it_was(task, recorded, tmp_path):
    """The hashes single-process runs were recorded with before tasks declared resources (0573edb);
    the job's size is not in the identity, nor in the run folder's name. (ListOps's runs then were
    fp32; its recipe now trains in bf16, as its source does, so those runs are the fp32 override's.
    Digits's then had no test split: ``task.test_fraction=null`` is that split, and its identity.)"""
    name, *more = task.split()
    job = compose_job(
        [f"task={name}", *more, "paths.data_dir=/data", "resources.gpus_per_node=2"], Path("/out")
    )
    assert Identity.of(job).hash == recorded
    excluded = set(slurm_config([], tmp_path).hydra.job.config.override_dirname.exclude_keys)
    assert {f"resources.{key}" for key in LAUNCHER} <= excluded
