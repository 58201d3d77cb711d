"""The loop at the GPU's speed: no host sync and no extra collective per step.

A CPU-side instrument (:class:`syncs.SyncAudit`) counts, during a real run of the shared loop, every
host read of a tensor, every data-dependent op and every ``torch.distributed`` collective, with the
step it happened in. Work that is not the step's is left out by name: loading a batch on the host
(the data path's own copies), validation, the monitor and a checkpoint's writing, which read values
at their own boundaries by nature. What remains must be one reduction and one read per logging
interval, and the logged losses must be those a read per step gives.
"""

from __future__ import annotations

import os
import signal
import socket
from collections import Counter
from pathlib import Path

import pytest
import torch
from conftest import compose
from syncs import SyncAudit, optimizer_steps

from src.engine import train
from src.engine.distributed import Dist
from src.engine.loop import trainer as trainer_module
from src.engine.loop.preemption import Preempted
from src.engine.loop.trainer import NonFiniteLoss, Trainer
from src.engine.record import checkpoint
from src.engine.record.files import read_metrics
from tasks.classification import ImageClassification

STEPS, EVERY = 20, 5
LOOP = [
    f"trainer.max_steps={STEPS}",
    f"trainer.log_every={EVERY}",
    "trainer.val_every=0",  # validates once, at the end
    "trainer.monitor_every=0",
    "trainer.checkpoint_every=1000",  # saves once, at the end
    "trainer.threads=1",
]
#: the loop's methods whose reads are not the step's: they read at their own boundaries
NOT_THE_STEP = ("_validate", "_monitor", "_at_init", "_save_best")


def audited(monkeypatch: pytest.MonkeyPatch, audit: SyncAudit) -> None:
    """Tag the audit's events with the step being trained; pause it where the work is not the step's."""
    step, stream, fit = Trainer._optimizer_step, Trainer._stream, Trainer.fit

    def tagged(self, batches):
        audit.step, audit.on_host = self.state.step + 1, optimizer_steps(self.optimizer)
        return step(self, batches)

    def fitted(self):
        try:
            return fit(self)
        finally:
            audit.step = None

    class Loaded:
        """The stream, each batch loaded with the audit paused (host work: decode, collate)."""

        def __init__(self, inner) -> None:
            self.inner = inner

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def __iter__(self):
            batches = iter(self.inner)
            while True:
                with audit.paused():
                    batch = next(batches)
                yield batch

    def paused(function):
        def call(*args, **kwargs):
            with audit.paused():
                return function(*args, **kwargs)

        return call

    monkeypatch.setattr(Trainer, "_optimizer_step", tagged)
    monkeypatch.setattr(Trainer, "fit", fitted)
    monkeypatch.setattr(Trainer, "_stream", lambda self: Loaded(stream(self)))
    monkeypatch.setattr(trainer_module, "to_device", paused(trainer_module.to_device))  # the copy to it
    monkeypatch.setattr(trainer_module.checkpoint, "save", paused(checkpoint.save))
    monkeypatch.setattr(Dist, "barrier", paused(Dist.barrier))  # a checkpoint's, beside its writing
    for name in NOT_THE_STEP:
        monkeypatch.setattr(Trainer, name, paused(getattr(Trainer, name)))


def audited_run(tmp_path: Path, monkeypatch, name: str, *overrides: str) -> tuple[SyncAudit, Path]:
    audit = SyncAudit()
    audited(monkeypatch, audit)
    cfg = compose([*LOOP, *overrides], tmp_path / "outputs")
    with audit.active(monkeypatch):
        train(cfg, tmp_path / name)
    return audit, tmp_path / name


def reads_and_collectives(audit: SyncAudit) -> tuple[Counter, Counter]:
    """Per step: host reads (and data-dependent ops), and collectives."""
    steps = [(step, name) for step, name in audit.events if step is not None]
    reads = Counter(step for step, name in steps if not name.startswith("dist."))
    collectives = Counter(step for step, name in steps if name.startswith("dist."))
    return reads, collectives


def train_losses(run: Path) -> list[tuple[int, float]]:
    return [(r["step"], r["train/loss"]) for r in read_metrics(run) if r["split"] == "train"]


def test_the_loop_reads_the_device_once_per_logging_interval_and_logs_the_same_losses(tmp_path, monkeypatch):
    """One process, 20 steps logged every 5: one read at each logging step and none between, no
    collective; the control, ``trainer.nonfinite=skip`` (which must decide on each batch before its
    update), reads every step, as the loop read before, and logs the very same losses."""
    audit, run = audited_run(tmp_path, monkeypatch, "deferred")
    reads, collectives = reads_and_collectives(audit)
    assert reads == {step: 1 for step in range(EVERY, STEPS + 1, EVERY)}, audit.events
    assert not collectives
    with monkeypatch.context() as patch:
        control, every_step = audited_run(tmp_path, patch, "every_step", "trainer.nonfinite=skip")
    assert reads_and_collectives(control)[0] == {step: 1 for step in range(1, STEPS + 1)}
    assert train_losses(run) == train_losses(every_step)  # to the bit
    assert [step for step, _ in train_losses(run)] == list(range(EVERY, STEPS + 1, EVERY))


def test_the_audit_sees_a_read_in_the_step(tmp_path, monkeypatch):
    """The instrument is live inside the loop: a loss read on the host in every step is counted."""
    original = ImageClassification.train_loss

    def reading(self, model, batch):
        loss = original(self, model, batch)
        float(loss.detach())  # as a loop that logs its loss every step would
        return loss

    monkeypatch.setattr(ImageClassification, "train_loss", reading)
    audit, _ = audited_run(tmp_path, monkeypatch, "run", "trainer.max_steps=6")
    reads, _ = reads_and_collectives(audit)
    assert reads == {1: 1, 2: 1, 3: 1, 4: 1, 5: 2, 6: 2}  # the planted one, and the boundary's


def nan_from(step: int, monkeypatch) -> None:
    original, calls = ImageClassification.train_loss, {"n": 0}

    def planted(self, model, batch):
        calls["n"] += 1
        loss = original(self, model, batch)
        return loss * float("nan") if calls["n"] >= step else loss

    monkeypatch.setattr(ImageClassification, "train_loss", planted)


def test_a_nan_between_boundaries_stops_at_the_next_naming_its_step_and_saves_nothing_after(
    tmp_path, monkeypatch
):
    """Read at step 15, the NaN of step 12 stops the run with the message a read per step gives: its
    step, the last finite loss (step 11), the checkpoint of step 10 kept; no row and no checkpoint
    after step 10, as the loop reads before it logs or saves."""
    nan_from(12, monkeypatch)
    cfg = compose([*LOOP, "trainer.checkpoint_every=5"], tmp_path / "outputs")
    with pytest.raises(NonFiniteLoss) as stopped:
        train(cfg, tmp_path / "run")
    message = str(stopped.value)
    assert message.startswith("loss is nan at step 12; last finite loss ") and " at step 11;" in message
    assert "checkpoints/last.pt (step 10)" in message
    assert checkpoint.load(tmp_path / "run" / "checkpoints" / "last.pt")["loop"]["step"] == 10
    assert max(r["step"] for r in read_metrics(tmp_path / "run")) == 10
    assert all(
        torch.isfinite(v).all()
        for v in checkpoint.load(tmp_path / "run" / "checkpoints" / "last.pt")["model"].values()
    )


def test_one_process_stops_at_the_end_of_the_step_a_signal_arrives_in(tmp_path, monkeypatch):
    """Between boundaries (no read planned), SIGTERM during step 7 stops at step 7 with ``last.pt``
    of step 7, whose window holds steps 6 and 7: one process reads the guard's note every step."""
    original, calls = ImageClassification.train_loss, {"n": 0}

    def signalled(self, model, batch):
        calls["n"] += 1
        if calls["n"] == 7:
            os.kill(os.getpid(), signal.SIGTERM)
        return original(self, model, batch)

    monkeypatch.setattr(ImageClassification, "train_loss", signalled)
    with pytest.raises(Preempted) as stopped:
        train(compose(LOOP, tmp_path / "outputs"), tmp_path / "run")
    assert stopped.value.step == 7
    loop = checkpoint.load(tmp_path / "run" / "checkpoints" / "last.pt")["loop"]
    assert (loop["step"], loop["window_steps"]) == (7, 2)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_process(rank: int, port: int, root: str, results) -> None:
    """One of two gloo processes: trains the audited loop, rank 1 noting SIGTERM during step 7."""
    os.environ.update(
        WORLD_SIZE="2", RANK=str(rank), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    original, calls = ImageClassification.train_loss, {"n": 0}

    def noted(self, model, batch):
        calls["n"] += 1
        if rank == 1 and calls["n"] == 7:
            os.kill(os.getpid(), signal.SIGTERM)
        return original(self, model, batch)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ImageClassification, "train_loss", noted)
        audit = SyncAudit()
        audited(patch, audit)
        cfg = compose(LOOP, Path(root) / f"outputs{rank}")
        try:
            with audit.active(patch):
                train(cfg, Path(root) / "run")
            stopped = None
        except Preempted as error:
            stopped = error.step
    results.put((rank, stopped, reads_and_collectives(audit)))


@pytest.mark.slow  # two processes that import the engine and train: about 45 s on 2 busy cores
def test_two_processes_reduce_once_per_logging_interval_and_agree_on_a_signal_there(tmp_path):
    """World 2 (gloo): one all-reduce and one read at each logging step, none between; SIGTERM
    noted by rank 1 alone during step 7 stops both at step 10, the next boundary (at most
    ``trainer.log_every`` steps later)."""
    context = torch.multiprocessing.get_context("spawn")
    results = context.SimpleQueue()
    torch.multiprocessing.start_processes(
        rank_process, args=(free_port(), str(tmp_path), results), nprocs=2, start_method="spawn"
    )
    got = sorted(results.get() for _ in range(2))
    for rank, stopped, (reads, collectives) in got:
        assert stopped == 10, rank
        assert reads == {5: 1, 10: 1} and collectives == {5: 1, 10: 1}, (rank, reads, collectives)
