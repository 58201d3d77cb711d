"""A W&B Sweeps config from a Hydra sweep: ``python -m launch.wandb_sweep experiment=… [key=a,b …]``.

    python -m launch.wandb_sweep experiment=digits_variants > sweep.yaml
    wandb sweep sweep.yaml        # prints the sweep id
    wandb agent ENTITY/PROJECT/ID # each agent runs: python -m src.run <one job's overrides>

The grid is the one ``python -m src.run -m <the same arguments>`` would run: the experiment's
``hydra.sweeper.params`` and the command line's items, a later one replacing an earlier one of the
same key, as Hydra's basic sweeper combines them; a choice list (``seed=0,1,2``), a range or a
``glob(…)`` of a config group is expanded to its values, each written as Hydra would pass it. Each
parameter is one W&B parameter (``values``, or ``value`` for a fixed one), ``method: grid``, and
the command calls ``python -m src.run ${args_no_hyphens}`` (``key=value`` items, Hydra's syntax)
with ``logger=wandb``; the metric is the task's main one. W&B's agent starts each run; the run's
W&B id is the agent's (:func:`src.engine.record.tracking.new_run_id`), so the sweep holds it.
Every run of the grid is checked as ``python -m src.run`` checks it before any work, so a spec is
never written whose runs the agents would all refuse. Bad input is one ``error: …`` line and
exit status 2.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path
from typing import Any

import yaml

from src.cli import check_selections, config_loader
from src.command import command_parser, run_command
from src.engine.record.files import write_atomic
from src.errors import ConfigError


def grid(arguments: list[str]) -> tuple[dict[str, list[str]], Any]:
    """``{key: [value, …]}`` of the Hydra sweep ``arguments`` (with the experiment's
    ``hydra.sweeper.params`` first, as Hydra's basic sweeper), in Hydra's order, and the config the
    fixed items compose (for the sweep's name and metric)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.types import RunMode

    loader = config_loader()
    parser = OverridesParser.create(config_loader=loader)
    given = parser.parse_overrides(arguments)
    fixed = [o.input_line for o in given if not o.is_sweep_override()]
    if any(o.get_key_element() == "experiment" and o.is_sweep_override() for o in given):
        raise ConfigError("experiment=…: give one experiment (a W&B sweep is one grid)")
    cfg = loader.load_configuration("config", overrides=fixed, run_mode=RunMode.RUN)
    params = cfg.hydra.sweeper.get("params") or {}
    overrides = parser.parse_overrides([*(f"{k}={v}" for k, v in params.items()), *arguments])
    values: dict[str, list[str]] = {}
    for override in overrides:
        key = override.get_key_element()
        if override.is_sweep_override():
            if not override.is_discrete_sweep():
                raise ConfigError(f"{override.input_line}: an interval is not a grid; give its values")
            values[key] = list(override.sweep_string_iterator())
        else:
            values[key] = [override.get_value_element_as_str()]
    return values, cfg


def check_runs(values: dict[str, list[str]]) -> None:
    """Every run of the grid passes what ``python -m src.run`` checks before any work
    (:func:`launch.plan.check_job`; each seed's range apart, since a seed changes nothing else),
    so that no spec is written whose runs every agent would refuse (``task.batch_size=0``)."""
    from launch.plan import check_job, compose
    from src.engine.schema import RANGES

    seeds = values.get("seed", [])
    for seed in seeds:
        try:
            admitted = RANGES["seed"].admits(int(seed))
        except ValueError:
            admitted = False
        if not admitted:
            raise ConfigError(f"seed={seed} must be {RANGES['seed']}")
    keys = [k for k in values if k != "seed"]
    for combo in itertools.product(*(values[k] for k in keys)):
        overrides = [f"{k}={v}" for k, v in zip(keys, combo, strict=True)]
        check_job(compose(overrides), overrides)


def sweep_config(arguments: list[str]) -> dict[str, Any]:
    """The W&B Sweeps config (a dict, written as YAML) whose grid is the Hydra sweep of ``arguments``."""
    from src.engine.record.tracking import main_metric

    check_selections(arguments)
    values, cfg = grid(arguments)
    check_runs(values)
    metric, mode = main_metric(cfg.task)
    parameters = {k: {"values": v} if len(v) > 1 else {"value": v[0]} for k, v in values.items()}
    parameters.setdefault("logger", {"value": "wandb"})
    return {
        "name": str(cfg.get("sweep_name") or "sweep"),
        "program": "src/run.py",
        "method": "grid",
        "metric": {"name": metric, "goal": "maximize" if mode == "max" else "minimize"},
        "parameters": parameters,
        "command": ["${env}", "python", "-m", "src.run", "${args_no_hyphens}"],
    }


def main(argv: list[str] | None = None) -> int:
    """Print the W&B Sweeps config (or write it to ``--out``); one line and 2 on bad input (Hydra's
    grammar and composition errors with their type)."""
    parser = command_parser(__spec__.name, __doc__)
    parser.add_argument("overrides", nargs="+", metavar="key=value", help="experiment=… and -m style items")
    parser.add_argument("--out", help="write the YAML here instead of printing it")
    return run_command(parser, write_sweep, argv, expected=(OSError,), named=(Exception,))


def write_sweep(args: argparse.Namespace) -> None:
    """The command's work: the sweep's config printed, or written to ``--out``."""
    text = yaml.safe_dump(sweep_config(args.overrides), sort_keys=False)
    if args.out:
        write_atomic(Path(args.out), text)  # whole or not at all: an earlier spec stays if not
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    raise SystemExit(main())
