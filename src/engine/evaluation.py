"""Evaluation: a task's metrics over a data set, and a run's checkpoint evaluated on a split.

One code path computes every number a run reports of a model: the loop's validation
(:meth:`src.engine.trainer.Trainer.evaluate`), the test at the end of training
(``trainer.test_after``, :func:`src.engine.shared_loop.fit_shared`) and ``python -m src.eval``
(:mod:`src.eval`). A checkpoint's evaluation is written beside the record as
``eval-<split>.json`` (:func:`write_result`); the record's own files are never rewritten.

``eval-<split>.json``::

    {"split": "test", "checkpoint": "best", "checkpoint_step": 120, "metric": "test/acc",
     "metric_mode": "max", "metrics": {"test/acc": 0.61, "test/loss": 1.2}, "samples": 2000,
     "task": "lra_listops_small", "wall_s": 3.2, "time": "…", "git": "<revision>"}
"""

from __future__ import annotations

import copy
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.utils.data import Dataset

from . import checkpoint
from .data import eval_loader, to_device
from .distributed import Dist
from .identity import git_revision
from .record import plain_json, write_atomic

if TYPE_CHECKING:
    from .task import Task

log = logging.getLogger(__name__)

CHECKPOINTS = ("best", "last")


@torch.no_grad()
def evaluate(
    task: Task,
    model: nn.Module,
    dataset: Dataset,
    dist: Dist,
    autocast: Any,
    eval_batches: int | None = None,
    prefix: str = "val",
) -> tuple[dict[str, float], int]:
    """The task's metrics over ``dataset`` (or its first ``eval_batches`` batches) on every
    process, keys ``val/…`` renamed ``<prefix>/…``, and how many examples were evaluated."""
    loader = eval_loader(dataset, task.eval_batch_size, dist.rank, dist.world, collate_fn=task.collate_fn)
    was_training, sums, samples = model.training, {}, 0
    model.eval()
    try:
        for i, batch in enumerate(loader):
            if eval_batches and i >= eval_batches:
                break
            samples += batch_size(batch)
            with autocast:
                for key, (total, count) in task.eval_sums(model, to_device(batch, dist.device)).items():
                    counted = torch.as_tensor(count, dtype=torch.float64, device=total.device)
                    pair = torch.stack([total.double(), counted])  # (2,): total, count
                    sums[key] = sums.get(key, 0) + pair
    finally:
        model.train(was_training)
    keys = sorted(sums)
    reduced = dist.all_sum(torch.stack([sums[k] for k in keys])) if keys else []  # (K, 2)
    means = {key: (t / c).item() for key, (t, c) in zip(keys, reduced, strict=True)}
    if means:
        means.update(task.derived_metrics(means))
    samples = int(dist.all_sum(torch.tensor(samples, device=dist.device)).item())
    return {key.replace("val/", f"{prefix}/", 1): value for key, value in means.items()}, samples


def batch_size(batch: Any) -> int:
    """Examples in a batch: the length of its first tensor (tuples, lists and dicts searched in order)."""
    if isinstance(batch, torch.Tensor):
        return len(batch)
    if isinstance(batch, dict):
        batch = list(batch.values())
    if isinstance(batch, (list, tuple)) and batch:
        return batch_size(batch[0])
    raise TypeError(f"cannot count the examples of a batch of type {type(batch).__name__}")


# -- a checkpoint on a split --------------------------------------------------------------


def find_checkpoint(
    run_dir: Path, which: str, note: Callable[[str], None] = log.warning, best_step: int | None = None
) -> tuple[str, Path]:
    """``(which, path)`` of the run's ``best`` or ``last`` checkpoint. ``best`` falls back, with
    one ``note``, to ``last`` where the run has no ``best.pt`` (a run older than it, or whose
    validations were never finite), or where ``best.pt`` is not of ``best_step``, the record's best
    (a killed session wrote it at a step the resumed record dropped, and the resumed session never
    beat the best it resumed with; the file is left as it is). A :class:`checkpoint.CheckpointError`
    when there is none."""
    folder = Path(run_dir) / "checkpoints"
    if which not in CHECKPOINTS:
        raise checkpoint.CheckpointError(f"checkpoint={which!r} is not one of {', '.join(CHECKPOINTS)}")
    best, last = folder / checkpoint.BEST, folder / "last.pt"
    if which == "best" and not best.is_file() and last.is_file():
        note(f"{folder} has no {checkpoint.BEST}; evaluating last.pt")
        which = "last"
    elif which == "best" and best_step is not None and last.is_file():
        saved_step = checkpoint.load(best).get("step") if best.is_file() else None
        if saved_step != best_step:
            note(
                f"{best} holds step {saved_step}, the record's best is step {best_step} (written by a "
                "session whose steps the record dropped); evaluating last.pt"
            )
            which = "last"
    path = best if which == "best" else last
    if not path.is_file():
        raise checkpoint.CheckpointError(
            f"no checkpoint {path.name} in {folder}: the run saved none "
            "(its summary.json and failures.jsonl say how far it got)"
        )
    return which, path


def load_weights(model: nn.Module, path: Path, device: torch.device) -> tuple[int, nn.Module | None]:
    """Load a ``best.pt`` or ``last.pt`` into ``model``; its step, and a copy of ``model`` with the
    checkpoint's EMA weights when it has them (else None)."""
    from .trainer import mismatch_summary  # the trainer imports this module

    saved = checkpoint.load(path, device)
    step = saved["step"] if "step" in saved else saved["loop"]["step"]
    try:
        model.load_state_dict(saved["model"])
        ema = None
        if saved.get("ema"):  # timm's ModelEmaV3 keeps the averaged model as .module
            ema = copy.deepcopy(model)
            ema.load_state_dict({k.removeprefix("module."): v for k, v in saved["ema"].items()})
    except RuntimeError as error:  # another architecture than the checkpoint's
        raise checkpoint.CheckpointError(
            f"checkpoint {path} does not fit the model built from the run's config.yaml "
            f"({mismatch_summary(error)}): the code or an override changed the architecture"
        ) from error
    return step, ema


def evaluate_checkpoint(
    task: Task,
    model: nn.Module,
    dataset: Dataset,
    split: str,
    which: str,
    path: Path,
    dist: Dist,
    autocast: Any,
    eval_batches: int | None = None,
) -> dict[str, Any]:
    """Evaluate checkpoint ``path`` (``which``: best or last) on ``dataset``, the task's ``split``:
    the content of ``eval-<split>.json`` (the EMA weights, where saved, as ``<split>_ema/…``)."""
    started = time.monotonic()
    step, ema = load_weights(model, path, dist.device)
    metrics, samples = evaluate(task, model, dataset, dist, autocast, eval_batches, prefix=split)
    if ema is not None:
        metrics.update(evaluate(task, ema, dataset, dist, autocast, eval_batches, prefix=f"{split}_ema"))
    return {
        "split": split,
        "checkpoint": which,
        "checkpoint_step": step,
        "metric": task.metric.replace("val/", f"{split}/", 1),
        "metric_mode": task.metric_mode,
        "metrics": metrics,
        "samples": samples,
        "task": task.name,
        "wall_s": round(time.monotonic() - started, 3),
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
        "git": git_revision(),
    }


def result_path(run_dir: Path, split: str) -> Path:
    return Path(run_dir) / f"eval-{split}.json"


def write_result(run_dir: Path, result: dict[str, Any]) -> Path:
    """Write ``eval-<split>.json`` into the run folder, whole or not at all; returns its path."""
    path = result_path(run_dir, result["split"])
    write_atomic(path, json.dumps(plain_json(result)[0], indent=2) + "\n")
    return path


def result_line(result: dict[str, Any], path: Path) -> str:
    """The one line that reports an evaluation: the main metric first, then the others."""
    metrics, main = result["metrics"], result["metric"]
    shown = [main, *sorted(k for k in metrics if k != main)] if main in metrics else sorted(metrics)
    values = " ".join(f"{k}={metrics[k]:.4f}" for k in shown)
    return (
        f"{result['task']} {result['split']} ({result['checkpoint']}.pt, step {result['checkpoint_step']}, "
        f"{result['samples']} samples): {values} -> {path}"
    )
