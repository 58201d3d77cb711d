"""Hydra's submitit SLURM launcher, with sbatch's refusal as one line instead of a traceback.

When sbatch refuses the jobs (a partition that does not exist, more GPUs or CPUs than a node
has, an account it does not know), submitit raises ``FailedJobError`` from deep inside Hydra's
sweep. :class:`SlurmLauncher` prints ``error:`` with sbatch's own message, prefixed with the
options to change, and exits with status 2, as ``launch/cluster/callbacks.py``'s ``LauncherCheck``
does for a missing SLURM.

Hydra instantiates launchers only from the ``hydra_plugins`` package, so ``hydra/launcher=slurm``
keeps submitit's ``_target_``; the callback :class:`OneLineSubmissionErrors` (``conf/config.yaml``)
makes Hydra build :class:`SlurmLauncher` for it when a sweep starts. It also resolves each
attempt's time limit first (``src/slurm_time.py``): a bad ``resources.max_time_min`` is one line
and exit 2, and a run split into attempts by the partition's limit says so in one line.
"""

from __future__ import annotations

import contextlib
import io
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from hydra.core.plugins import Plugins
from hydra.core.utils import JobReturn
from hydra.experimental.callback import Callback
from hydra_plugins.hydra_submitit_launcher import submitit_launcher
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import InterpolationResolutionError

from src.errors import ConfigError

SUBMITIT_SLURM = "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"
ADVICE = (
    "hydra/launcher=slurm: sbatch refused the jobs; check hydra.launcher.partition, account, qos, "
    "gpus_per_node, cpus_per_task, mem_gb and timeout_min against the cluster (sinfo -o '%P %G %c %m %l')"
)


class SlurmLauncher(submitit_launcher.SlurmLauncher):
    """submitit's SLURM launcher whose submission errors end the sweep in one line."""

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        """Submit the jobs and wait for them; a refused submission is one message and exit 2."""
        from submitit.core.utils import FailedJobError, FailedSubmissionError

        try:
            with quiet_submission():
                return super().launch(job_overrides, initial_job_idx)
        except (FailedJobError, FailedSubmissionError) as error:
            if not submission_failed(error):
                raise
            message = refusal_message(error)
            print(f"error: {message}", file=sys.stderr)
            raise SystemExit(2) from ConfigError(message)


class OneLineSubmissionErrors(Callback):
    """At the start of a sweep, make Hydra build :class:`SlurmLauncher` where the config names
    submitit's (Hydra looks launchers up by that name in its plugin registry)."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        target = str(config.hydra.launcher.get("_target_", ""))
        if target == SUBMITIT_SLURM:
            Plugins.instance().class_name_to_class[target] = SlurmLauncher
            try:
                line = attempts_line(config)
            except ConfigError as error:
                print(f"error: {error}", file=sys.stderr)
                raise SystemExit(2) from error
            if line:
                print(line, file=sys.stderr, flush=True)


def attempts_line(config: DictConfig) -> str | None:
    """``each SLURM attempt asks 1440 of the run's 4320 min (…): 4 attempts, …``, where the cap
    splits the run, else None; a :class:`ConfigError` where the time limit cannot be resolved."""
    from src.slurm_time import attempts_needed

    launcher, resources = config.hydra.launcher, config.resources
    try:
        attempt, timeouts = int(launcher.timeout_min), int(launcher.max_num_timeout)
    except InterpolationResolutionError as error:
        raise config_error(error) or error from None
    total = int(resources.time_min)
    if attempt >= total:
        return None
    cap = OmegaConf.select(config, "resources.max_time_min")
    source = "the partition's MaxTime" if str(cap) == "auto" else f"resources.max_time_min={cap}"
    needed = attempts_needed(total, attempt, int(launcher.signal_delay_s))
    return (
        f"each SLURM attempt asks {attempt} of the run's {total} min ({source}): {needed} attempts, "
        f"each requeued after its timeout from last.pt (up to {timeouts} timeouts)"
    )


def submission_failed(error: BaseException) -> bool:
    """Whether ``error`` came from sbatch, not from a job that ran and failed."""
    from submitit.core.utils import FailedSubmissionError

    if isinstance(error, FailedSubmissionError):  # sbatch answered something without a job id
        return True
    command = getattr(error.__cause__, "cmd", None) or [""]
    return Path(str(command[0])).name == "sbatch"


def refusal_message(error: BaseException) -> str:
    """:data:`ADVICE` and sbatch's own words (its stderr, or the output submitit could not read)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    said = " ".join(lines[:3]) or "no message"
    return f"{ADVICE}: {said}"


def config_error(error: BaseException) -> ConfigError | None:
    """The :class:`ConfigError` a resolver raised, from the chain OmegaConf wraps it in."""
    seen: BaseException | None = error
    while seen is not None and not isinstance(seen, ConfigError):
        seen = seen.__cause__ or seen.__context__
    return seen


@contextlib.contextmanager
def quiet_submission() -> Iterator[None]:
    """While sbatch runs, keep submitit from copying its stderr to ours (the message comes once,
    in :meth:`SlurmLauncher.launch`); the wait for the jobs that follows is left alone."""
    from submitit.slurm.slurm import SlurmExecutor

    original = SlurmExecutor._submit_command

    def submit(self: Any, command: str) -> Any:
        with contextlib.redirect_stderr(io.StringIO()):
            return original(self, command)

    SlurmExecutor._submit_command = submit  # type: ignore[method-assign]
    try:
        yield
    finally:
        SlurmExecutor._submit_command = original  # type: ignore[method-assign]
