"""Process layout: one process, or DDP under ``torchrun`` (``gloo`` on CPU, ``nccl`` on GPU)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from src.errors import ConfigError


@dataclass
class Dist:
    """Where this process runs and who else does: ``rank`` of ``world`` on ``device``."""

    rank: int = 0
    world: int = 1
    device: torch.device = torch.device("cpu")

    @property
    def main(self) -> bool:
        return self.rank == 0

    @classmethod
    def setup(cls, device: str = "auto") -> Dist:
        """Read ``torchrun``'s environment (or SLURM's, for a submitit job with several tasks),
        start the process group, and pick the device."""
        if "WORLD_SIZE" not in os.environ and int(os.environ.get("SLURM_NTASKS", "1")) > 1:
            import submitit

            submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
        world = int(os.environ.get("WORLD_SIZE", "1"))
        rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
        target = resolve_device(device, local_rank)
        if world > 1 and not dist.is_initialized():
            dist.init_process_group("nccl" if target.type == "cuda" else "gloo")
        return cls(rank, world, target)

    def all_sum(self, values: torch.Tensor) -> torch.Tensor:
        """Sum ``values`` over every process (a no-op with one)."""
        if self.world > 1:
            values = values.clone()
            dist.all_reduce(values)
        return values

    def share(self, value: Any) -> Any:
        """The main process's ``value`` on every process (pickled; a no-op with one)."""
        if self.world == 1:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()

    def close(self) -> None:
        if self.world > 1 and dist.is_initialized():
            dist.destroy_process_group()


def resolve_device(device: str, local_rank: int = 0) -> torch.device:
    """``auto`` takes the GPU when there is one; asking for one where none exists is an error."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError(
                f"trainer.device={device} but this machine has no usable CUDA GPU; "
                "use trainer.device=cpu (or auto)"
            )
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    if device != "cpu":
        raise ConfigError(f"trainer.device={device!r} is not one of auto, cpu, cuda")
    return torch.device("cpu")
