"""The recipe's global batch (src/engine/loop/batching.py): kept on any number of processes that
divides it, the recipe as written on one, refused in one line where it cannot be kept."""

from __future__ import annotations

import pytest

from src.engine.loop.batching import BatchPlan, plan_batch
from src.errors import ConfigError


@pytest.mark.parametrize("batch_size", [1, 7, 32, 64, 128])
@pytest.mark.parametrize("accumulate", [1, 2, 3, 64])
def test_one_process_trains_the_recipe_as_written(batch_size, accumulate):
    """World 1: task.batch_size samples a micro-batch, trainer.accumulate of them a step."""
    assert plan_batch(batch_size, accumulate, 1) == BatchPlan(
        batch_size * accumulate, batch_size, 1, accumulate
    )


@pytest.mark.parametrize(
    "batch_size, accumulate, world, per_process, steps",
    [
        (32, 1, 8, 4, 1),  # LRA's 32 on the 8 GPUs the SLURM launcher used to give every task
        (32, 1, 2, 16, 1),
        (128, 8, 8, 128, 1),  # ImageNet: DeiT's 1024 as 8 GPUs x 128
        (128, 8, 2, 128, 4),  # ... or 2 GPUs x 128 x 4 accumulated
        (128, 64, 8, 128, 8),  # Cramming's 8192 on 8 GPUs: micro-batches of 128 still, 8 accumulated
        (6, 2, 4, 3, 1),
        (16, 3, 3, 16, 1),  # 48 = 3 x 16
    ],
)
def test_the_global_batch_is_kept_and_no_micro_batch_grows(batch_size, accumulate, world, per_process, steps):
    plan = plan_batch(batch_size, accumulate, world)
    assert (plan.per_process, plan.accumulate) == (per_process, steps)
    assert plan.global_batch == plan.world * plan.per_process * plan.accumulate == batch_size * accumulate
    assert plan.per_process <= batch_size  # what the recipe says one process holds


@pytest.mark.parametrize("world", [3, 5, 64])
def test_a_world_that_cannot_keep_it_is_refused_naming_those_that_can(world):
    with pytest.raises(ConfigError) as refused:
        plan_batch(32, 1, world)
    message = str(refused.value)
    assert "\n" not in message and f"{world} processes cannot keep the global batch 32" in message
    assert "run it on 1, 2, 4, 8, 16, 32 processes" in message


def test_the_plan_reads_as_the_start_line_says_it():
    assert plan_batch(64, 1, 1).text() == "batch 64 = 1 process × 64"
    assert plan_batch(32, 1, 8).text() == "batch 32 = 8 processes × 4"
    assert plan_batch(128, 8, 2).text() == "batch 1024 = 2 processes × 128 × 4 accumulated"
