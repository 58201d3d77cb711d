"""The config as ``python -m src.run`` composes it, outside Hydra's main: one job's (:func:`compose`)
and a multirun's cells (:func:`grid`).

Hydra composes the config inside ``@hydra.main``; the precheck, the planner, the W&B sweep, the
sandbox's seed sets, the benches and the tests need it before, or without, a run. They all compose
here, as the entry point does: Hydra's own loader over ``conf/`` (and any ``--config-dir``), its
version base (``src/run.py``'s ``1.3``), the trainer schema, Hydra's resolvers and the suite's
registered. A multirun's cells are those Hydra's basic sweeper launches: the experiment's
``hydra.sweeper.params`` first, the command line's items after, a later item replacing an earlier
one of the same key, each value written as Hydra passes it to its job (``optim.lr=3e-3,1e-2``:
``0.003`` and ``0.01``).
Imports only ``src`` and third-party packages (Hydra, OmegaConf): no torch.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, open_dict

from src.cli import check_selections, config_loader
from src.errors import ConfigError

#: ``@hydra.main(version_base=…)`` of ``src/run.py``: the defaults list's rules it composes by.
VERSION_BASE = "1.3"


@functools.cache
def loader(config_dirs: tuple[Path, ...] = ()) -> Any:
    """One Hydra config loader over ``conf/`` and ``config_dirs`` per process (it reads the files
    on each composition; only its search path is kept)."""
    return config_loader(list(config_dirs))


def compose(
    overrides: Sequence[str],
    output_dir: Path | str | None = None,
    *,
    config_dirs: Sequence[Path] = (),
    hydra: bool = False,
) -> DictConfig:
    """The config ``python -m src.run <overrides>`` runs, unresolved, as its main gets it: without
    the ``hydra`` node unless ``hydra`` (the sweeper's params, the run folder's pattern).
    ``output_dir`` sets ``paths.output_dir`` (after ``overrides``, so it wins); ``config_dirs`` are
    ``--config-dir`` folders searched after ``conf/``. Hydra's own exceptions where it cannot."""
    from hydra import version
    from hydra.types import RunMode

    import src.engine.schema  # noqa: F401  the trainer schema (it registers the suite's resolvers too)

    version.setbase(VERSION_BASE)
    hydra_resolvers()
    placed = [f"paths.output_dir={output_dir}"] if output_dir is not None else []
    cfg = loader(tuple(config_dirs)).load_configuration(
        "config", overrides=[*overrides, *placed], run_mode=RunMode.RUN
    )
    if not hydra:
        with open_dict(cfg):
            del cfg["hydra"]
    return cfg


@functools.cache
def hydra_resolvers() -> None:
    """Hydra's own resolvers (``${hydra:…}``, ``${now:…}``), registered once per process as its
    main registers them (the run folder's pattern reads ``${hydra:job.override_dirname}``)."""
    from hydra.core.utils import setup_globals

    setup_globals()


def axes(arguments: Sequence[str]) -> tuple[dict[str, list[str]], DictConfig]:
    """``{key: [value, …]}`` of the multirun ``arguments`` in Hydra's order (the experiment's
    ``hydra.sweeper.params``, then the command line's items, a later one replacing an earlier one of
    the same key), and the config the fixed items compose (an experiment's sweep name, its task).
    A selection naming no option, a sweep over experiments or an interval: :class:`ConfigError`."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    arguments = list(arguments)
    if not any(a.lstrip("+~").startswith("hydra.searchpath") for a in arguments):  # Hydra checks those
        check_selections(arguments)
    parser = OverridesParser.create(config_loader=loader())
    given = parser.parse_overrides(arguments)
    if any(o.get_key_element() == "experiment" and o.is_sweep_override() for o in given):
        raise ConfigError("experiment=…: give one experiment (a grid is one experiment's sweep)")
    cfg = compose([o.input_line for o in given if not o.is_sweep_override()], hydra=True)
    params = cfg.hydra.sweeper.get("params") or {}
    values: dict[str, list[str]] = {}
    for override in parser.parse_overrides([*(f"{k}={v}" for k, v in params.items()), *arguments]):
        key = override.get_key_element()
        if override.is_sweep_override():
            if not override.is_discrete_sweep():
                raise ConfigError(f"{override.input_line}: an interval is not a grid; give its values")
            values[key] = list(override.sweep_string_iterator())
        else:
            values[key] = [override.get_value_element_as_str()]
    with open_dict(cfg):
        del cfg["hydra"]
    return values, cfg


def combinations(values: dict[str, list[str]]) -> list[list[str]]:
    """Every combination of ``values`` (:func:`axes`) as a job's overrides, the first key slowest."""
    keys = list(values)
    return [
        [f"{k}={v}" for k, v in zip(keys, combo, strict=True)]
        for combo in itertools.product(*values.values())
    ]


def grid(arguments: Sequence[str]) -> list[list[str]]:
    """The overrides of each job ``python -m src.run -m <arguments>`` launches, in its order."""
    values, _ = axes(arguments)
    return combinations(values)
