"""One run from a composed config, as a short pipeline: check the config, take the processes,
make or check the generated data it reads (:func:`data_read`: its content joins the identity), open
the run folder's record (:mod:`.record.session`), build the task, let it train (in the
shared loop, :func:`.loop.shared_loop.fit_shared`, unless the task trains in a loop of its own,
:meth:`.task.Task.fit`: detection's mmengine Runner), and write the summary. Every task's rows,
summary, failures and W&B run go through one :class:`.record.recorder.Recorder`. A failure is
appended to ``failures.jsonl``; ``summary.json`` says ``failed`` only when this session trained or
the record had no summary (a completed record is never rewritten by a session that did not
train), and never for a preemption (:class:`.loop.preemption.Preempted`: the run is incomplete,
and resumes).

This module composes the engine's two packages, :mod:`.loop` and :mod:`.record`; neither imports it.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig

from src import attention
from src.attention import Composition, Variant
from src.errors import SuiteError, message_of, user_error

from .compatible import check_compatible, compatible_backbones  # noqa: F401  (re-exported)
from .distributed import Dist
from .generated import reading
from .loop.batching import plan_for
from .loop.numerics import flush_denormals, restore_tf32, use_tf32
from .loop.preemption import Preempted
from .loop.prepared import seeded_task
from .loop.shared_loop import fit_shared
from .record.announce import announce, complete_line, end_line
from .record.files import RunRecord
from .record.identity import git_revision
from .record.recorder import Recorder
from .record.session import RunSession, Session
from .schema import check_values
from .task import Run, Task
from .threads import default_threads

log = logging.getLogger(__name__)


def train(cfg: DictConfig, run_dir: Path | str, hydra_files: dict[str, str] | None = None) -> dict[str, Any]:
    """Train as ``cfg`` says, recording in ``run_dir``; returns the summary. ``hydra_files``:
    Hydra's copy of the command (``.hydra/``), which the session writes once it trains there."""
    check_values(cfg)
    check_compatible(cfg)
    variant = attention.config.complete(cfg.attn)  # checked; a composition records all its options
    with processes(cfg) as dist:
        plan_for(cfg, dist.world)  # a world size that cannot keep the global batch: refused before the record
        record = RunRecord(Path(run_dir), enabled=dist.main)
        data = data_read(cfg)  # made or checked before the record opens: its content joins the identity
        with RunSession(record, cfg, dist, hydra_files, data) as session:
            if session.kind == "complete":
                return already_complete(cfg, session)
            return train_session(cfg, session, dist, variant)


def data_read(cfg: DictConfig) -> dict[str, str]:
    """The generated data the run reads (token caches, tokenizers trained here, generated sets),
    made where missing or damaged and checked against its manifest by the task's
    :meth:`~.task.Task.prepare_data` (the code its ``datasets()`` runs), as ``{artefact: content
    hash}``: part of the run's identity (:mod:`.record.identity`), so that runs on other data never
    resume or pool with this one. Before the record opens, so a data set that is missing is refused
    with nothing written in the run folder; empty for a task whose data is read as it is."""
    data_dir = Path(cfg.paths.data_dir)
    with reading(data_dir) as read:
        instantiate(cfg.task).prepare_data(data_dir)
    return read


@contextlib.contextmanager
def processes(cfg: DictConfig) -> Iterator[Dist]:
    """The run's processes (one, or DDP's), its CPU threads, denormal flushing and TF32 (on a CUDA
    device, :func:`.loop.numerics.use_tf32`), all restored after the run."""
    dist = Dist.setup(cfg.trainer.device)
    threads = torch.get_num_threads()
    flushed = flush_denormals(bool(cfg.trainer.get("flush_denormal")) and dist.device.type == "cpu")
    tf32 = use_tf32(dist.device)
    try:
        if cfg.trainer.get("threads"):  # tiny models run fastest on one CPU thread
            torch.set_num_threads(cfg.trainer.threads)
        elif (chosen := default_threads()) is not None:  # the free CPUs, not every core (.threads)
            torch.set_num_threads(chosen[0])
            if dist.main:
                log.info("CPU threads: %d (%s; trainer.threads=N sets it)", chosen[0], chosen[1])
        yield dist
    finally:
        dist.close()
        torch.set_num_threads(threads)
        flush_denormals(flushed)
        restore_tf32(tf32)
        # The run's model sits in reference cycles (config nodes, hooks, the trainer and its
        # recorder) that only the cyclic collector frees: free it now, before the next run of
        # this process (a local multirun, the bench, the tests) builds another.
        gc.collect()


def already_complete(cfg: DictConfig, session: Session) -> dict[str, Any]:
    """A complete record's summary, left as it is; says so, and how to train it again."""
    summary = session.opening.summary or {}
    if session.record.enabled:
        announce(complete_line(cfg, summary, session.record.dir))
    return summary


def train_session(
    cfg: DictConfig, session: Session, dist: Dist, variant: Variant | Composition | None = None
) -> dict[str, Any]:
    """Build the task and let it train (``variant``: ``cfg.attn``'s, as :func:`train` checked it);
    the summary, or the failure recorded (module docstring)."""
    recorder = Recorder(session, cfg)
    try:
        with recorder:  # closes the W&B run whatever happens
            task = seeded_task(cfg)  # the task, then the seed: the order every build of a run keeps
            run = Run(cfg, session, dist, recorder, variant)
            reached = task.fit(run)
            if reached is None:  # the task trains in the shared loop
                reached = fit_shared(task, run)
            summary = recorder.finish(completed_summary(cfg, task, session, dist, reached))
        if session.record.enabled:
            announce(end_line(summary, session.record.dir))
        return summary
    except Exception as error:
        steps = recorder.steps()
        memory = out_of_memory(error, cfg, steps)
        if memory is None and refused(error):
            session.withdraw()  # a fresh record refused before its first step: nothing left to list
            if session.withdrawn:
                raise
        record_failure(cfg, session, steps, memory or error)
        if memory is not None:
            raise memory from error
        raise


def refused(error: BaseException) -> bool:
    """Bad input (a :class:`SuiteError` behind ``error``: a missing data file, a wrong value), not
    a preemption, a memory limit or a crash: what a run refused before training need not record."""
    cause = user_error(error)
    return cause is not None and not isinstance(cause, (Preempted, OutOfMemory))


def completed_summary(
    cfg: DictConfig, task: Task, session: Session, dist: Dist, reached: dict[str, Any]
) -> dict[str, Any]:
    """``summary.json`` of a session that trained to the end: what the run was, what it reached,
    and the task's :meth:`~src.engine.task.Task.statistics` of its record where it has some."""
    statistics = task.statistics(session.record.dir) if session.record.enabled and dist.main else None
    return {
        **run_identity(cfg, task),
        **reached,
        **({"statistics": statistics} if statistics else {}),
        "world_size": dist.world,
        "sessions": session.sessions(reached["steps"]),
        "git": git_revision(),
        "status": "completed",
    }


def record_failure(cfg: DictConfig, session: Session, steps: int, error: Exception) -> None:
    """Append the failure, at ``steps``, to ``failures.jsonl``; write it into ``summary.json`` only
    when this session trained or there was no summary, and never for a preemption (incomplete, not
    failed). Best effort: a full disk must not hide ``error``."""
    record = session.record
    message = message_of(error).strip()
    line = f"{type(error).__name__}: {message.splitlines()[0] if message else ''}"
    record.add_failure(
        {
            "time": time.strftime("%Y-%m-%d %H:%M:%S"),
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "step": steps,
            "trained": record.touched,
            "error": line,
            "code": session.current["code"],
        }
    )
    try:
        if not isinstance(error, Preempted) and (record.touched or record.summary() is None):
            record.write_summary(failure_summary(cfg, steps, line))
    except Exception:  # noqa: BLE001  the error the user must see is the one being raised
        pass


class OutOfMemory(SuiteError):
    """The run needed more memory than its device has."""


def out_of_memory(error: BaseException, cfg: DictConfig, steps: int) -> OutOfMemory | None:
    """An :class:`OutOfMemory` that says what to lower, where ``error`` is the allocator's (torch's
    ``OutOfMemoryError`` on a GPU, its ``DefaultCPUAllocator`` error or Python's ``MemoryError`` on
    a CPU); None for any other error."""
    text = str(error)
    if not (
        isinstance(error, (torch.OutOfMemoryError, MemoryError))
        or "DefaultCPUAllocator: can't allocate memory" in text
        or "CUDA out of memory" in text
    ):
        return None
    task, trainer = cfg.task, cfg.trainer
    asked = re.search(r"(?:tried|Tried) to allocate ([0-9.]+ ?[KMGT]?i?B|\d+ bytes)", text)
    needed = f" (it asked for {asked.group(1)} more)" if asked else ""
    device = "the GPU" if isinstance(error, torch.OutOfMemoryError) or "CUDA" in text else "the CPU"
    return OutOfMemory(
        f"out of memory at step {steps} on {device}{needed}: lower task.batch_size (now "
        f"{task.get('batch_size')}; trainer.accumulate={trainer.accumulate * 2} with half the batch keeps "
        f"the effective batch), task.eval_batch_size (now {task.get('eval_batch_size')}) or "
        "trainer.eval_batches, use trainer.precision=bf16, or a smaller backbone"
    )


def run_identity(cfg: DictConfig, task) -> dict[str, Any]:
    """The summary's keys that say what the run was (the same for every task)."""
    return {
        "task": task.name,
        "backbone": cfg.backbone.name,
        "attn": attention.attn_name(cfg.attn),
        "attn_options": attention.attn_options(cfg.attn),
        "seed": cfg.seed,
        "metric": task.metric,
        "metric_mode": task.metric_mode,
    }


def failure_summary(cfg: DictConfig, steps: int, error_line: str) -> dict[str, Any]:
    """What a failed run leaves in ``summary.json``: what it was, how far it got, the error line."""
    return {
        "task": cfg.task.name,
        "backbone": cfg.backbone.name,
        "attn": attention.attn_name(cfg.attn),
        "seed": cfg.seed,
        "steps": steps,
        "metric": cfg.task.get("metric"),
        "status": "failed",
        "error": error_line,
        "git": git_revision(),
    }
