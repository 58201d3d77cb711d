"""Hydra callbacks: checks that fail a sweep before it submits anything."""

from __future__ import annotations

import shutil
import subprocess
import sys
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from src.errors import ConfigError


class LauncherCheck(Callback):
    """``hydra/launcher=slurm`` needs a reachable SLURM: say so at once, not after a traceback.

    Hydra turns a callback's exceptions into warnings, so the check prints its message and
    exits with status 2 itself (``SystemExit`` passes through Hydra's handler)."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        try:
            self.check(config)
        except ConfigError as error:
            print(f"error: {error}", file=sys.stderr)
            raise SystemExit(2) from error

    def check(self, config: DictConfig) -> None:
        target = str(config.hydra.launcher.get("_target_", ""))
        if not target.endswith("SlurmLauncher"):
            return
        if shutil.which("sbatch") is None:
            raise ConfigError(
                "hydra/launcher=slurm needs SLURM's sbatch on PATH and there is none: run from a cluster's "
                "login node, start the local cluster (launch/local_slurm.sh start; export SLURM_CONF=…), "
                "or use hydra/launcher=local"
            )
        try:
            probe = subprocess.run(["sinfo", "-h", "-o", "%P"], capture_output=True, text=True, timeout=20)
        except subprocess.TimeoutExpired:
            probe = None
        if probe is None or probe.returncode != 0:
            detail = (
                "timed out" if probe is None else (probe.stderr.strip().splitlines() or ["no output"])[-1]
            )
            raise ConfigError(f"hydra/launcher=slurm: SLURM's controller does not answer (sinfo: {detail})")
