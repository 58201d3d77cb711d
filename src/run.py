"""The one entry point: ``python -m src.run task=… backbone=… attn=…``.

Hydra composes the config from ``conf/`` (see ``conf/config.yaml``); the run folder is named
by the overrides, so rerunning a command resumes its run. Bad input ends with one message
and exit status 2, before any work is lost.
"""
from __future__ import annotations

import logging
import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from src.engine import train
from src.errors import SuiteError

log = logging.getLogger("src.run")


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> float | None:
    """Train one run; returns its main metric (for Hydra's sweepers)."""
    try:
        summary = train(cfg, HydraConfig.get().runtime.output_dir)
    except SuiteError as e:
        log.error("%s", e)
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    return summary["final"].get(summary["metric"])


if __name__ == "__main__":
    main()
