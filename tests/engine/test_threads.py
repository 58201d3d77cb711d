"""The default CPU threads (``trainer.threads=null``): the free CPUs, shared by the node's processes."""

from __future__ import annotations

import pytest
import torch
from conftest import compose

from src.engine import experiment, threads


@pytest.mark.parametrize(
    "cpus, others, processes, expected",
    [
        (2, 0, 1, 2),  # an idle 2-core machine: both
        (2, 8.7, 1, 1),  # issue 42's shared box at load ≈ 9: one, never 0
        (16, 3, 1, 13),
        (16, 0, 4, 4),  # four DDP processes share the node
        (16, 10, 4, 1),  # 6 free among 4 processes
        (8, 2.4, 1, 6),  # rounded
    ],
)
def test_threads_are_the_free_cpus_shared_by_the_processes(cpus, others, processes, expected):
    assert threads.auto_threads(cpus, others, processes) == expected


def test_the_load_is_the_runnable_tasks_other_than_this_process(tmp_path, monkeypatch):
    loadavg = tmp_path / "loadavg"
    loadavg.write_text("8.70 8.10 7.50 10/812 4242\n")  # 10 runnable, this process among them
    monkeypatch.setattr(threads, "LOADAVG", loadavg)
    assert threads.others_running(reads=3, every_s=0) == 9
    monkeypatch.setattr(threads, "LOADAVG", tmp_path / "absent")
    assert threads.others_running() is None  # not Linux: torch's default stands


def test_a_run_with_null_threads_takes_the_free_cpus_and_gives_them_back(tmp_path, monkeypatch):
    """In ``processes`` (every run): null threads and no OMP_NUM_THREADS set the chosen count;
    OMP_NUM_THREADS or trainer.threads win; the process's own count is restored after."""
    before = torch.get_num_threads()
    seen = []
    monkeypatch.setattr(threads, "others_running", lambda: 0.0)
    monkeypatch.setattr(threads, "usable_cpus", lambda: 3)
    cfg = compose(["trainer.threads=null"], tmp_path)
    for omp in (None, "1"):
        if omp is None:
            monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        else:
            monkeypatch.setenv("OMP_NUM_THREADS", omp)
        with experiment.processes(cfg):
            seen.append(torch.get_num_threads())
        assert torch.get_num_threads() == before
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    with experiment.processes(compose(["trainer.threads=2"], tmp_path)):
        seen.append(torch.get_num_threads())
    assert seen == [3, before, 2]
