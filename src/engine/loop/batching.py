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
is refused, naming the world sizes that can. Nor may one step span more than a few epochs
(:data:`MAX_EPOCHS_PER_STEP`, :func:`check_global_batch`): a global batch of millions of epochs
(``trainer.accumulate=1000000000`` on 1,437 samples) is refused before the first step, which
would otherwise never end. Steps per epoch, schedules and the record's identity depend on the
global batch only, so a recipe trains the same run on 1 or 8 GPUs.
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
        fewest = -(-share // batch_size)  # fewer micro-batches would each hold more than batch_size
        steps = smallest_divisor(share, fewest)  # the smallest accumulation whose micro-batch fits
        return BatchPlan(global_batch, share // steps, world, steps)
    raise ConfigError(
        f"{world} processes cannot keep the global batch {global_batch} (task.batch_size={batch_size} × "
        f"trainer.accumulate={accumulate}) without splitting a sample: run it on "
        f"{', '.join(map(str, honouring_worlds(global_batch)))} processes (GPUs), or change task.batch_size"
    )


#: How many epochs one optimizer step may span. [reading] No recipe of the papers comes near one
#: (DeiT's 1024 of 1.28 M images, Cramming's 8192 of millions of sequences); 4 leaves room for a
#: recipe's batch on a few files (the tests' DeiT recipe, 4 × 8 accumulated, on 12 images) and stops
#: a typo (``accumulate=1000000000``) whose first step would never end.
MAX_EPOCHS_PER_STEP = 4


def check_global_batch(plan: BatchPlan, epoch_samples: int, train_size: int | None = None) -> None:
    """Refuse, before training, a global batch larger than :data:`MAX_EPOCHS_PER_STEP` epochs of
    ``epoch_samples`` samples (the training set, or repeated augmentation's rounded epoch; its
    ``train_size`` where that differs): one step would draw every sample many times, and a typo's
    step would never end."""
    if plan.global_batch <= MAX_EPOCHS_PER_STEP * epoch_samples:
        return
    size = f"{epoch_samples:,} samples an epoch" + (
        f" (of {train_size:,} training samples)" if train_size not in (None, epoch_samples) else ""
    )
    raise ConfigError(
        f"the global batch {plan.global_batch:,} (task.batch_size × trainer.accumulate) is more than "
        f"{MAX_EPOCHS_PER_STEP} epochs of the training set, {size}: one step would see every sample "
        f"{plan.global_batch // epoch_samples:,} times; lower trainer.accumulate or task.batch_size"
    )


def smallest_divisor(n: int, low: int) -> int:
    """The smallest divisor of ``n`` (≥ 1) that is at least ``low``: ``n`` itself at worst; in
    √n trials, so that a huge global batch is planned at once."""
    best, i = n, 1
    while i * i <= n:
        if n % i == 0:
            best = min([best, *(d for d in (i, n // i) if d >= low)])
        i += 1
    return best


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
