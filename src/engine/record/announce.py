"""The lines a run says about itself: one as it starts, one as it ends.

Start: what trains (task, backbone, variant with its options, seed), where its record is, and
whether it is *fresh*, *resumed from step N* or *already complete*. End: the main metric's final
value and its best with the step, the run's training time, and the run folder with the files the
run produced in it (``summary.json``, ``eval-test.json`` where the test split was evaluated, the
best checkpoint, else the last). They go through
Python logging, which Hydra sends to the console and to the run folder's ``run.log``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from src import attention

log = logging.getLogger("src.run")


def what_trains(cfg: DictConfig) -> str:
    """``digits · vit_digits · precond(eps=1e-06, detach=True, gain=False) · seed 0``."""
    options = attention.attn_options(cfg.attn)
    parts = attention.part_names(cfg.attn)
    if len(parts) == 1:
        variant = with_options(parts[0], options)
    else:
        variant = "+".join(with_options(part, options.get(part, {})) for part in parts)
    return f"{cfg.task.name} · {cfg.backbone.name} · {variant} · seed {cfg.seed}"


def with_options(name: str, options: dict[str, Any]) -> str:
    """``spectral(mode=svd, lam=10.0)``; an option left null (its default, e.g. spectral's
    ``method``) is not shown."""
    shown = ", ".join(f"{k}={v}" for k, v in options.items() if v is not None)
    return f"{name}({shown})" if shown else name


def start_line(
    cfg: DictConfig, run_dir: Path, kind: str, step: int, total: int | None = None, batch: str | None = None
) -> str:
    """What trains, how (``fresh`` or ``resumed from step N``), with which batch (the global batch
    over the processes, :meth:`.batching.BatchPlan.text`, where the loop says it) and where."""
    if kind == "resume" and step > 0:
        how = f"resumed from step {step}" + (f" of {total}" if total else "")
    elif kind == "resume":
        how = "fresh (the earlier session left no checkpoint)"
    else:
        how = "fresh"
    with_batch = f" · {batch}" if batch else ""
    return f"train {what_trains(cfg)} · {how}{with_batch} · {shown(run_dir)}"


def result_text(summary: dict[str, Any]) -> str:
    """``val/acc 0.9633 (best 0.9700 at step 400)`` from a summary."""
    metric = summary.get("metric")
    final = (summary.get("final") or {}).get(metric)
    best = summary.get("best") or {}
    text = f"{metric} {number(final)}"
    if best.get(metric) is not None:
        text += f" (best {number(best[metric])} at step {best.get('step')})"
    return text


#: What :func:`end_line` names of the run folder, where it exists; of each group, the first found.
PRODUCED = (
    ("summary.json",),
    ("eval-test.json",),
    ("checkpoints/best.pt", "checkpoints/last.pt"),
    ("sandbox/index.html",),  # task=modadd's page: every frame behind a slider (src.sandbox.page)
)


def end_line(summary: dict[str, Any], run_dir: Path) -> str:
    """The main metric, final and best, the steps and training time, the run folder and what the
    run wrote there (:data:`PRODUCED`): ``… · outputs/runs/…/seed=0: summary.json, eval-test.json,
    checkpoints/best.pt``."""
    wall = summary.get("wall_s")
    took = f" in {clock(wall)}" if isinstance(wall, (int, float)) else ""
    found = [next((n for n in group if (Path(run_dir) / n).exists()), None) for group in PRODUCED]
    files = ", ".join(n for n in found if n)
    return f"done: {result_text(summary)} · {summary.get('steps')} steps{took} · {shown(run_dir)}: {files}"


def complete_line(cfg: DictConfig, summary: dict[str, Any], run_dir: Path) -> str:
    """A rerun of a completed record: what it holds and how to train it again."""
    return (
        f"already complete: {what_trains(cfg)} · {result_text(summary)}, {summary.get('steps')} steps · "
        f"{shown(run_dir / 'summary.json')}. Nothing to train; to start over add trainer.resume=restart "
        "(the record moves to superseded/, nothing is deleted)"
    )


def shown(path: Path) -> str:
    """``path`` relative to the working folder when it lies inside it (Hydra's run folders are
    absolute), else as it is."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def number(value: Any) -> str:
    return f"{value:.4f}" if isinstance(value, (int, float)) else str(value)


def announce(line: str) -> None:
    log.info(line)


def clock(seconds: float) -> str:
    """``h:mm:ss`` or ``m:ss``."""
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"
