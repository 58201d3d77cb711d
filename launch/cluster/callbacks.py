"""Hydra callbacks: checks that fail a run or a sweep before it starts, in one message, and the
line that ends a multirun (:class:`SweepEnd`)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobStatus
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from src.engine.record.files import write_atomic
from src.errors import ConfigError, SuiteError


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
        check_world(config)
        if shutil.which("sbatch") is None:
            raise ConfigError(
                "hydra/launcher=slurm needs SLURM's sbatch on PATH and there is none: run from a cluster's "
                "login node, start the local cluster (launch/cluster/local_slurm.sh start; "
                "export SLURM_CONF=…), or use hydra/launcher=local"
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


class DataPrepared(Callback):
    """``hydra/launcher=slurm``: every artefact the sweep's runs read (token caches, a tokenizer
    trained here, generated sets) must be there before any job is submitted, or GPU jobs would wait
    on CPU work (one tokenises under a lock, its siblings idle). The check builds nothing and is
    cheap: each distinct task config of the grid is composed and its
    :meth:`~src.engine.task.Task.prepare_data` run in check mode (:func:`launch.cluster.prepare.unprepared`),
    which reads markers and file sizes. Where something is missing it prints one line naming
    ``python -m launch.cluster.prepare <the same overrides>`` and exits with status 2, as
    :class:`LauncherCheck` does; a data set missing altogether is its own message. Local multiruns
    and single runs are not checked: they prepare inside the run, on the CPU that would prepare
    ahead. ``~hydra.callbacks.data_prepared`` skips it (jobs that see another data folder than the
    machine that submits them)."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        if not str(config.hydra.launcher.get("_target_", "")).endswith("SlurmLauncher"):
            return
        from launch.cluster.prepare import unprepared

        try:
            problem = unprepared([str(o) for o in config.hydra.overrides.task])
        except SuiteError as error:  # a data set missing altogether, or overrides it cannot compose
            problem = str(error)
        if problem is not None:
            print(f"error: {problem}", file=sys.stderr)
            raise SystemExit(2)


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
    """A multirun ends with one line: how *its* runs ended and the command for their tables and
    plots. Every ad-hoc multirun shares one folder (``sweep_name: sweep``), so the line counts only
    the jobs of this multirun, whichever launcher ran them:

    * ``on_multirun_start`` (the driver) gives the multirun a new id, keeps its folder
      ``<sweep dir>/.sweeps/<id>/`` and names it in ``<sweep dir>/.sweeps/latest``;
    * ``on_job_start`` and ``on_job_end`` (each job's process: the driver's for the local launcher,
      the submitit worker's for SLURM, which receives this callback pickled with the id) write
      ``job-<n>.json`` there, naming the job's run folder, whole or not at all;
    * ``on_multirun_end`` (the driver) reads each job's status from its run folder's record
      (:func:`launch.analysis.records.read_run`: a job that left no summary counts as its record says,
      ``incomplete`` or ``failed to start``; what cannot be read counts as ``unreadable``).

    A job that fails (its task function raised: a refusal such as another process's lock on its
    run folder, or a bug) is noted failed with its one line, and handed back to Hydra as done, so
    that the sweep's other jobs run and the multirun ends here instead of in Hydra's traceback of
    the first failure: each failed job's ``error:`` line (a bug's traceback in a file beside its
    note, named there), the sweep's line, and exit status 2. A job whose note cannot be written
    is left failed for Hydra to report, as before.

    The sweep folder is on a file system all jobs share (Hydra's own assumption)."""

    def __init__(self) -> None:
        self.tracking: str | None = None  # <sweep dir>/.sweeps/<id>, absolute
        self.untracked: str | None = None  # why this multirun's jobs could not be tracked

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        try:
            sweeps = Path(str(config.hydra.sweep.dir)).absolute() / SWEEPS
            tracking = sweeps / f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:8]}"
            tracking.mkdir(parents=True, exist_ok=True)
            write_atomic(sweeps / "latest", tracking.name + "\n")
        except Exception as error:  # noqa: BLE001  the sweep runs on; its end line says it did not count
            self.untracked = f"{type(error).__name__}: {error}"
            return
        self.tracking = str(tracking)

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._note_job(config)

    def on_job_end(self, config: DictConfig, job_return: Any = None, **kwargs: Any) -> None:
        error = failure(job_return)
        if self._note_job(config, error) and error is not None:
            job_return.status = JobStatus.COMPLETED  # noted failed: the multirun ends with its lines
            job_return.return_value = None

    def _note_job(self, config: DictConfig, error: BaseException | None = None) -> bool:
        """``job-<n>.json`` naming this job's run folder (and, where ``error`` ended it, its line),
        in this multirun's folder; whether it was written (Hydra turns an error here into a
        one-line warning; the job itself goes on). A single run is no sweep's."""
        if "MULTIRUN" not in str(OmegaConf.select(config, "hydra.mode")):
            return False
        tracking = self.tracking or latest_tracking(Path(str(config.hydra.sweep.dir)))
        if tracking is None:
            return False
        num = OmegaConf.select(config, "hydra.job.num")
        name = f"job-{num}" if num is not None else f"job-{uuid.uuid4().hex}"
        run_dir = str(Path(str(config.hydra.runtime.output_dir)).absolute())
        note = {"run_dir": run_dir, "job": num}
        if error is not None:
            note["failed"] = failure_line(error, Path(tracking) / f"{name}.traceback.txt")
        write_atomic(Path(tracking) / f"{name}.json", json.dumps(note) + "\n")
        return True

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(str(config.hydra.sweep.dir))
        tracking = Path(self.tracking) if self.tracking else None
        failed = failed_jobs(tracking)
        for line in failed:
            print(line, file=sys.stderr, flush=True)
        print(sweep_end_line(sweep_dir, tracking, self.untracked), flush=True)
        if failed:
            raise SystemExit(2)  # past Hydra's callback guard, which turns exceptions into warnings


SWEEPS = ".sweeps"


def latest_tracking(sweep_dir: Path) -> str | None:
    """The folder of the multirun that last started in ``sweep_dir`` (``.sweeps/latest``), for a
    job whose callback did not come with its multirun's id; None when there is none."""
    try:
        name = (sweep_dir / SWEEPS / "latest").read_text().strip()
    except OSError:
        return None
    return str((sweep_dir / SWEEPS / name).absolute()) if name else None


def sweep_end_line(sweep_dir: Path, tracking: Path | None, untracked: str | None = None) -> str:
    """``sweep done: 6 runs (5 completed, 1 failed) in <dir>; tables and plots: python -m
    launch.analysis.report <dir>``: the runs of the jobs ``tracking`` (this multirun's folder) names, each
    counted by its record; where the jobs could not be tracked, the line says so instead of counting."""
    advice = f" in {sweep_dir}; tables and plots: python -m launch.analysis.report {sweep_dir}"
    if tracking is None:
        return f"sweep done (its runs were not counted: {untracked or 'no record of its jobs'}){advice}"
    try:
        jobs = sorted(tracking.glob("job-*.json"))
    except OSError as error:
        return f"sweep done (its runs were not counted: {error}){advice}"
    statuses = Counter(job_status(job) for job in jobs)
    counted = ", ".join(f"{n} {status}" for status, n in sorted(statuses.items()))
    runs = sum(statuses.values())
    return f"sweep done: {runs} run{'s' if runs != 1 else ''}" + (f" ({counted})" if counted else "") + advice


def failure(job_return: Any) -> BaseException | None:
    """The exception a job of a multirun ended with (Hydra's ``JobReturn`` of status FAILED), or None."""
    if job_return is None or getattr(job_return, "status", None) != JobStatus.FAILED:
        return None
    error = getattr(job_return, "_return_value", None)
    return error if isinstance(error, BaseException) else None


def failure_line(error: BaseException, traceback_file: Path) -> str:
    """A failed job's one line: a refusal's own message (:class:`SuiteError`, however wrapped), or a
    bug's type and first line, its whole traceback written to ``traceback_file`` and named."""
    from src.errors import message_of, user_error

    cause = user_error(error)
    if cause is not None:
        text = message_of(cause).strip()
        return text.splitlines()[0] if text else type(cause).__name__
    text = str(error).strip()
    first = f"{type(error).__name__}: {text.splitlines()[0]}" if text else type(error).__name__
    try:
        write_atomic(traceback_file, "".join(traceback.format_exception(error)))
    except Exception:  # noqa: BLE001  the line goes on without it
        return first
    return f"{first} (traceback: {traceback_file})"


def failed_jobs(tracking: Path | None) -> list[str]:
    """The ``error:`` line of each job of this multirun its note says failed, in job order."""
    if tracking is None:
        return []
    lines = []
    try:
        notes = sorted(tracking.glob("job-*.json"), key=lambda p: (len(p.name), p.name))
    except OSError:
        return []
    for note in notes:
        try:
            job = json.loads(note.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(job, dict) and job.get("failed"):
            lines.append(f"error: job {job.get('job')} ({job.get('run_dir')}): {job['failed']}")
    return lines


def job_status(job: Path) -> str:
    """How the job that ``job`` (a ``job-<n>.json``) names ended: ``failed`` where the note says
    so (the job raised; its run folder may hold another process's record), else as its run
    folder's record says: ``failed to start`` where it holds no config (nothing was recorded),
    ``unreadable`` where the note or the record cannot be read."""
    from launch.analysis.records import read_run  # the records' reader, only when a multirun ends

    try:
        note = json.loads(job.read_text())
        if note.get("failed"):
            return "failed"
        run_dir = Path(note["run_dir"])
        if not (run_dir / "config.yaml").exists() and not (run_dir / ".hydra" / "config.yaml").exists():
            return "failed to start"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # an evaluation left out: the report says so
            return str(read_run(run_dir).status)
    except Exception:  # noqa: BLE001  whatever the note or the folder holds, the line goes on
        return "unreadable"


def check_world(config: DictConfig) -> None:
    """A SLURM job whose processes (nodes × GPUs a node) cannot keep the recipe's global batch is
    refused before anything is submitted (src/engine/loop/batching.py; each job checks again itself)."""
    from src.engine.loop.batching import plan_for, slurm_world

    launcher = config.hydra.launcher
    try:
        plan_for(config, slurm_world(launcher))
    except ConfigError as error:
        nodes, gpus = launcher.get("nodes"), launcher.get("gpus_per_node")
        size = f"resources.nodes={nodes} × resources.gpus_per_node={gpus}"
        raise ConfigError(f"hydra/launcher=slurm with {size}: {error}") from error
