"""The shared training loop: steps, accumulation, AMP, clipping, validation, monitoring,
checkpoints and resume. Classification, LRA, LM and the sandbox all train here. Whatever
``trainer.*`` says, SIGTERM, SIGUSR1 or SIGUSR2 (SLURM's preemption and time-limit signals) stop
it at the next step boundary with ``last.pt`` saved, and a rerun resumes (:mod:`.preemption`);
with one process, a step of many micro-batches that has run for longer than
:data:`.preemption.STEP_WAIT_S` is stopped at its next micro-batch boundary instead, its
gradients so far in ``last.pt`` (``partial``), and the rerun completes that very step.

A step neither reads the device nor adds a collective: the losses stay on the device until the
next *boundary* (a step that logs, validates, runs the monitor or saves, and the last), where one
reduction reads them with the stop signal (:mod:`.readings`). A non-finite loss found there stops
the run, naming its own step, before anything is logged or saved: no checkpoint is ever written
after a non-finite step (:meth:`Trainer._save` reads first). Where a decision needs the step's own
loss before its update, the loop reads every step (one reduction, one read): with
``trainer.nonfinite=skip``, which must skip that very batch, and for a task that overrides
:meth:`~src.engine.task.Task.after_backward`, which takes the step's loss as a float (the sandbox's
``modadd``).

Longer than the suite's 300 lines because the loop is one object whose state a checkpoint
carries whole (:class:`LoopState`): its step, skip accounting, validation and resume share that
state, and split apart they would each need all of it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, NoReturn

import torch
from omegaconf import DictConfig
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from src.conditioning import ConditioningMonitor
from src.conditioning.collapse import collapse_warning
from src.errors import SuiteError

from ..distributed import Dist
from ..record import checkpoint
from ..record.recorder import Recorder, kept_best
from ..record.session import Session
from ..task import Task
from . import evaluation, preemption
from .batching import BatchPlan, plan_batch
from .data import BatchStream, Position, eval_loader, to_device
from .numerics import run_autocast
from .preemption import Preempted, PreemptionGuard
from .progress import make_progress
from .readings import PendingLosses, reduce_readings

log = logging.getLogger(__name__)


class NonFiniteLoss(SuiteError):
    """The loss became NaN or Inf; the message names the step and what was kept."""


class StepInterrupted(Exception):
    """A signal stopped a long step after ``micro`` of its micro-batches, whose summed loss is
    ``total`` (on the device); their gradients are in the parameters' ``.grad``."""

    def __init__(self, micro: int, total: torch.Tensor) -> None:
        super().__init__(f"after {micro} micro-batches")
        self.micro, self.total = micro, total


@dataclass
class LoopState:
    """Everything of the loop itself that a checkpoint must carry."""

    step: int = 0
    position: Position = field(default_factory=Position)
    best: dict[str, float] = field(default_factory=dict)
    window_loss: float = 0.0
    window_steps: int = 0
    last_finite_loss: float | None = None
    last_finite_step: int | None = None
    skipped: int = 0
    skipped_in_row: int = 0
    wall_s: float = 0.0
    last_val: dict[str, float] = field(default_factory=dict)


class Trainer:
    """Trains ``model`` on ``task`` for ``total_steps`` optimizer steps; see :meth:`fit`."""

    def __init__(
        self,
        cfg: DictConfig,
        task: Task,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler,
        datasets: tuple,
        session: Session,
        dist: Dist,
        seed: int,
        total_steps: int,
        recorder: Recorder,
        ema: nn.Module | None = None,
        batch: BatchPlan | None = None,
    ) -> None:
        self.cfg, self.task, self.raw_model = cfg, task, model
        # the recipe's global batch over this run's processes (loop/batching.py)
        self.batch = batch or plan_batch(task.batch_size, cfg.accumulate, dist.world)
        self.optimizer, self.scheduler, self.session, self.dist = optimizer, scheduler, session, dist
        self.record, self.recorder = session.record, recorder
        self.train_set, self.val_set = datasets
        self.seed, self.total_steps, self.ema = seed, total_steps, ema
        self.model = model
        if dist.world > 1:
            self.model = DistributedDataParallel(
                model, device_ids=[dist.device.index] if dist.device.type == "cuda" else None
            )
        if cfg.compile:
            self.model = torch.compile(self.model)
        watch = cfg.monitor_every or cfg.get("collapse_entropy") is not None
        self.monitor = ConditioningMonitor(model) if watch and dist.main else None
        self.autocast = run_autocast(dist.device, cfg.precision)
        self.state = LoopState()
        self.saved_step: int | None = None  # the step of the newest checkpoint
        self._hook_metrics: dict[str, float] | None = None
        # the steps whose loss is not read yet (:mod:`.readings`); read every step where a decision
        # needs it before the update: skipping that very batch, or a task's after_backward
        self.pending = PendingLosses()
        hook = type(task).after_backward is not Task.after_backward
        self.reads_every_step = cfg.nonfinite == "skip" or hook
        self.guard: PreemptionGuard | None = None
        self.agreed_signal: int | None = None  # with several processes: the last reduction's
        self.partial: dict[str, Any] | None = None  # a step last.pt holds midway, until it resumes
        self._monitor_batch: Any = None  # the monitor's fixed batch on the device, drawn at its first call

    # -- the loop ------------------------------------------------------------------------

    def fit(self) -> LoopState:
        """Train to ``total_steps``, resuming from ``last.pt`` when the run folder has one."""
        self._resume()
        cfg, state = self.cfg, self.state
        self.recorder.trained_to(state.step)
        self.recorder.begin(state.step, self.total_steps, self.batch.text())
        self.stream = self._stream()
        batches = iter(self.stream)
        progress = make_progress(
            cfg.progress, self.total_steps, state.step, self.task.name, enabled=self.dist.main
        )
        if state.step == 0 and self.monitor is not None and self.partial is None:
            self._at_init()  # (a first step resumed midway logged it already)
        if state.step == 0 and self.partial is None and cfg.get("val_at_start"):
            self._validate_at_start()
        started, window_start, window_samples = time.monotonic(), time.monotonic(), 0
        with contextlib.closing(progress), PreemptionGuard() as guard:
            self.guard = guard
            self.model.train()
            while state.step < self.total_steps:
                try:
                    self._optimizer_step(batches)
                except StepInterrupted as midway:  # a long step: stopped at a micro-batch boundary
                    self._preempted_within(midway, guard.chained(guard.signum), started)
                window_samples += self.batch.global_batch
                state.step += 1
                self.recorder.trained_to(state.step)
                if self._hook_metrics:
                    self._log("train", self._hook_metrics)
                    self._hook_metrics = None
                if self._boundary(state.step) or self._stop_signal() is not None:
                    self._settle()  # the one read: losses, non-finite check, the agreed signal
                if state.step % cfg.log_every == 0 or state.step == self.total_steps:
                    elapsed = time.monotonic() - window_start
                    stats = self._log_train(window_samples / max(elapsed, 1e-9))
                    progress.update(state.step, **stats)
                    window_start, window_samples = time.monotonic(), 0
                if cfg.monitor_every and state.step % cfg.monitor_every == 0 and self.monitor is not None:
                    self._log("monitor", self._monitor())
                if (cfg.val_every and state.step % cfg.val_every == 0) or state.step == self.total_steps:
                    self._validate()
                if state.step % cfg.checkpoint_every == 0 or state.step == self.total_steps:
                    started = self._checkpoint(started)
                if (signum := self._stop_signal()) is not None:
                    self._preempted(signum, guard.chained(signum), started)
        return state

    def _boundary(self, step: int) -> bool:
        """Whether ``step`` logs, validates, runs the monitor or saves (or is the last): where the
        pending losses are read. The same on every process (the config's alone)."""
        cfg = self.cfg
        every = (cfg.log_every, cfg.val_every, cfg.monitor_every, cfg.checkpoint_every)
        return step == self.total_steps or any(k and step % k == 0 for k in every)

    def _stop_signal(self) -> int | None:
        """The signal to stop on at this step: with one process the one noted (a Python attribute,
        no read of the device), at every step; with several, the one the processes agreed on in
        the last reduction (at the last boundary, or this step where the loop reads every step)."""
        if self.dist.world == 1:
            return self.guard.signum if self.guard is not None else None
        return self.agreed_signal

    def _settle(self, agree: bool = True) -> None:
        """Read the pending losses and, with several processes (and ``agree``), agree on the stop
        signal: one all-reduce and one host read (:func:`.readings.reduce_readings`), none when
        there is nothing to read. Each step's loss joins the logging window in order; the first
        non-finite one stops the run (:meth:`_non_finite`) before anything after it is logged or
        saved. Called at every boundary and before every checkpoint, on every process."""
        for step, mean in zip(*self._reduce(agree), strict=True):
            if not math.isfinite(mean):
                self._non_finite(step, mean)  # deferred reads only under nonfinite=stop: it raises
            self._finite(step, mean)

    def _reduce(self, agree: bool) -> tuple[list[int], list[float]]:
        """The pending steps and their losses' means over the processes, read in one reduction with
        (several processes and ``agree``) the stop flags, whose agreed signal it keeps."""
        several = agree and self.guard is not None and self.dist.world > 1
        flags = self.guard.noted(self.dist.device) if several else None
        steps, losses = self.pending.take()
        means, counts = reduce_readings(self.dist, losses, flags)
        if flags is not None:
            self.agreed_signal = self.guard.agreed(counts)
        return steps, means

    def _finite(self, step: int, mean: float) -> None:
        """Step ``step``'s loss (the mean over its micro-batches and processes) was finite."""
        state = self.state
        state.window_loss, state.window_steps = state.window_loss + mean, state.window_steps + 1
        state.last_finite_loss, state.last_finite_step = mean, step
        state.skipped_in_row = 0

    def _checkpoint(self, started: float, partial: dict[str, Any] | None = None) -> float:
        """Save ``last.pt`` (with ``partial``: a step midway), adding the training time since
        ``started``; when the next period starts."""
        self.state.wall_s += time.monotonic() - started
        self._save(partial)
        return time.monotonic()

    def _preempted(self, signum: int, previous, started: float) -> NoReturn:
        """Stop at this step boundary for ``signum``: ``last.pt`` holds this step (saved now unless
        it was just saved), then :class:`~.preemption.Preempted` says so and how the run resumes."""
        if self.saved_step != self.state.step:
            self._checkpoint(started)
        raise Preempted(signum, self.state.step, self.total_steps, self.record.checkpoint, previous)

    def _preempted_within(self, midway: StepInterrupted, previous, started: float) -> NoReturn:
        """Stop within step ``state.step + 1`` for the guard's signal: ``last.pt`` holds the last
        whole step's state with this step's gradients so far, the loss they summed, and the data
        position and RNG states after them (nothing is applied); :class:`Preempted` says so."""
        self.state.position = self.stream.position  # the micro-batches done, as the stream served them
        partial = {
            "micro": midway.micro,
            "plan": dataclasses.asdict(self.batch),
            "loss": midway.total.detach(),
            "grads": {n: p.grad.detach() for n, p in self.raw_model.named_parameters() if p.grad is not None},
        }
        self._checkpoint(started, partial)
        within = (midway.micro, self.batch.accumulate)
        signum = self.guard.signum
        raise Preempted(signum, self.state.step, self.total_steps, self.record.checkpoint, previous, within)

    def _stop_within_step(self, started: float) -> bool:
        """Whether to stop the step now, at a micro-batch boundary: one process, a signal noted and
        the step running for :data:`.preemption.STEP_WAIT_S` or longer (a Python attribute read
        each micro-batch; the clock only once a signal is noted)."""
        guard = self.guard
        if guard is None or guard.signum is None or self.dist.world != 1:
            return False
        return time.monotonic() - started >= preemption.STEP_WAIT_S

    def _resumed_within_step(self) -> tuple[int, torch.Tensor]:
        """The first micro-batch of this step and its loss so far: ``(0, 0)``, or where the step
        ``last.pt`` holds midway stopped, its gradients put back on the parameters."""
        if self.partial is None:
            return 0, torch.zeros((), device=self.dist.device)
        partial, self.partial = self.partial, None
        grads = partial["grads"]
        for name, param in self.raw_model.named_parameters():
            param.grad = grads[name].to(param.device) if name in grads else None
        return int(partial["micro"]), partial["loss"].to(self.dist.device)

    def _stream(self) -> BatchStream:
        return BatchStream(
            self.train_set,
            self.batch.per_process,
            self.seed,
            rank=self.dist.rank,
            world=self.dist.world,
            num_workers=self.cfg.num_workers,
            collate_fn=self.task.collate_fn,
            position=self.state.position,
            repeats=self.task.repeated_aug,
            pin_memory=self.dist.device.type == "cuda",
        )

    def _optimizer_step(self, batches) -> None:
        """One optimizer update over ``accumulate`` micro-batches. Its loss stays on the device,
        pending, unless the loop reads every step (module docstring): then it is read here, with
        the stop signal, and a non-finite one skips the update or stops."""
        cfg, step = self.cfg, self.state.step + 1
        accumulate = self.batch.accumulate  # trainer.accumulate with one process
        first, total = self._resumed_within_step()
        started = time.monotonic()
        for micro in range(first, accumulate):
            batch = self.task.on_device(to_device(next(batches), self.dist.device), train=True)
            last = micro == accumulate - 1
            sync = contextlib.nullcontext() if last or self.dist.world == 1 else self.model.no_sync()
            with sync, self.autocast:
                loss = self.task.train_loss(self.model, batch) / accumulate
            loss.backward()
            total += loss.detach()
            if not last and self._stop_within_step(started):  # a long step and a signal: stop here
                raise StepInterrupted(micro + 1, total)
        self.state.position = self.stream.position
        self.pending.add(step, total)  # read at the next boundary (:meth:`_settle`), or now:
        mean = self._reduce(agree=True)[1][0] if self.reads_every_step else None
        if mean is not None and not math.isfinite(mean):
            return self._non_finite(step, mean)
        if cfg.clip_grad:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.clip_grad)
        if mean is not None:
            self._hook_metrics = self.task.after_backward(self.raw_model, step, mean)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step_update(step)
        if self.ema is not None:
            self.ema.update(self.raw_model, step=step)
        if mean is not None:
            self._finite(step, mean)

    def skip_limits(self) -> tuple[int, int]:
        """``(in a row, in all)``: how many non-finite batches ``trainer.nonfinite=skip`` skips
        before it stops; the total defaults to 1% of the run's steps (at least the first limit)."""
        in_row = self.cfg.nonfinite_limit_consecutive
        total = self.cfg.nonfinite_limit_total or max(in_row, math.ceil(0.01 * self.total_steps))
        return in_row, total

    def _non_finite(self, step: int, value: float) -> None:
        """Skip the batch of ``step`` (``trainer.nonfinite=skip``, which reads every step, up to
        :meth:`skip_limits`), or stop, naming the step, the last finite loss, the checkpoint kept
        and what resumes from it; the session counts as trained to the step before."""
        state = self.state
        self.optimizer.zero_grad(set_to_none=True)
        reason = ""
        if self.cfg.nonfinite == "skip":
            state.skipped, state.skipped_in_row = state.skipped + 1, state.skipped_in_row + 1
            in_row, total = self.skip_limits()
            if state.skipped_in_row <= in_row and state.skipped <= total:
                self._hook_metrics = {"train/skipped_batches": float(state.skipped)}  # logged at this step
                return None
            reason = (
                f" ({state.skipped_in_row} batches in a row and {state.skipped} in all skipped; limits "
                f"trainer.nonfinite_limit_consecutive={in_row}, trainer.nonfinite_limit_total={total})"
            )
        kept = (
            f"{self.record.checkpoint} (step {self.saved_step})"
            if self.saved_step is not None
            else "none yet"
        )
        last = (
            f"{state.last_finite_loss:.6g} at step {state.last_finite_step}"
            if state.last_finite_loss is not None
            else "none"
        )
        resume = (
            "To go on from that checkpoint skipping such batches, rerun the same command with "
            "trainer.nonfinite=skip (same folder; summary.json counts the skipped batches). "
            if self.saved_step is not None and not reason
            else ""
        )
        self.recorder.trained_to(step - 1)
        raise NonFiniteLoss(
            f"loss is {value} at step {step}{reason}; last finite loss {last}; checkpoint kept: {kept}. "
            f"{resume}To change the recipe (a lower optim.lr, trainer.clip_grad), start a new record: "
            "the override names a new folder, or trainer.resume=restart keeps this one and moves the "
            "record to superseded/"
        )

    def _checked_partial(self, partial: Any, path) -> dict[str, Any] | None:
        """A step ``path`` holds midway, if it fits this run: its batch split as this run splits it
        (gradients summed over one process's micro-batches cannot be shared out among others), a
        micro-batch count inside the step, a gradient of each parameter's shape and a loss. Else
        one :class:`~..record.checkpoint.CheckpointError` naming what to do."""
        if partial is None:
            return None
        step, plan = self.state.step + 1, dataclasses.asdict(self.batch)
        redo = f"move {path.name} aside to redo that step from {checkpoint.PREVIOUS}"
        shapes = {n: p.shape for n, p in self.raw_model.named_parameters()}
        fits = (
            isinstance(partial, dict)
            and isinstance(partial.get("micro"), int)
            and isinstance(partial.get("loss"), torch.Tensor)
            and partial["loss"].numel() == 1
            and isinstance(partial.get("grads"), dict)
            and all(
                isinstance(g, torch.Tensor) and g.shape == shapes.get(n) for n, g in partial["grads"].items()
            )
        )
        if not fits or partial.get("plan") is None:
            raise checkpoint.CheckpointError(
                f"checkpoint {path} holds step {step} midway in a form this run cannot resume: {redo}"
            )
        if partial["plan"] != plan or not 0 < partial["micro"] < self.batch.accumulate:
            saved = partial["plan"]
            raise checkpoint.CheckpointError(
                f"checkpoint {path} holds step {step} midway ({partial['micro']} micro-batches of {saved}); "
                f"this run splits its batch as {self.batch.text()}: resume it on the processes that saved "
                f"it, or {redo}"
            )
        return partial

    # -- evaluation, monitoring, logging -------------------------------------------------

    def evaluate(self, model: nn.Module, prefix: str = "val") -> dict[str, float]:
        """The task's metrics over the validation set (or ``eval_batches`` of it), all processes;
        computed by :func:`src.engine.loop.evaluation.evaluate`, as ``python -m src.eval`` does."""
        metrics, _ = evaluation.evaluate(
            self.task,
            model,
            self.val_set,
            self.dist,
            self.autocast,
            self.cfg.eval_batches,
            prefix,
            num_workers=self.cfg.num_workers,
        )
        return metrics

    def _validate(self) -> None:
        metrics = self._val_metrics()
        state, before = self.state, self.state.best
        state.best = kept_best(state.best, metrics, state.step, self.task.metric, self.task.metric_mode)
        state.last_val = metrics
        self._log("val", metrics)
        if state.best is not before:
            self._save_best()
        if self.dist.main:
            self.task.after_validation(
                self.raw_model, self.state.step, self.record.dir, final=self.state.step == self.total_steps
            )

    def _validate_at_start(self) -> None:
        """``trainer.val_at_start``: the validation row at step 0 (the initial weights), where every
        curve over training starts. It draws nothing from the random streams training uses (the
        RNG state is restored after it: the run's losses are the same with it or without, so the
        option is not in the identity), and it is not a candidate for ``best.pt``: the best
        checkpoint is of a trained model."""
        devices = [self.dist.device] if self.dist.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            metrics = self._val_metrics()
        self._log("val", metrics)

    def _val_metrics(self) -> dict[str, float]:
        """The model's validation metrics, and its EMA's (``val_ema/…``) where there is one."""
        metrics = self.evaluate(self.model)
        if self.ema is not None:
            metrics.update(self.evaluate(self.ema.module, prefix="val_ema"))
        return metrics

    def _at_init(self) -> None:
        """Before the first step: the monitor's row at step 0 (κ and entropy at init, which the
        claims compare) and the collapse guard's one warning."""
        values = self._monitor()
        if self.cfg.monitor_every:
            self._log("monitor", values)
        threshold = self.cfg.get("collapse_entropy")
        variants = getattr(self.raw_model, "attention_variants", ())
        message = None if threshold is None else collapse_warning(values, variants, threshold)
        if message:
            log.warning(message)

    def _monitor(self) -> dict[str, float]:
        if self._monitor_batch is None:
            loader = eval_loader(
                self.val_set,
                self.task.eval_batch_size,
                0,
                1,
                collate_fn=self.task.collate_fn,
            )
            self._monitor_batch = self.task.on_device(to_device(next(iter(loader)), self.dist.device), False)
        # in fp32 with autocast off whatever trainer.precision says: the monitor sees to it
        return self.monitor(*self.task.model_inputs(self._monitor_batch))

    def _log_train(self, throughput: float) -> dict[str, float]:
        state = self.state
        stats = {"lr": self.optimizer.param_groups[0]["lr"], "throughput": throughput}
        tokens = self.task.tokens_per_sample
        if tokens:
            stats["tokens_per_s"] = throughput * tokens
        if state.window_steps:
            stats = {"train/loss": state.window_loss / state.window_steps, **stats}
        state.window_loss, state.window_steps = 0.0, 0
        self._log("train", stats)
        return {"loss": stats.get("train/loss", math.nan), "samples/s": throughput}

    def _log(self, split: str, metrics: dict[str, float]) -> None:
        self.recorder.log(self.state.step, split, metrics)

    # -- checkpoints ---------------------------------------------------------------------

    def _save(self, partial: dict[str, Any] | None = None) -> None:
        """``last.pt`` of the state at ``state.step`` (and, with ``partial``, the next step midway)."""
        self._settle(agree=False)  # a pending non-finite loss stops here: no checkpoint after one
        state = self.state
        if not self.cfg.get("checkpoints", True):  # debug=fdr: nothing a later run could resume
            return
        if not self.dist.main:
            self.saved_step = state.step
            self.dist.barrier()
            return
        self.record.settle()  # the rows a killed session logged past the resumed step go first
        checkpoint.save(
            {
                "model": self.raw_model.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
                "ema": self.ema.state_dict() if self.ema is not None else None,
                "loop": dataclasses.asdict(state),  # position becomes {"epoch", "batch"}
                "rng": checkpoint.rng_state(),
                "task": self.task.state_dict(),
                "record": self.session.checkpoint_meta(state.step),
                **({"partial": partial} if partial is not None else {}),
            },
            self.record.checkpoint,
        )
        self.record.touched = True
        self.saved_step = state.step
        self.recorder.saved(self.record.checkpoint, state.step, self._artifact_meta())
        self.dist.barrier()

    def _save_best(self) -> None:
        """``best.pt`` (main process): the weights of the validation that just beat the best, with
        its step, metric and the record's meta; written atomically, outside last.pt's rotation."""
        if not self.dist.main or not self.cfg.get("checkpoints", True):
            return
        state = self.state
        checkpoint.save(
            {
                "model": self.raw_model.state_dict(),
                "ema": self.ema.state_dict() if self.ema is not None else None,
                "step": state.step,
                "metric": self.task.metric,
                "metric_mode": self.task.metric_mode,
                "value": state.best[self.task.metric],
                "record": self.session.checkpoint_meta(state.step),
            },
            self.record.checkpoint.with_name(checkpoint.BEST),
            keep_previous=False,
        )
        self.record.touched = True
        meta = {**self._artifact_meta(), "value": state.best[self.task.metric]}
        self.recorder.saved(self.record.checkpoint.with_name(checkpoint.BEST), state.step, meta)

    def _artifact_meta(self) -> dict[str, Any]:
        """What a checkpoint's W&B artifact says of it: the main metric, its direction, the best
        value so far (with its step) and the record's identity hash."""
        return {
            "metric": self.task.metric,
            "metric_mode": self.task.metric_mode,
            "best": self.state.best.get(self.task.metric),
            "best_step": self.state.best.get("step"),
            "identity": self.session.identity.hash,
        }

    def _resume(self) -> None:
        """Continue from the newest readable checkpoint (its identity checked), or from nothing."""
        found = checkpoint.load_latest(self.record.checkpoint, self.dist.device, set_aside=self.dist.main)
        if found is None:
            self.record.continue_after(None)  # a killed session's rows before any checkpoint go
            return
        saved, path = found
        self.session.adopt(saved.get("record"), path, saved["loop"]["step"])
        try:
            self.raw_model.load_state_dict(saved["model"])
        except RuntimeError as error:  # another architecture: missing, unexpected or reshaped weights
            raise checkpoint.CheckpointError(
                f"checkpoint {path} does not fit this model ({checkpoint.mismatch_summary(error)}); "
                "the code or the backbone changed since it was written: check out the code that wrote it "
                "(summary.json's sessions), or rerun with trainer.resume=restart to start over"
            ) from error
        self.optimizer.load_state_dict(saved["optimizer"])
        self.scheduler.load_state_dict(saved["scheduler"])
        if self.ema is not None and saved["ema"] is not None:
            self.ema.load_state_dict(saved["ema"])
        loop = saved["loop"]
        self.state = LoopState(**{**loop, "position": Position(**loop["position"])})
        self.saved_step = self.state.step
        self.partial = self._checked_partial(saved.get("partial"), path)
        checkpoint.set_rng_state(saved["rng"])
        if saved.get("task") is not None:
            self.task.load_state_dict(saved["task"])
        self.record.continue_after(self.state.step)
