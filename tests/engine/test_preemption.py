"""SIGTERM, SIGUSR1 and SIGUSR2 stop training at a step boundary with a checkpoint, a record of why
and one line; the rerun (or the requeued job) resumes from that step."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import QUIET, ROOT, compose

from src.engine import train
from src.engine.loop.preemption import Preempted, exit_preempted
from src.engine.record import checkpoint
from src.engine.record.files import read_metrics

SHORT = ["trainer.checkpoint_every=1000", "trainer.monitor_every=0", "trainer.threads=1"]
NO_SLURM = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}


def wait_for_step(root: Path, process: subprocess.Popen, step: int) -> Path:
    """The run folder under ``root`` once its ``metrics.jsonl`` has a row at ``step`` or later."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and process.poll() is None:
        found = list(root.glob("outputs/**/metrics.jsonl"))
        if found and any(r["step"] >= step for r in read_metrics(found[0].parent, warn=False)):
            return found[0].parent
        time.sleep(0.05)
    raise AssertionError(f"the run never reached step {step} (status {process.poll()})")


def test_sigterm_saves_the_step_records_why_and_the_rerun_resumes(tmp_path, caplog):
    """SIGTERM after step 10 of 60: status 143, one line and no traceback, ``last.pt`` at the step it
    stopped (no periodic checkpoint before), one failure line, no failed summary; the same command
    again resumes from that step and completes."""
    args = ["trainer.max_steps=60", "trainer.log_every=1", *SHORT]
    env = {**NO_SLURM, "PYTHONPATH": str(ROOT), "WANDB_MODE": "disabled"}
    with open(tmp_path / "out", "w") as out, open(tmp_path / "err", "w") as err:
        process = subprocess.Popen(
            [sys.executable, "-m", "src.run", *args, *QUIET], cwd=tmp_path, env=env, stdout=out, stderr=err
        )
        try:
            run = wait_for_step(tmp_path, process, 10)
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=120) == 128 + signal.SIGTERM
        finally:
            process.kill()
    stderr = (tmp_path / "err").read_text()
    stopped = re.search(r"stopped by SIGTERM at step (\d+) of 60: checkpoint saved \((.+)\); rerun", stderr)
    assert stopped and "Traceback" not in stderr, stderr[-3000:]
    step = int(stopped.group(1))
    assert 10 <= step < 60 and (tmp_path / stopped.group(2)).resolve() == run / "checkpoints" / "last.pt"
    assert checkpoint.load(run / "checkpoints" / "last.pt")["loop"]["step"] == step
    assert max(r["step"] for r in read_metrics(run)) == step  # nothing logged past the checkpoint
    (failure,) = [json.loads(line) for line in (run / "failures.jsonl").read_text().splitlines()]
    assert failure["error"].startswith(f"Preempted: stopped by SIGTERM at step {step} of 60")
    assert failure["step"] == step
    assert not (run / "summary.json").exists()  # incomplete, not failed

    # the rerun in this process (the exit status was the other process's to prove): the folder the
    # command named, with the config the entry point composed there (its data folder under cwd)
    caplog.set_level(logging.INFO, logger="src.run")
    train(compose([*args, f"paths.data_dir={tmp_path / 'data'}"], tmp_path / "outputs"), run)
    assert any(f"resumed from step {step} of 60" in r.getMessage() for r in caplog.records)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 60
    assert len((run / "failures.jsonl").read_text().splitlines()) == 1


def signal_at(monkeypatch, step: int, signum: int) -> None:
    """The digits task's ``after_backward`` hook sends ``signum`` to this process during ``step``."""
    from tasks.classification import Digits

    def hook(self, model, at, loss):
        if at == step:
            os.kill(os.getpid(), signum)
        return None

    monkeypatch.setattr(Digits, "after_backward", hook)


def stop_in_process(tmp_path: Path, monkeypatch, signum: int, step: int = 7) -> tuple[Path, Preempted]:
    """Train 20 steps in this process, ``signum`` arriving during ``step``: the run folder and the
    :class:`Preempted` raised."""
    for key in [k for k in os.environ if k.startswith("SLURM_") and k != "SLURM_JOB_ID"]:
        monkeypatch.delenv(key)
    signal_at(monkeypatch, step, signum)
    cfg = compose(["trainer.max_steps=20", *SHORT], tmp_path / "outputs")
    run = tmp_path / "run"
    with pytest.raises(Preempted) as stopped:
        train(cfg, run)
    return run, stopped.value


def test_the_signals_earlier_python_handler_runs_after_the_checkpoint(tmp_path, monkeypatch):
    """submitit's SIGUSR2 handler requeues the job and exits: it must run once the checkpoint is
    saved and the failure recorded, not when the signal arrives. A recording handler stands in."""
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    calls = []

    def earlier(signum, frame):
        saved = checkpoint.load(run / "checkpoints" / "last.pt")["loop"]["step"]
        calls.append((signum, saved, (run / "failures.jsonl").exists()))

    run = tmp_path / "run"
    before = signal.signal(signal.SIGUSR2, earlier)
    try:
        _, stopped = stop_in_process(tmp_path, monkeypatch, signal.SIGUSR2)
        assert signal.getsignal(signal.SIGUSR2) is earlier  # the loop put it back
        assert calls == []  # not when the signal arrived
        assert (stopped.signum, stopped.step, stopped.previous) == (signal.SIGUSR2, 7, earlier)
        with pytest.raises(SystemExit) as exited:
            exit_preempted(stopped)
    finally:
        signal.signal(signal.SIGUSR2, before)
    assert calls == [(signal.SIGUSR2, 7, True)] and exited.value.code == 128 + signal.SIGUSR2
    assert not (run / "summary.json").exists()


def fake_scontrol(tmp_path: Path, monkeypatch, status: int = 0) -> Path:
    """An ``scontrol`` first on PATH that writes its arguments to the returned file."""
    bin_dir, called = tmp_path / "bin", tmp_path / "scontrol-args"
    bin_dir.mkdir()
    script = bin_dir / "scontrol"
    script.write_text(f'#!/bin/sh\necho "$@" > {called}\necho "Invalid job id" >&2\nexit {status}\n')
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return called


def test_sigusr1_under_slurm_requeues_the_job(tmp_path, monkeypatch, capsys):
    """SLURM's ``--signal=USR1`` with no Python handler: after the checkpoint, ``scontrol requeue``
    the job; the line says the requeued job resumes from the step."""
    called = fake_scontrol(tmp_path, monkeypatch)
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    run, stopped = stop_in_process(tmp_path, monkeypatch, signal.SIGUSR1)
    assert stopped.previous is None and checkpoint.load(run / "checkpoints" / "last.pt")["loop"]["step"] == 7
    with pytest.raises(SystemExit) as exited:
        exit_preempted(stopped)
    assert exited.value.code == 128 + signal.SIGUSR1
    assert called.read_text().split() == ["requeue", "4242"]
    line = capsys.readouterr().err.strip()
    assert line.startswith("stopped by SIGUSR1 at step 7 of 20 (SLURM job 4242): checkpoint saved (")
    assert line.endswith("the job, once requeued, resumes from step 7 (or rerun the same command)")


def test_a_failed_requeue_is_one_warning_and_the_exit_stands(tmp_path, monkeypatch, caplog, capsys):
    """``scontrol`` refusing: a warning that says to rerun, the same line and status; and SIGTERM
    (a cancel, or a preemption SLURM requeues itself) never calls it."""
    called = fake_scontrol(tmp_path, monkeypatch, status=1)
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    for signum in (signal.SIGUSR1, signal.SIGTERM):
        called.unlink(missing_ok=True)
        with pytest.raises(SystemExit) as exited:
            exit_preempted(Preempted(signum, 12, 60, tmp_path / "last.pt"))
        assert exited.value.code == 128 + signum
        assert called.exists() == (signum == signal.SIGUSR1)
    assert "scontrol requeue 77 failed (Invalid job id); rerun the same command" in caplog.text
    assert capsys.readouterr().err.count("stopped by SIG") == 2


AGREE = """
import signal, sys, torch.distributed as td
from src.engine.distributed import Dist
from src.engine.loop.preemption import PreemptionGuard
rank, store = int(sys.argv[1]), sys.argv[2]
td.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
guard, dist = PreemptionGuard(), Dist(rank, 2)
first = guard.stop_signal(dist)
if rank == 1:
    guard.signum = signal.SIGTERM  # as its handler notes it
print(first, guard.stop_signal(dist), flush=True)
td.destroy_process_group()
"""


@pytest.mark.slow  # two processes importing the engine: 20 s on 2 busy cores
def test_under_ddp_a_signal_to_one_process_stops_all_at_the_same_step(tmp_path):
    """Two gloo processes: none noted, none stops; rank 1 notes SIGTERM, both stop on it."""
    env = {**NO_SLURM, "PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", AGREE, str(rank), str(tmp_path / "store")],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    answers = [proc.communicate(timeout=120)[0].split() for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0]
    assert answers == [["None", str(int(signal.SIGTERM))]] * 2
