"""One run from a composed config: check it, build task, model, variant, optimizer, schedule
and loop from their groups, train, and write the record.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from timm.utils import ModelEmaV3

from src import attention
from src.errors import ConfigError

from .distributed import Dist
from .optim import build_optimizer, build_scheduler
from .record import RunRecord, WandbLogger, git_revision
from .seeding import seed_everything
from .trainer import Trainer

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"


def train(cfg: DictConfig, run_dir: Path | str) -> dict[str, Any]:
    """Train as ``cfg`` says, recording in ``run_dir``; returns the summary."""
    check_compatible(cfg)
    dist = Dist.setup(cfg.trainer.device)
    record = RunRecord(Path(run_dir), enabled=dist.main)
    wandb = None
    try:
        task = instantiate(cfg.task)
        seed_everything(cfg.seed)
        datasets = task.datasets(Path(cfg.paths.data_dir))
        model = task.build_model(cfg.backbone)
        attention.apply(model, instantiate(cfg.attn))
        model.to(dist.device)
        steps_per_epoch = max(1, len(datasets[0]) // (task.batch_size * dist.world * cfg.trainer.accumulate))
        total_steps = cfg.trainer.max_steps or cfg.trainer.max_epochs * steps_per_epoch
        optimizer = build_optimizer(cfg.optim, model)
        scheduler = build_scheduler(cfg.sched, optimizer, total_steps, steps_per_epoch)
        ema = ModelEmaV3(model, decay=cfg.trainer.ema) if cfg.trainer.ema else None

        record.write_config(cfg)
        if cfg.logger.name == "wandb" and dist.main:
            wandb = WandbLogger(cfg.logger, record.dir, OmegaConf.to_container(cfg, resolve=True))
        trainer = Trainer(
            cfg.trainer,
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
            "task": task.name,
            "backbone": cfg.backbone.name,
            "attn": cfg.attn.variant,
            "attn_options": {
                k: v for k, v in OmegaConf.to_container(cfg.attn).items() if not k.startswith("_")
            },
            "seed": cfg.seed,
            "steps": state.step,
            "metric": task.metric,
            "final": final,
            "best": state.best,
            "skipped_batches": state.skipped,
            "wall_s": state.wall_s,
            "session_s": time.monotonic() - started,
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
    finally:
        if wandb is not None:
            wandb.finish()
        dist.close()


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


def compatible_backbones(task: DictConfig) -> list[str]:
    """The names of the ``conf/backbone`` files that can serve ``task``."""
    names = []
    for path in sorted((CONF_DIR / "backbone").glob("*.yaml")):
        b = OmegaConf.load(path)
        if b.kind == task.input and (task.input != "image" or task.img_size >= b.min_img_size):
            names.append(path.stem)
    return names
