"""One process per run folder: the lock refuses a second holder, naming the first, and is taken
over once its holder is gone."""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from conftest import ROOT

from src.engine import lock as lock_module
from src.engine.lock import RunFolderBusy, RunLock


def test_a_second_holder_is_refused_naming_the_first(tmp_path):
    with RunLock(tmp_path):
        with pytest.raises(RunFolderBusy) as error:
            RunLock(tmp_path).acquire()
    message = str(error.value)
    assert f"process {os.getpid()} on host {socket.gethostname()}" in message and str(tmp_path) in message
    assert not (tmp_path / ".lock").exists()  # released, and its file gone
    with RunLock(tmp_path):  # free again
        pass


def hold_lock_in_another_process(folder) -> subprocess.Popen:
    code = (
        "import sys, time; from src.engine.lock import RunLock; "
        f"RunLock({str(folder)!r}).acquire(); print('held', flush=True); time.sleep(600)"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True, env={**os.environ}
    )
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_a_lock_whose_holder_was_killed_is_taken_over(tmp_path):
    holder = hold_lock_in_another_process(tmp_path)
    try:
        with pytest.raises(RunFolderBusy, match=f"process {holder.pid} on host"):
            RunLock(tmp_path).acquire()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert json.loads((tmp_path / ".lock").read_text())["pid"] == holder.pid  # left behind by the kill
    with RunLock(tmp_path):
        assert json.loads((tmp_path / ".lock").read_text())["pid"] == os.getpid()


def test_without_flock_the_file_decides(tmp_path, monkeypatch):
    def no_flock(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(lock_module.fcntl, "flock", no_flock)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = {"host": socket.gethostname(), "pid": dead.pid, "started": "then", "slurm_job": None}
    (tmp_path / ".lock").write_text(json.dumps(stale))
    with RunLock(tmp_path):  # a dead holder on this host: taken over
        alive = {**stale, "pid": os.getppid()}
        other = RunLock(tmp_path / "other")
        (tmp_path / "other").mkdir()
        (tmp_path / "other" / ".lock").write_text(json.dumps(alive))
        with pytest.raises(RunFolderBusy, match=r"no flock: if that process is gone, remove .*other/\.lock"):
            other.acquire()
    assert not (tmp_path / ".lock").exists()
    elsewhere = {**stale, "host": "another-node", "slurm_job": "77"}
    (tmp_path / ".lock").write_text(json.dumps(elsewhere))
    with pytest.raises(RunFolderBusy, match="on host another-node since then, SLURM job 77"):
        RunLock(tmp_path).acquire()
    monkeypatch.setenv("SLURM_JOB_ID", "77")  # the same job, requeued: its earlier run has ended
    with RunLock(tmp_path):
        assert json.loads((tmp_path / ".lock").read_text())["slurm_job"] == "77"


def test_the_entry_point_refuses_a_folder_in_use_and_takes_it_over_after_a_kill(tmp_path):
    """The same command twice: the second process stops at once, naming the first; once the
    first is killed, its stale lock no longer stands in the way."""
    from conftest import run_cli

    args = ["trainer.max_steps=3", "trainer.val_every=3", "trainer.monitor_every=0"]
    folder = tmp_path / "outputs" / "runs" / "digits" / "vit_digits" / "precond" / "seed=0"
    folder = folder / "trainer.max_steps=3,trainer.monitor_every=0,trainer.val_every=3"
    holder = hold_lock_in_another_process(folder)  # as the first command's process holds it
    try:
        started = time.monotonic()
        second = run_cli(args, cwd=tmp_path)
        assert second.returncode == 2 and f"is in use by process {holder.pid}" in second.stderr
        assert "Traceback" not in second.stderr and time.monotonic() - started < 60
        assert not (folder / "metrics.jsonl").exists() and not (folder / "config.yaml").exists()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    third = run_cli(args, cwd=tmp_path)
    assert third.returncode == 0, third.stderr[-2000:]
    assert json.loads((folder / "summary.json").read_text())["steps"] == 3 and not (folder / ".lock").exists()
