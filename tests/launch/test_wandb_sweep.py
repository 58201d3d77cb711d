"""launch.wandb_sweep: the W&B grid is exactly the Hydra sweep of the same arguments."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import yaml
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from launch.wandb_sweep import main, sweep_config
from src.cli import config_loader

CONF = Path(__file__).resolve().parents[2] / "conf"


def hydra_jobs(experiment: str, arguments: list[str]) -> set[frozenset[str]]:
    """The override lists Hydra's basic sweeper runs for ``-m experiment=<experiment> <arguments>``:
    the experiment file's ``hydra.sweeper.params`` then the command line, split by Hydra itself."""
    params = OmegaConf.load(CONF / "experiment" / f"{experiment}.yaml").hydra.sweeper.params
    lines = [*(f"{k}={v}" for k, v in params.items()), f"experiment={experiment}", *arguments]
    parsed = OverridesParser.create(config_loader=config_loader()).parse_overrides(lines)
    (batch,) = BasicSweeper.split_arguments(parsed, None)
    return {frozenset(job) for job in batch}


def wandb_jobs(config: dict) -> set[frozenset[str]]:
    """The runs W&B's grid search makes of ``config``'s parameters, as ``key=value`` items."""
    params = {k: p["values"] if "values" in p else [p["value"]] for k, p in config["parameters"].items()}
    combos = itertools.product(*params.values())
    return {frozenset(f"{k}={v}" for k, v in zip(params, combo, strict=True)) for combo in combos}


@pytest.mark.parametrize(
    "experiment, arguments",
    [
        ("digits_variants", []),
        ("digits_variants", ["seed=0,1", "optim.lr=1e-3,2e-3", "trainer.max_steps=50"]),
        ("paper/lm", []),
        ("paper/glue", ["seed=0"]),
    ],
)
def test_the_wandb_grid_is_the_hydra_sweep(experiment, arguments):
    config = sweep_config([f"experiment={experiment}", *arguments])
    assert config["method"] == "grid" and config["parameters"].pop("logger") == {"value": "wandb"}
    assert wandb_jobs(config) == hydra_jobs(experiment, arguments)
    assert len(wandb_jobs(config)) > 1


def test_the_config_calls_src_run_with_hydra_items_and_the_tasks_metric(tmp_path):
    out = tmp_path / "sweep.yaml"
    assert main(["experiment=paper/lm", "--out", str(out)]) == 0
    config = yaml.safe_load(out.read_text())
    assert config["command"] == ["${env}", "python", "-m", "src.run", "${args_no_hyphens}"]
    assert (config["name"], config["metric"]) == ("paper_lm", {"name": "val/loss", "goal": "minimize"})


BAD = [["experiment=digits_variants,sandbox"], ["experiment=nope"], ["seed=interval(0,1)"]]


@pytest.mark.parametrize("bad", BAD)
def test_bad_input_is_one_line_and_status_2(bad, capsys):
    assert main(bad) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
