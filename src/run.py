"""The one entry point: ``python -m src.run task=… backbone=… attn=…``.

Hydra composes the config from ``conf/`` (see ``conf/config.yaml``); the run folder is named
by the overrides, so rerunning a command resumes its run. Bad input ends with one message
and exit status 2, before any work is lost; SIGTERM, SIGUSR1 or SIGUSR2 with one line, after a
checkpoint, and status 128+signal (:mod:`src.engine.loop.preemption`).
"""

from __future__ import annotations

import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from src import resolvers  # noqa: F401  registers the configs' resolvers (also in SLURM jobs)
from src.cli import prepare_argv
from src.errors import ConfigError, message_of, user_error
from src.precheck import precheck


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> float | None:
    """Train one run; returns its main metric (for Hydra's sweepers)."""
    from src.engine import train  # torch is imported here, so that --help and typos answer at once
    from src.engine.loop.preemption import Preempted, exit_preempted

    hydra_cfg = HydraConfig.get()
    try:
        refuse_list_selection(list(hydra_cfg.overrides.task))
        summary = train(cfg, hydra_cfg.runtime.output_dir, hydra_files(cfg))
    except Preempted as stop:  # checkpoint saved and recorded; in a sweep too, the signal ends the process
        exit_preempted(stop)  # its line; the signal's earlier handler or a SLURM requeue; 128+signal
    except Exception as e:
        cause = user_error(e)
        if cause is None or hydra_cfg.mode == RunMode.MULTIRUN:
            raise  # in a sweep, Hydra records the failure and runs the other jobs
        print(f"error: {message_of(cause)}", file=sys.stderr)
        sys.exit(2)
    return summary["final"].get(summary["metric"])


def hydra_files(cfg: DictConfig) -> dict[str, str]:
    """What Hydra writes into a job's ``.hydra/`` (its config, Hydra's own and the overrides, as
    given), for the session to write once it holds the run folder (``hydra.output_subdir: null``
    keeps Hydra from writing them before the lock decides)."""
    hydra_node = OmegaConf.to_container(HydraConfig.get(), resolve=False)
    return {
        "config.yaml": OmegaConf.to_yaml(cfg),
        "hydra.yaml": OmegaConf.to_yaml({"hydra": hydra_node}),
        "overrides.yaml": OmegaConf.to_yaml(list(HydraConfig.get().overrides.task)),
    }


def refuse_list_selection(overrides: list[str]) -> None:
    """``attn=[cond_init,spectral]`` is Hydra's list selection: it merges the files into one node,
    mixing the variants' options. Say what composes them instead."""
    for override in overrides:
        key, _, value = override.partition("=")
        if key.lstrip("+") == "attn" and value.startswith("["):
            names = value.strip("[]").replace(" ", "")
            raise ConfigError(
                f"attn={value} merges the variants' files into one config; to apply several variants "
                f"in order use attn=compose 'attn.parts=[{names}]' (docs/variants.md: Compositions)"
            )


def cli() -> None:
    """``--help``, typos in group selections and values with ``=`` (src/cli.py), and what the config
    alone refuses (src/precheck.py), before Hydra parses argv and before torch is imported; then
    :func:`main`."""
    try:
        sys.argv[1:] = prepare_argv(sys.argv[1:])
        precheck(sys.argv[1:])  # what the config alone refuses, before torch is imported
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    import src.engine  # noqa: F401  the trainer schema, which Hydra composes with (no torch: train loads it)

    main()


if __name__ == "__main__":
    cli()
