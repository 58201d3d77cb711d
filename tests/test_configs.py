"""src.configs composes as Hydra's main does: one job's config is the one ``python -m src.run --cfg job``
prints, and a multirun's grid is the list of jobs Hydra's own sweeper hands its launcher."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from conftest import QUIET, ROOT, run_cli
from omegaconf import OmegaConf

from src.configs import axes, compose, grid
from src.errors import ConfigError

#: A launcher that runs nothing: it writes the jobs Hydra's basic sweeper gives it, in their order.
#: Hydra instantiates launchers only from the ``hydra_plugins`` package.
RECORDING_LAUNCHER = """
import json
from pathlib import Path

from hydra.plugins.launcher import Launcher


class Recording(Launcher):
    def __init__(self, path: str) -> None:
        self.path = path

    def setup(self, *, hydra_context, task_function, config) -> None:
        pass

    def launch(self, job_overrides, initial_job_idx):
        Path(self.path).write_text(json.dumps([list(job) for job in job_overrides]))
        return []
"""


def hydras_jobs(arguments: list[str], tmp_path: Path) -> list[list[str]]:
    """The overrides of each job ``python -m src.run -m <arguments>`` launches, as its sweeper gives
    them to the launcher (hydra/launcher=recording, written here)."""
    plugins = tmp_path / "plugins" / "hydra_plugins"
    plugins.mkdir(parents=True)
    (plugins / "recording_launcher.py").write_text(textwrap.dedent(RECORDING_LAUNCHER))
    launcher = tmp_path / "conf" / "hydra" / "launcher" / "recording.yaml"
    launcher.parent.mkdir(parents=True)
    recorded = tmp_path / "jobs.json"
    launcher.write_text(f"_target_: hydra_plugins.recording_launcher.Recording\npath: {recorded}\n")
    hydra = [
        "hydra/launcher=recording",
        f"hydra.searchpath=[file://{tmp_path / 'conf'}]",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
    ]
    path = f"{ROOT}:{tmp_path / 'plugins'}"  # the recording launcher importable beside the suite
    done = run_cli(["-m", *arguments, *hydra], tmp_path, env={"PYTHONPATH": path})
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(recorded.read_text())


def test_the_grid_is_the_jobs_hydras_sweeper_launches(tmp_path):
    """experiment=paper/imagenet's sweeper params (4 backbones, glob(*) of the variants, 3 seeds), the
    command line's attn list replacing the experiment's, a value written as Hydra reads it (3e-3), a
    fixed key: the same jobs, in the same order, with the same strings."""
    arguments = [
        "experiment=paper/imagenet",
        "attn=standard,spectral",
        "optim.lr=3e-3,1e-2",
        "trainer.max_steps=3",
    ]
    cells = grid([*arguments, *QUIET])
    assert cells == hydras_jobs(arguments, tmp_path)
    assert len(cells) == 4 * 2 * 3 * 2
    assert {c[-3] for c in cells} == {"optim.lr=0.003", "optim.lr=0.01"}


def test_the_grid_expands_an_experiments_glob_over_every_variant(tmp_path):
    """attn: glob(*,exclude=compose): every file in conf/attn/ but compose.yaml, each a cell."""
    values, cfg = axes(["experiment=paper/imagenet"])
    variants = sorted(p.stem for p in (Path(__file__).parents[1] / "conf" / "attn").glob("*.yaml"))
    assert sorted(values["attn"]) == [v for v in variants if v != "compose"]
    assert cfg.sweep_name == "paper_imagenet" and "hydra" not in cfg
    assert len(grid(["experiment=paper/imagenet"])) == 4 * len(values["attn"]) * 3


@pytest.mark.parametrize(
    "arguments, refusal",
    [
        (["experiment=paper/imagenet,paper/lm"], "experiment=…: give one experiment"),
        (["task=digits", "optim.lr=interval(0.1,1)"], "optim.lr=interval(0.1,1): an interval is not a grid"),
        (["attn=precon,standard"], "attn=precon: no such option in conf/attn; did you mean precond?"),
    ],
)
def test_a_grid_hydra_cannot_expand_is_one_config_error(arguments, refusal):
    with pytest.raises(ConfigError) as refused:
        grid(arguments)
    assert str(refused.value).startswith(refusal)


@pytest.mark.parametrize(
    "overrides",
    [
        ["task=modadd", "attn=standard", "optim.lr=3e-3"],
        ["experiment=readings/digits", "reading=spectral_svd", "seed=4"],
    ],
)
def test_compose_is_the_config_src_run_prints(overrides, tmp_path):
    """Unresolved and without the hydra node, as ``python -m src.run … --cfg job`` prints it: the same
    YAML, key for key."""
    printed = run_cli(["--cfg", "job", *overrides], tmp_path)
    assert printed.returncode == 0, printed.stderr[-2000:]
    assert OmegaConf.to_yaml(compose([*overrides, *QUIET])) == printed.stdout


def test_compose_places_the_output_dir_and_keeps_the_hydra_node_on_request(tmp_path):
    cfg = compose(["task=modadd", "paths.output_dir=elsewhere"], tmp_path, hydra=True)
    assert cfg.paths.output_dir == str(tmp_path)  # output_dir wins over an override of it
    assert cfg.hydra.runtime.choices.task == "modadd" and "hydra" not in compose(["task=modadd"])
