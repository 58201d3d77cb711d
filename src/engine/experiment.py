"""One run from a composed config: check it, build task, model, variant, optimizer, schedule
and loop from their groups, train, and write the record.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from timm.utils import ModelEmaV3

from src import attention
from src.errors import ConfigError

from .distributed import Dist
from .numerics import flush_denormals
from .optim import build_optimizer, build_scheduler
from .record import RunRecord, WandbLogger, git_revision
from .schema import check_values
from .seeding import seed_everything
from .trainer import Trainer

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"


def train(cfg: DictConfig, run_dir: Path | str) -> dict[str, Any]:
    """Train as ``cfg`` says, recording in ``run_dir``; returns the summary."""
    check_values(cfg)
    check_compatible(cfg)
    dist = Dist.setup(cfg.trainer.device)
    record = RunRecord(Path(run_dir), enabled=dist.main)
    wandb, trainer, task = None, None, None
    threads = torch.get_num_threads()
    flushed = flush_denormals(bool(cfg.trainer.get("flush_denormal")) and dist.device.type == "cpu")
    try:
        if cfg.trainer.get("threads"):  # tiny models run fastest on one CPU thread
            torch.set_num_threads(cfg.trainer.threads)
        task = instantiate(cfg.task)
        seed_everything(cfg.seed)
        if callable(getattr(task, "run", None)):  # a task with its own loop (detection: mmengine's Runner)
            record.write_config(cfg)
            if cfg.logger.name == "wandb" and dist.main:
                wandb = WandbLogger(cfg.logger, record.dir, OmegaConf.to_container(cfg, resolve=True))
            reached = task.run(cfg, record, dist, wandb)
            summary = {**run_identity(cfg, task), **reached, "world_size": dist.world}
            summary.update(git=git_revision(), status="completed")
            record.write_summary(summary)
            if wandb is not None:
                wandb.finish({f"final/{k}": v for k, v in summary["final"].items()})
                wandb = None
            return summary
        datasets = task.datasets(Path(cfg.paths.data_dir))
        model = task.build_model(cfg.backbone)
        attention.apply(model, instantiate(cfg.attn))
        model.to(dist.device)
        steps_per_epoch = max(1, len(datasets[0]) // (task.batch_size * dist.world * cfg.trainer.accumulate))
        total_steps = cfg.trainer.max_steps or cfg.trainer.max_epochs * steps_per_epoch
        trainer_cfg = cfg.trainer.copy()
        if cfg.trainer.get("val_every_epochs"):  # validate per epoch (P4's convergence table)
            trainer_cfg.val_every = max(1, round(cfg.trainer.val_every_epochs * steps_per_epoch))
        optimizer = build_optimizer(cfg.optim, model)
        scheduler = build_scheduler(cfg.sched, optimizer, total_steps, steps_per_epoch)
        ema = ModelEmaV3(model, decay=cfg.trainer.ema) if cfg.trainer.ema else None

        record.write_config(cfg)
        if cfg.logger.name == "wandb" and dist.main:
            wandb = WandbLogger(cfg.logger, record.dir, OmegaConf.to_container(cfg, resolve=True))
        trainer = Trainer(
            trainer_cfg,
            task,
            model,
            optimizer,
            scheduler,
            datasets,
            record,
            dist,
            seed=cfg.seed,
            total_steps=total_steps,
            wandb=wandb,
            ema=ema,
        )
        started = time.monotonic()
        state = trainer.fit()
        final = state.last_val or trainer.evaluate(trainer.model)
        summary = {
            **run_identity(cfg, task),
            "steps": state.step,
            "final": final,
            "best": state.best,
            "skipped_batches": state.skipped,
            "wall_s": state.wall_s,
            "session_s": time.monotonic() - started,
            "steps_per_epoch": steps_per_epoch,
            "params": sum(p.numel() for p in model.parameters()),
            "world_size": dist.world,
            "device": str(dist.device),
            "git": git_revision(),
            "status": "completed",
        }
        record.write_summary(summary)
        if wandb is not None:
            wandb.finish({f"final/{k}": v for k, v in final.items()})
            wandb = None
        return summary
    except Exception as error:
        if record.enabled and (record.dir / "config.yaml").exists():  # the report lists it, with its error
            record.write_summary(failure_summary(cfg, trainer, error))
        raise
    finally:
        if wandb is not None:
            wandb.finish()
        dist.close()
        torch.set_num_threads(threads)
        flush_denormals(flushed)


def run_identity(cfg: DictConfig, task) -> dict[str, Any]:
    """The summary's keys that say what the run was (the same for every task)."""
    return {
        "task": task.name,
        "backbone": cfg.backbone.name,
        "attn": cfg.attn.variant,
        "attn_options": {k: v for k, v in OmegaConf.to_container(cfg.attn).items() if not k.startswith("_")},
        "seed": cfg.seed,
        "metric": task.metric,
        "metric_mode": task.metric_mode,
    }


def failure_summary(cfg: DictConfig, trainer: Trainer | None, error: Exception) -> dict[str, Any]:
    """What a failed run leaves in ``summary.json``: what it was, how far it got, the error line."""
    message = str(error).strip().splitlines()
    return {
        "task": cfg.task.name,
        "backbone": cfg.backbone.name,
        "attn": cfg.attn.variant,
        "seed": cfg.seed,
        "steps": trainer.state.step if trainer is not None else 0,
        "metric": cfg.task.get("metric"),
        "status": "failed",
        "error": f"{type(error).__name__}: {message[0] if message else ''}",
        "git": git_revision(),
    }


def check_compatible(cfg: DictConfig) -> None:
    """Fail before any work when the backbone cannot serve the task, naming both sides."""
    task, backbone = cfg.task, cfg.backbone
    reason = None
    if backbone.kind != task.input:
        reason = f"it takes {backbone.kind} inputs and the task gives {task.input} inputs"
    elif task.input == "image" and task.img_size < backbone.min_img_size:
        reason = (
            f"it needs images of at least {backbone.min_img_size} px and the task's are {task.img_size} px"
        )
    if reason:
        raise ConfigError(
            f"task={task.name} and backbone={backbone.name} are incompatible: {reason}. "
            f"Backbones for task={task.name}: {', '.join(compatible_backbones(task))}"
        )
    allowed = backbone.get("attn_variants")  # optional: the variants a backbone takes (absent: all)
    if allowed is not None and cfg.attn.variant not in allowed:
        note = f": {backbone.attn_note}" if backbone.get("attn_note") else ""
        raise ConfigError(
            f"attn={cfg.attn.variant} does not apply to backbone={backbone.name}{note}. "
            f"Variants for backbone={backbone.name}: {', '.join(allowed)}"
        )


def compatible_backbones(task: DictConfig) -> list[str]:
    """The names of the ``conf/backbone`` files that can serve ``task``."""
    names = []
    for path in sorted((CONF_DIR / "backbone").glob("*.yaml")):
        b = OmegaConf.load(path)
        if b.kind == task.input and (task.input != "image" or task.img_size >= b.min_img_size):
            names.append(path.stem)
    return names
