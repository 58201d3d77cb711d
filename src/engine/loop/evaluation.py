"""Evaluation: a task's metrics over a data set, and a run's checkpoint evaluated on a split.

One code path computes every number a run reports of a model: the loop's validation
(:meth:`src.engine.loop.trainer.Trainer.evaluate`), the test at the end of training
(``trainer.test_after``, :func:`src.engine.loop.shared_loop.fit_shared`) and ``python -m src.eval``
(:mod:`src.eval`). A checkpoint's evaluation is written beside the record as
``eval-<split>.json`` (:func:`write_result`); the record's own files are never rewritten.

``eval-<split>.json``::

    {"split": "test", "checkpoint": "best", "checkpoint_file": "best.pt", "checkpoint_step": 120,
     "metric": "test/acc", "metric_mode": "max", "metrics": {"test/acc": 0.61, "test/loss": 1.2},
     "samples": 2000, "task": "lra_listops_small", "identity": "<hash>", "record_identity": "<hash>",
     "overrides": [], "data_dir": "/abs/data", "wall_s": 3.2, "time": "…", "git": "<revision>"}

``identity`` is the hash of the configuration evaluated and ``record_identity`` the record's
(:mod:`..record.identity`); they differ where an override changed what is measured (``task.val_fraction``,
another ``paths.data_dir``), and such a result goes to ``eval-<split>.<identity>.json`` instead, so
that the report, which uses an evaluation only where the two agree, never takes it for the run's.
"""

from __future__ import annotations

import copy
import json
import logging
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.utils.data import Dataset

from ..distributed import Dist
from ..record import checkpoint
from ..record.files import plain_json, write_atomic
from ..record.identity import git_revision
from .data import eval_loader, to_device

if TYPE_CHECKING:
    from ..task import Task

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
    num_workers: int = 0,
) -> tuple[dict[str, float], int]:
    """The task's metrics over ``dataset`` on every process, keys ``val/…`` renamed ``<prefix>/…``,
    and how many examples were evaluated. ``eval_batches``: only the set's first
    ``eval_batches × task.eval_batch_size`` examples, shared among the processes, so that any
    number of processes evaluates the same examples. ``num_workers`` load them (pinned for CUDA)."""
    limit = eval_batches * task.eval_batch_size if eval_batches else None
    loader = eval_loader(
        dataset,
        task.eval_batch_size,
        dist.rank,
        dist.world,
        num_workers=num_workers,
        collate_fn=task.collate_fn,
        limit=limit,
        pin_memory=dist.device.type == "cuda",
    )
    was_training, sums, samples = model.training, {}, 0
    model.eval()
    try:
        for batch in loader:
            samples += batch_size(batch)
            batch = task.on_device(to_device(batch, dist.device), train=False)
            with autocast:
                for key, (total, count) in task.eval_sums(model, batch).items():
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


@dataclass
class Opened:
    """A checkpoint opened for evaluation: which one (``best`` or ``last``), the file it came from
    (``previous.pt`` where ``last.pt`` was unreadable), what it holds, and its step."""

    which: str
    path: Path
    state: dict[str, Any]
    step: int


def open_checkpoint(
    run_dir: Path,
    which: str,
    note: Callable[[str], None] = log.warning,
    best_step: int | None = None,
    identity: str | Collection[str] | None = None,
    foreign: str = "refuse",
    set_aside: bool = True,
) -> Opened:
    """The run's ``best`` or ``last`` checkpoint, read once and checked.

    ``best`` falls back, with one ``note``, to ``last`` where the run has no ``best.pt`` (a run
    older than it, or whose validations were never finite), where it is unreadable (moved to
    ``best.pt.corrupt``), or where it is not of ``best_step``, the record's best (a killed session
    wrote it at a step the resumed record dropped; the file is left as it is). ``last`` falls back
    to ``previous.pt`` where ``last.pt`` is unreadable (:func:`checkpoint.load_latest`).

    A checkpoint carries the identity of the record that wrote it: one of another ``identity``
    (a file copied in from another run) is refused (``foreign="refuse"``, a
    :class:`checkpoint.CheckpointError`), or, for ``best``, passed over for ``last`` with a note
    (``foreign="fallback"``: the test at the end of training must not fail the run). A
    :class:`checkpoint.CheckpointError` when no checkpoint can be read."""
    folder = Path(run_dir) / "checkpoints"
    if which not in CHECKPOINTS:
        raise checkpoint.CheckpointError(f"checkpoint={which!r} is not one of {', '.join(CHECKPOINTS)}")
    last = folder / "last.pt"
    if which == "best":
        best = _open_best(folder, note, best_step, identity, foreign, set_aside)
        if best is not None:
            return best
    found = checkpoint.load_latest(last, set_aside=set_aside, note=note)
    if found is None:
        raise checkpoint.CheckpointError(
            f"no checkpoint {last.name} in {folder}: the run saved none "
            "(its summary.json and failures.jsonl say how far it got)"
        )
    state, path = found
    check_owner(state, path, identity)
    return Opened("last", path, state, state["loop"]["step"])


def in_memory(model: nn.Module, ema: nn.Module | None, step: int) -> Opened:
    """The weights a run holds in memory at ``step``, opened as ``last`` would be: what the test at
    the end of training evaluates when the run writes no checkpoint (``trainer.checkpoints=false``)."""
    state = {"model": model.state_dict(), "ema": ema.state_dict() if ema is not None else None}
    return Opened("last", Path("(in memory: trainer.checkpoints=false)"), state, step)


def _open_best(
    folder: Path,
    note: Callable[[str], None],
    best_step: int | None,
    identity: str | Collection[str] | None,
    foreign: str,
    set_aside: bool,
) -> Opened | None:
    """``best.pt`` opened (see :func:`open_checkpoint`), or None (with one note) to fall back."""
    path, last = folder / checkpoint.BEST, folder / "last.pt"
    if not path.is_file():
        if last.exists():
            note(f"{folder} has no {checkpoint.BEST}; evaluating last.pt")
        return None
    state = checkpoint.load_best(
        path, set_aside=set_aside, note=lambda line: note(f"{line}; evaluating last.pt")
    )
    if state is None:
        return None
    try:
        check_owner(state, path, identity)
    except checkpoint.CheckpointError as error:
        if foreign == "refuse" or not last.exists():
            raise
        note(f"{error}; evaluating last.pt")
        return None
    if best_step is not None and state["step"] != best_step and last.exists():
        note(
            f"{path} holds step {state['step']}, the record's best is step {best_step} (written by a "
            "session whose steps the record dropped); evaluating last.pt"
        )
        return None
    return Opened("best", path, state, state["step"])


def check_owner(state: dict[str, Any], path: Path, identity: str | Collection[str] | None) -> None:
    """A :class:`checkpoint.CheckpointError` when the checkpoint says it was written for another
    identity than ``identity`` (the record's hash, or the hashes it may go by); a checkpoint from
    before identities says nothing, and passes."""
    owner = (state.get("record") or {}).get("identity")
    owners = {identity} if isinstance(identity, str) else set(identity or ())
    if owners and owner is not None and owner not in owners:
        shown = " or ".join(sorted(owners))
        raise checkpoint.CheckpointError(
            f"{path} was written by another run (identity {owner}; this record's is {shown}): a "
            "checkpoint copied in from elsewhere is not this run's result. Put this run's own file back, "
            "or evaluate checkpoint=last"
        )


def load_weights(model: nn.Module, opened: Opened) -> nn.Module | None:
    """Load an opened checkpoint's weights into ``model``; a copy of ``model`` with its EMA
    weights when it has them (else None)."""
    saved = opened.state
    try:
        model.load_state_dict(saved["model"])
        ema = None
        if saved.get("ema"):  # timm's ModelEmaV3 keeps the averaged model as .module
            ema = copy.deepcopy(model)
            ema.load_state_dict({k.removeprefix("module."): v for k, v in saved["ema"].items()})
    except RuntimeError as error:  # another architecture than the checkpoint's
        raise checkpoint.CheckpointError(
            f"checkpoint {opened.path} does not fit the model built from the run's config.yaml "
            f"({checkpoint.mismatch_summary(error)}): the code or an override changed the architecture"
        ) from error
    return ema


def evaluate_checkpoint(
    task: Task,
    model: nn.Module,
    dataset: Dataset,
    split: str,
    opened: Opened,
    dist: Dist,
    autocast: Any,
    eval_batches: int | None = None,
    num_workers: int = 0,
) -> dict[str, Any]:
    """Evaluate an opened checkpoint on ``dataset``, the task's ``split``: the content of
    ``eval-<split>.json`` (the EMA weights, where saved, as ``<split>_ema/…``)."""
    started = time.monotonic()
    model.to(dist.device)
    ema = load_weights(model, opened)
    common = dict(eval_batches=eval_batches, num_workers=num_workers)
    metrics, samples = evaluate(task, model, dataset, dist, autocast, prefix=split, **common)
    if ema is not None:
        metrics.update(evaluate(task, ema, dataset, dist, autocast, prefix=f"{split}_ema", **common)[0])
    return {
        "split": split,
        "checkpoint": opened.which,
        "checkpoint_file": opened.path.name,
        "checkpoint_step": opened.step,
        "metric": task.metric.replace("val/", f"{split}/", 1),
        "metric_mode": task.metric_mode,
        "metrics": metrics,
        "samples": samples,
        "task": task.name,
        "wall_s": round(time.monotonic() - started, 3),
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
        "git": git_revision(),
    }


def result_path(run_dir: Path, split: str, identity: str | None = None) -> Path:
    """``eval-<split>.json``; ``eval-<split>.<identity>.json`` for an evaluation of another
    configuration than the record's (an override that changes what is measured)."""
    return Path(run_dir) / (f"eval-{split}.json" if identity is None else f"eval-{split}.{identity}.json")


def write_result(run_dir: Path, result: dict[str, Any]) -> Path:
    """Write the result into the run folder, whole or not at all; returns its path: ``eval-<split>.json``
    where it measured the record's own configuration, else beside it (:func:`result_path`), so that
    an evaluation with other settings never replaces the run's own."""
    own = result.get("identity") == result.get("record_identity")
    path = result_path(run_dir, result["split"], None if own else result.get("identity"))
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
