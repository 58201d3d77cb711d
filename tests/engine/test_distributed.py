"""Which GPU a process takes and which backend its process group runs on, for the layouts clusters
give a job: one GPU visible per task (SLURM's binding), the node's GPUs visible (torchrun), and a
local rank with no GPU of its own. CUDA is faked (``torch.cuda``'s queries monkeypatched), so the
GPU path runs on this CPU-only machine."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from src.engine import distributed
from src.engine.distributed import Dist, backend_for, gpu_index, resolve_device
from src.errors import ConfigError


@pytest.fixture
def gpus(monkeypatch):
    """``gpus(n, visible)``: the process sees ``n`` CUDA devices; returns the indices set_device got."""
    chosen: list[int] = []

    def make(count: int, visible: str | None = None) -> list[int]:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
        monkeypatch.setattr(torch.cuda, "set_device", lambda index: chosen.append(int(index)))
        if visible is None:
            monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        else:
            monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
        return chosen

    return make


@pytest.mark.parametrize("local_rank", [0, 1, 3, 7])
def test_a_task_bound_to_one_gpu_takes_it_whatever_its_local_rank(gpus, local_rank):
    chosen = gpus(1, visible=str(local_rank))  # --gpus-per-task=1: the node's GPU <local_rank>, as cuda:0
    assert resolve_device("cuda", local_rank) == torch.device("cuda", 0)
    assert resolve_device("auto", local_rank) == torch.device("cuda", 0)
    assert chosen == [0, 0]


def test_a_process_that_sees_the_node_takes_the_gpu_of_its_local_rank(gpus):
    chosen = gpus(8)
    assert [resolve_device("cuda", rank) for rank in range(8)] == [torch.device("cuda", r) for r in range(8)]
    assert chosen == list(range(8))


def test_a_local_rank_without_a_gpu_of_its_own_is_refused_in_one_line(gpus):
    chosen = gpus(2, visible="4,5")  # two GPUs a task, but four tasks on the node
    with pytest.raises(ConfigError) as refused:
        resolve_device("cuda", 3)
    message = str(refused.value)
    assert "\n" not in message and "local rank 3" in message and "sees 2 GPUs" in message
    assert "CUDA_VISIBLE_DEVICES=4,5" in message and "--gpus-per-task=1" in message
    assert chosen == []  # refused before any device was touched
    assert [gpu_index(rank) for rank in (0, 1)] == [0, 1]


def test_no_gpu_asked_for_is_cpu_and_a_gpu_asked_for_on_a_cpu_machine_is_refused(gpus):
    gpus(0)
    assert resolve_device("auto", 5) == resolve_device("cpu", 5) == torch.device("cpu")
    with pytest.raises(ConfigError, match="no usable CUDA GPU"):
        resolve_device("cuda", 0)


def test_each_device_gets_its_backend(monkeypatch):
    assert backend_for(torch.device("cpu")) == "gloo"
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    assert backend_for(torch.device("cuda", 0)) == "nccl"
    monkeypatch.setattr(dist, "is_nccl_available", lambda: False)  # e.g. a build without NCCL
    assert backend_for(torch.device("cuda", 0)) == "gloo"


@pytest.fixture
def started(monkeypatch):
    """The arguments ``init_process_group`` got (it is replaced; nothing connects)."""
    calls: list[tuple[tuple, dict]] = []
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    monkeypatch.setattr(distributed.dist, "init_process_group", lambda *a, **k: calls.append((a, k)))
    return calls


def test_a_slurm_task_bound_to_one_gpu_starts_nccl_on_it(gpus, started, monkeypatch):
    """Rank 11 of 16, the fourth task of its node, SLURM having given it the node's GPU 3 alone."""
    gpus(1, visible="3")
    monkeypatch.setenv("WORLD_SIZE", "16")
    monkeypatch.setenv("RANK", "11")
    monkeypatch.setenv("LOCAL_RANK", "3")
    layout = Dist.setup("auto")
    assert (layout.rank, layout.world, layout.device) == (11, 16, torch.device("cuda", 0))
    assert started == [(("nccl",), {"device_id": torch.device("cuda", 0)})]


def test_a_cpu_job_of_several_processes_starts_gloo_unbound(gpus, started, monkeypatch):
    gpus(0)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "0")
    layout = Dist.setup("auto")
    assert (layout.rank, layout.world, layout.device) == (1, 2, torch.device("cpu"))
    assert started == [(("gloo",), {})]
