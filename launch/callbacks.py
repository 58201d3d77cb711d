"""Hydra callbacks: checks that fail a run or a sweep before it starts, in one message."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

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


class OutputDirCheck(Callback):
    """The run folder (or the sweep's) must be writable before Hydra sets up its log file there:
    otherwise Hydra's logging dies first, in a traceback that never says what to change.
    Like :class:`LauncherCheck`, it prints its message and exits with status 2 itself."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._check(config, "hydra.run.dir")

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._check(config, "hydra.sweep.dir")

    def _check(self, config: DictConfig, key: str) -> None:
        try:
            HydraConfig.instance().set_config(config)  # the folder's name reads hydra:job.* values
            check_writable(Path(str(OmegaConf.select(config, key))))
        except ConfigError as error:
            print(f"error: {error}", file=sys.stderr)
            raise SystemExit(2) from error


def check_writable(folder: Path) -> None:
    """Create ``folder`` if needed and write a file in it, or say why not."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-check-"):
            pass
    except OSError as error:
        raise ConfigError(
            f"cannot write the run folder {folder} ({error.strerror or error}): set paths.output_dir "
            "(or OUTPUT_DIR) to a folder you can write, or fix hydra.run.dir / hydra.sweep.dir"
        ) from error


class SweepEnd(Callback):
    """A multirun ends with one line: how its runs ended and the command for their tables and
    plots. The runs are counted from their records (``summary.json``), so the line is right
    whichever launcher ran them."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        print(sweep_end_line(Path(str(config.hydra.sweep.dir))), flush=True)


def sweep_end_line(sweep_dir: Path) -> str:
    """``sweep done: 6 runs (5 completed, 1 failed) in <dir>; tables and plots: python -m launch.report
    <dir>``."""
    statuses: dict[str, int] = {}
    for summary in sweep_dir.rglob("summary.json"):
        if "superseded" in summary.relative_to(sweep_dir).parts:
            continue
        try:
            status = json.loads(summary.read_text()).get("status", "unknown")
        except (OSError, ValueError):
            status = "unreadable"
        statuses[status] = statuses.get(status, 0) + 1
    counted = ", ".join(f"{n} {status}" for status, n in sorted(statuses.items()))
    runs = sum(statuses.values())
    return (
        f"sweep done: {runs} run{'s' if runs != 1 else ''}"
        + (f" ({counted})" if counted else "")
        + f" in {sweep_dir}; tables and plots: python -m launch.report {sweep_dir}"
    )
