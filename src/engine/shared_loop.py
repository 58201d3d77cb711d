"""The shared loop's assembly: what :meth:`Task.fit <src.engine.task.Task.fit>` does by default.

The task builds its data and model; the variant is applied; optimizer, schedule and EMA come
from their config groups; :class:`~src.engine.trainer.Trainer` trains. Classification, LRA, LM
and the sandbox train here; detection overrides ``fit`` with mmengine's Runner.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from timm.utils import ModelEmaV3

from src import attention

from .optim import build_optimizer, build_scheduler
from .trainer import Trainer

if TYPE_CHECKING:
    from .task import Run, Task


def fit_shared(task: Task, run: Run) -> dict[str, Any]:
    """Build model, variant, optimizer, schedule and the shared loop, train; what it reached."""
    cfg, dist = run.cfg, run.dist
    datasets = task.datasets(Path(cfg.paths.data_dir))
    model = task.build_model(cfg.backbone)
    attention.apply(model, attention.variant_from_config(cfg.attn))  # checked and completed by train()
    model.to(dist.device)
    steps_per_epoch = max(1, len(datasets[0]) // (task.batch_size * dist.world * cfg.trainer.accumulate))
    total_steps = cfg.trainer.max_steps or cfg.trainer.max_epochs * steps_per_epoch
    trainer_cfg = cfg.trainer.copy()
    if cfg.trainer.get("val_every_epochs"):  # validate per epoch (P4's convergence table)
        trainer_cfg.val_every = max(1, round(cfg.trainer.val_every_epochs * steps_per_epoch))
    optimizer = build_optimizer(cfg.optim, model)
    scheduler = build_scheduler(cfg.sched, optimizer, total_steps, steps_per_epoch)
    ema = ModelEmaV3(model, decay=cfg.trainer.ema) if cfg.trainer.ema else None

    run.recorder.start()
    trainer = Trainer(
        trainer_cfg,
        task,
        model,
        optimizer,
        scheduler,
        datasets,
        run.session,
        dist,
        seed=cfg.seed,
        total_steps=total_steps,
        recorder=run.recorder,
        ema=ema,
    )
    started = time.monotonic()
    state = trainer.fit()
    return {
        "steps": state.step,
        "final": state.last_val or trainer.evaluate(trainer.model),
        "best": state.best,
        "skipped_batches": state.skipped,
        "wall_s": state.wall_s,
        "session_s": time.monotonic() - started,
        "steps_per_epoch": steps_per_epoch,
        "params": sum(p.numel() for p in model.parameters()),
        "device": str(dist.device),
    }
