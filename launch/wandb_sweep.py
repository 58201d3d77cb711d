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
import sys
from pathlib import Path
from typing import Any

import yaml

from src.command import command_parser, run_command
from src.configs import axes, combinations, compose
from src.engine.record.files import write_atomic
from src.errors import ConfigError


def check_runs(values: dict[str, list[str]]) -> None:
    """Every run of the grid passes what ``python -m src.run`` checks before any work
    (:func:`launch.plan.check_job`; each seed's range apart, since a seed changes nothing else),
    so that no spec is written whose runs every agent would refuse (``task.batch_size=0``)."""
    from launch.plan import check_job
    from src.engine.schema import RANGES

    seeds = values.get("seed", [])
    for seed in seeds:
        try:
            admitted = RANGES["seed"].admits(int(seed))
        except ValueError:
            admitted = False
        if not admitted:
            raise ConfigError(f"seed={seed} must be {RANGES['seed']}")
    for overrides in combinations({k: v for k, v in values.items() if k != "seed"}):
        check_job(compose(overrides), overrides)


def sweep_config(arguments: list[str]) -> dict[str, Any]:
    """The W&B Sweeps config (a dict, written as YAML) whose grid is the Hydra sweep of ``arguments``."""
    from src.engine.record.tracking import main_metric

    values, cfg = axes(arguments)
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
