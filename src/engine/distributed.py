"""Process layout: one process, or DDP under ``torchrun`` or SLURM (``gloo`` on CPU, ``nccl`` on GPU).

Each process trains on one GPU among those it can *see*: SLURM may bind one GPU per task
(``--gpus-per-task=1``, ``--gpu-bind``, or cgroups), which leaves ``CUDA_VISIBLE_DEVICES`` one
device long while ``LOCAL_RANK`` counts the node's tasks, so :func:`gpu_index` takes ``cuda:0``
there and the local rank only where the process sees the node's GPUs (``torchrun``, one task per
node). NCCL's own settings (``NCCL_DEBUG``, ``NCCL_SOCKET_IFNAME``, InfiniBand) stay the
cluster's: ``docs/sweeps.md``, section NCCL, says which matter and what torch does by default.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from src.errors import ConfigError

log = logging.getLogger(__name__)


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
            backend = backend_for(target)
            # device_id binds NCCL's communicator to this GPU (formed at once, so a bad fabric fails
            # here rather than at the first all-reduce; barrier() uses it instead of guessing rank % GPUs)
            bound = {"device_id": target} if backend == "nccl" else {}
            dist.init_process_group(backend, **bound)
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
    """``auto`` takes the GPU when there is one; asking for one where none exists is an error.
    On a GPU, the one :func:`gpu_index` picks becomes the current device."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError(
                f"trainer.device={device} but this machine has no usable CUDA GPU; "
                "use trainer.device=cpu (or auto)"
            )
        index = gpu_index(local_rank)
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    if device != "cpu":
        raise ConfigError(f"trainer.device={device!r} is not one of auto, cpu, cuda")
    return torch.device("cpu")


def gpu_index(local_rank: int) -> int:
    """The GPU this process trains on, among the ``torch.cuda.device_count()`` it sees: the only
    one where it sees one (a task SLURM bound to one GPU, whatever its ``LOCAL_RANK``), else the
    ``local_rank``-th (``torchrun``, or a SLURM task that sees its node's GPUs). A local rank with
    no GPU of its own is refused: two processes sharing one GPU would run out of memory or crawl."""
    count = torch.cuda.device_count()
    if count == 1:
        return 0
    if not 0 <= local_rank < count:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "unset")
        raise ConfigError(
            f"local rank {local_rank} has no GPU of its own: this process sees {count} GPUs "
            f"(CUDA_VISIBLE_DEVICES={visible}); run one process per GPU (torchrun --nproc_per_node "
            f"{count}, or hydra.launcher.tasks_per_node equal to the GPUs SLURM gives each node), or let "
            "SLURM give each task one GPU (hydra.launcher.gpus_per_task=1, sbatch's --gpus-per-task=1)"
        )
    return local_rank


def backend_for(device: torch.device) -> str:
    """The process group's backend for ``device``: ``nccl`` on CUDA (``gloo`` where this torch
    build has no NCCL: it reduces CUDA tensors too, more slowly), ``gloo`` on the CPU."""
    if device.type != "cuda":
        return "gloo"
    if dist.is_nccl_available():
        return "nccl"
    log.warning("this torch build has no NCCL: the processes reduce their CUDA tensors through gloo (slower)")
    return "gloo"
