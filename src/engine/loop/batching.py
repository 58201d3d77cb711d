"""The global batch, kept whatever the number of processes.

A recipe states its batch for one process: ``task.batch_size`` samples a forward pass (the
micro-batch one process holds in memory), ``trainer.accumulate`` of them an optimizer step. Their
product is the recipe's **global batch**: the samples one optimizer step sees. With ``W``
processes (DDP under ``torchrun``, or a SLURM job of several GPUs) the global batch stays, and
each process takes ``global / (W · accumulate)`` samples a micro-batch, where ``accumulate`` is
the smallest accumulation that divides the global batch evenly and keeps the micro-batch no
larger than ``task.batch_size`` (what the recipe says one process holds). With one process this
is the recipe as written (``task.batch_size`` × ``trainer.accumulate``), bit for bit.

A world size that does not divide the global batch cannot keep it (no integer split): the run
is refused, naming the world sizes that can. Steps per epoch, schedules and the record's
identity depend on the global batch only, so a recipe trains the same run on 1 or 8 GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import DictConfig

from src.errors import ConfigError


@dataclass(frozen=True)
class BatchPlan:
    """How ``global_batch`` samples a step are split: ``world`` processes × ``per_process``
    samples a micro-batch × ``accumulate`` micro-batches."""

    global_batch: int
    per_process: int
    world: int
    accumulate: int

    def text(self) -> str:
        """``batch 256 = 8 processes × 32`` (with ``× 2 accumulated`` where it accumulates)."""
        processes = "1 process" if self.world == 1 else f"{self.world} processes"
        accumulated = f" × {self.accumulate} accumulated" if self.accumulate > 1 else ""
        return f"batch {self.global_batch} = {processes} × {self.per_process}{accumulated}"


def plan_batch(batch_size: int, accumulate: int, world: int) -> BatchPlan:
    """The split of the recipe's global batch (``batch_size × accumulate``) over ``world``
    processes (module docstring); :class:`ConfigError` when ``world`` cannot keep it."""
    global_batch = batch_size * accumulate
    if world <= global_batch and global_batch % world == 0:
        share = global_batch // world
        for steps in range(1, share + 1):  # the smallest accumulation whose micro-batch fits
            if share % steps == 0 and share // steps <= batch_size:
                return BatchPlan(global_batch, share // steps, world, steps)
    raise ConfigError(
        f"{world} processes cannot keep the global batch {global_batch} (task.batch_size={batch_size} × "
        f"trainer.accumulate={accumulate}) without splitting a sample: run it on "
        f"{', '.join(map(str, honouring_worlds(global_batch)))} processes (GPUs), or change task.batch_size"
    )


def honouring_worlds(global_batch: int, at_most: int = 1024) -> list[int]:
    """The world sizes (up to ``at_most``) that split ``global_batch`` evenly: its divisors."""
    return [w for w in range(1, min(global_batch, at_most) + 1) if global_batch % w == 0]


def plan_for(cfg: DictConfig, world: int) -> BatchPlan | None:
    """The batch plan of the run ``cfg`` describes on ``world`` processes (:class:`ConfigError`
    when it cannot keep its global batch); None for detection, whose ``task.batch_size`` is per
    process as mmdetection's recipes write it and whose loop (mmengine's) splits nothing."""
    if cfg.task.get("input") == "detection":
        return None
    return plan_batch(int(cfg.task.batch_size), int(cfg.trainer.accumulate), world)


def slurm_world(launcher: DictConfig) -> int:
    """The processes of one job of ``hydra/launcher=slurm``: nodes × tasks per node."""
    return int(launcher.get("nodes") or 1) * int(launcher.get("tasks_per_node") or 1)
