"""The shared loop's assembly: how a task trains unless it has a loop of its own
(:meth:`Task.fit <src.engine.task.Task.fit>`); :func:`src.engine.experiment.train` calls it.

The task builds its data, then its model with the variant applied (:func:`.prepared.prepared`);
optimizer, schedule and EMA come from their config groups; :class:`~src.engine.loop.trainer.Trainer`
trains. Classification, LRA, LM and the sandbox train here; detection overrides ``fit`` with
mmengine's Runner.

With ``trainer.test_after`` (best or last), the checkpoint it names is evaluated on the task's
test split when training ends (:mod:`.evaluation`, as ``python -m src.eval`` does): written to
``eval-test.json`` and returned under ``test``, so that ``summary.json`` has it; with
``trainer.checkpoints=false`` (``debug=fdr``) the weights in memory are tested instead.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig
from timm.utils import ModelEmaV3

from src.errors import DataError, message_of

from . import evaluation
from .batching import plan_batch
from .data import epoch_samples
from .optim import build_optimizer, build_scheduler
from .prepared import prepared
from .trainer import Trainer

if TYPE_CHECKING:
    from ..task import Run, Task

log = logging.getLogger(__name__)


def fit_shared(task: Task, run: Run) -> dict[str, Any]:
    """Build model, variant, optimizer, schedule and the shared loop, train; what it reached."""
    cfg, dist = run.cfg, run.dist
    batch = plan_batch(task.batch_size, cfg.trainer.accumulate, dist.world)  # refuses a world it cannot keep
    # the variant train() built as it checked cfg.attn; a step of more than an epoch refused before the model
    _, datasets, model = prepared(cfg, task, variant=run.variant, batch=batch, device=dist.device)
    # the same on any number of processes; repeated augmentation's epoch is DeiT's (loop/data.py)
    steps_per_epoch = max(1, epoch_samples(len(datasets[0]), task.repeated_aug) // batch.global_batch)
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
        batch=batch,
    )
    started = time.monotonic()
    state = trainer.fit()
    final = state.last_val or trainer.evaluate(trainer.model)
    test = test_after_training(task, trainer, cfg)
    return {
        "steps": state.step,
        "final": final,
        "best": state.best,
        **({"test": test} if test is not None else {}),
        "skipped_batches": state.skipped,
        "wall_s": state.wall_s,
        "session_s": time.monotonic() - started,
        "steps_per_epoch": steps_per_epoch,
        "batch": dataclasses.asdict(batch),
        "params": sum(p.numel() for p in model.parameters()),
        "device": str(dist.device),
    }


def test_after_training(task: Task, trainer: Trainer, cfg: DictConfig) -> dict[str, float] | None:
    """``trainer.test_after``: the test metrics of the checkpoint it names (best or last), written
    to ``eval-test.json`` by the main process; None when it is off or the task has no test split.
    Loads that checkpoint into the trained model, so it comes after everything else."""
    which = cfg.trainer.get("test_after")
    if not which:
        return None
    if "test" not in task.eval_splits:
        log.info("trainer.test_after=%s: task %s has no test split; nothing to test", which, task.name)
        return None
    run_dir, dist = trainer.record.dir, trainer.dist
    note = log.warning if dist.main else lambda _: None
    identity = trainer.session.identity.hash
    if cfg.trainer.get("checkpoints", True):
        opened = evaluation.open_checkpoint(
            run_dir,
            which,
            note,
            best_step=trainer.state.best.get("step"),
            identity=identity,
            foreign="fallback",  # a best.pt copied in from elsewhere: test last.pt, the run stands
            set_aside=dist.main,
        )
    else:  # debug=fdr saved nothing: the test step runs on the weights in memory (the last)
        opened = evaluation.in_memory(trainer.raw_model, trainer.ema, trainer.state.step)
    data_dir = Path(cfg.paths.data_dir)
    try:
        dataset = task.eval_dataset(data_dir, "test")
    except DataError as missing:  # a copy of the data without its test files: the run stands
        if dist.main:
            log.warning(
                "trainer.test_after=%s: no test numbers (%s); python -m src.eval %s split=test once the "
                "files are there",
                which,
                message_of(missing).splitlines()[0],
                run_dir,
            )
        return None
    model, batches = trainer.raw_model, cfg.trainer.eval_batches
    result = evaluation.evaluate_checkpoint(
        task, model, dataset, "test", opened, dist, trainer.autocast, batches, cfg.trainer.num_workers
    )
    result.update(identity=identity, record_identity=identity, overrides=[], data_dir=str(data_dir.resolve()))
    if dist.main:
        written = evaluation.write_result(run_dir, result)
        log.info("test: %s", evaluation.result_line(result, written))
    return result["metrics"]
