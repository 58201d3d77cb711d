"""The run record's rows, written from inside mmengine's Runner by one hook.

:class:`SuiteRecordHook` logs through the run's :class:`src.engine.record.recorder.Recorder`, as the
shared loop does (the same ``metrics.jsonl`` and W&B run; ``step`` is mmengine's iteration,
one batch per process):

* ``split: train`` every ``log_every`` iterations: the window's mean of each loss the
  detector returns (``train/loss``, ``train/loss_rpn_cls``, …, ``train/loss_mask``),
  ``lr`` and ``throughput`` (images/s);
* ``split: val`` after each validation: mmdet's COCO metrics (``coco/bbox_mAP``,
  ``coco/segm_mAP``, ``coco/bbox_mAP_50``, …); when the detector predicts no box at all, mmdet
  reports nothing and the row says 0 for the main metrics (COCO's AP of an empty prediction);
* ``split: monitor`` every ``monitor_every`` iterations: the conditioning monitor
  (:class:`src.conditioning.ConditioningMonitor`) on the backbone, fed the first validation
  batch as the detector's data preprocessor makes it.

Checkpoints are mmengine's (``mmdet/iter_N.pth`` or ``epoch_N.pth``, the latest kept);
``checkpoints/last.pt`` is a relative link to the latest, so the suite's contract holds: a
rerun of the same command finds it and resumes (mmengine's ``resume``: weights, optimizer,
schedule, iteration, data position). The hook adds to each checkpoint the wall time so far,
torch's RNG state and the record's identity and sessions (:class:`src.engine.record.session.Session`),
and restores the RNG state at the first iteration after a resume; validation and the monitor
run with the RNG forked, so they never move it. On a CPU a resumed run then continues as the
uninterrupted one would. After a resume, ``metrics.jsonl`` continues at the checkpoint's
iteration and the best and last validation are read from it.

mmengine keeps its message hub's history buffers in each checkpoint; pickled as they are,
they refer to ``getattr`` (their statistics methods), which no safe loader should admit. The
hook saves them as :class:`PlainHistoryBuffer`, which pickles its numbers only, so the
checkpoints load under ``weights_only`` with a short list of data types
(:mod:`.checkpoints`).
"""

from __future__ import annotations

import contextlib
import os
import time
import warnings
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from mmengine.hooks import Hook
from mmengine.logging import HistoryBuffer
from mmengine.model import is_model_wrapper

from src.conditioning import ConditioningMonitor
from src.engine.record.files import read_metrics
from src.engine.record.recorder import Recorder, kept_best


class SuiteRecordHook(Hook):
    """Writes the run record (see the module docstring); runs after mmengine's checkpoint hook."""

    priority = "LOWEST"

    def __init__(
        self,
        recorder: Recorder,
        metric: str,
        metric_mode: str,
        required: Sequence[str],
        log_every: int,
        monitor_every: int,
        images_per_iter: int,
        resume_from: Path | None = None,
    ) -> None:
        self.recorder, self.session, self.record = recorder, recorder.session, recorder.record
        self.resume_from = resume_from  # the checkpoint mmengine resumes from (for messages)
        self.metric, self.metric_mode = metric, metric_mode
        self.required = list(dict.fromkeys([metric, *required]))  # in every validation row
        self.log_every, self.monitor_every, self.images_per_iter = log_every, monitor_every, images_per_iter
        self.best: dict[str, float] = {}
        self.last_val: dict[str, float] = {}
        self.wall_s = 0.0  # before this session
        self.session_start = time.monotonic()
        self.window: dict[str, float] = defaultdict(float)
        self.window_iters, self.window_start = 0, time.monotonic()
        self.rng_to_restore: dict[str, Any] | None = None
        self.monitor: ConditioningMonitor | None = None
        self.monitor_inputs: torch.Tensor | None = None
        self.linked: str | None = None
        self._val_rng: contextlib.ExitStack | None = None

    # -- training ----------------------------------------------------------------------------

    def before_train(self, runner) -> None:
        self.session_start = self.window_start = time.monotonic()
        self.record.continue_after(runner.iter or None)  # the rows past the checkpoint are written again
        self.recorder.begin(runner.iter, runner.max_iters)
        if runner.iter > 0 and self.record.enabled:
            for row in read_metrics(self.record.dir):
                if row["split"] == "val" and row["step"] <= runner.iter:
                    self._keep_val(row["step"], {k: v for k, v in row.items() if k not in ("step", "split")})

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        if self.rng_to_restore is not None:  # the first iteration after a resume
            torch.set_rng_state(self.rng_to_restore["torch"])
            if "cuda" in self.rng_to_restore and torch.cuda.is_available():
                torch.cuda.set_rng_state_all(self.rng_to_restore["cuda"])
            self.rng_to_restore = None

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        step = runner.iter + 1
        for key, value in (outputs or {}).items():  # the detector's losses, as tensors
            self.window[key] += float(value.detach() if isinstance(value, torch.Tensor) else value)
        self.window_iters += 1
        if step % self.log_every == 0 or step == runner.max_iters:
            self._log_train(runner, step)
        if self.monitor_every and step % self.monitor_every == 0 and self.record.enabled:
            self.recorder.log(step, "monitor", self._monitor(runner))
        self._link_checkpoint(runner)

    def after_train_epoch(self, runner) -> None:
        self._link_checkpoint(runner)

    def after_train(self, runner) -> None:
        self._link_checkpoint(runner)

    def _log_train(self, runner, step: int) -> None:
        elapsed = max(time.monotonic() - self.window_start, 1e-9)
        means = {f"train/{k}": v / self.window_iters for k, v in self.window.items()}
        lr = runner.optim_wrapper.get_lr()["lr"][0]
        self.recorder.log(
            step,
            "train",
            {**means, "lr": lr, "throughput": self.window_iters * self.images_per_iter / elapsed},
        )
        self.window, self.window_iters, self.window_start = defaultdict(float), 0, time.monotonic()

    # -- validation ----------------------------------------------------------------------------

    def before_val(self, runner) -> None:
        self._val_rng = contextlib.ExitStack()
        self._val_rng.enter_context(fork_rng())

    def after_val_epoch(self, runner, metrics: dict[str, float] | None = None) -> None:
        values = {k: float(v) for k, v in (metrics or {}).items() if isinstance(v, (int, float))}
        missing = [k for k in self.required if k not in values]
        if missing:  # mmdet's COCO metric returns nothing when no box was predicted: that is AP 0
            values.update(dict.fromkeys(missing, 0.0))
        self._keep_val(runner.iter, values)
        self.recorder.log(runner.iter, "val", values)

    def after_val(self, runner) -> None:
        if self._val_rng is not None:
            self._val_rng.close()
            self._val_rng = None

    def _keep_val(self, step: int, values: dict[str, float]) -> None:
        self.last_val = values
        self.best = kept_best(self.best, values, step, self.metric, self.metric_mode)

    # -- the monitor ---------------------------------------------------------------------------

    def _monitor(self, runner) -> dict[str, float]:
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        with fork_rng():
            if self.monitor is None:
                self.monitor = ConditioningMonitor(model.backbone)
                batch = next(iter(runner.val_dataloader))
                with torch.no_grad():
                    self.monitor_inputs = model.data_preprocessor(batch, False)["inputs"]  # (B, 3, H, W)
            return self.monitor(self.monitor_inputs)

    # -- checkpoints ---------------------------------------------------------------------------

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        state = {"torch": torch.get_rng_state()}
        if torch.cuda.is_available():
            state["cuda"] = torch.cuda.get_rng_state_all()
        step = checkpoint.get("meta", {}).get("iter", runner.iter)
        checkpoint.setdefault("meta", {})["suite"] = {
            "wall_s": self.elapsed(),
            "rng": state,
            "record": self.session.checkpoint_meta(step),
        }
        hub = checkpoint.get("message_hub") or {}
        for value in (hub.get("log_scalars") or {}).values():
            if type(value) is HistoryBuffer:  # its own copy: the live hub keeps its class
                value.__class__ = PlainHistoryBuffer
        self.record.settle()
        self.record.touched = True

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        meta = checkpoint.get("meta", {})
        saved = meta.get("suite")
        if saved is not None:
            self.wall_s, self.rng_to_restore = saved["wall_s"], saved["rng"]
        where = self.resume_from or Path(runner.work_dir)
        self.session.adopt((saved or {}).get("record"), where, int(meta.get("iter", 0)))

    def elapsed(self) -> float:
        """Training wall time, this session and the ones before it."""
        return self.wall_s + time.monotonic() - self.session_start

    def _link_checkpoint(self, runner) -> None:
        """Point ``checkpoints/last.pt`` at the checkpoint mmengine saved last."""
        if not self.record.enabled:
            return
        target = pointed_checkpoint(Path(runner.work_dir))
        if target is None or str(target) == self.linked:
            return
        link = self.record.checkpoint
        link.parent.mkdir(parents=True, exist_ok=True)
        tmp = link.with_name(link.name + ".tmp")
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(os.path.relpath(target, link.parent.resolve()))
        os.replace(tmp, link)
        self.linked = str(target)


class PlainHistoryBuffer(HistoryBuffer):
    """A :class:`HistoryBuffer` that pickles its numbers only (not its statistics methods, which
    unpickling restores); mmengine's ``isinstance`` checks accept it."""

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "statistics_methods"}


def pointed_checkpoint(work_dir: Path) -> Path | None:
    """The checkpoint mmengine's ``last_checkpoint`` pointer names, when it is a file inside
    ``work_dir`` (a pointer elsewhere is ignored with a warning: it is not this run's)."""
    pointer = work_dir / "last_checkpoint"
    if not pointer.is_file():
        return None
    target = Path(pointer.read_text().strip()).resolve()
    if not target.is_relative_to(work_dir.resolve()):
        warnings.warn(f"{pointer} points outside the run folder ({target}): ignored", stacklevel=2)
        return None
    return target if target.is_file() else None


@contextlib.contextmanager
def fork_rng():
    """Run a block without moving torch's RNG (CPU and CUDA)."""
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        yield
