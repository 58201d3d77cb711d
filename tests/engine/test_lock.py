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

from src.engine.record import lock as lock_module
from src.engine.record.lock import RunFolderBusy, RunLock


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
        "import sys, time; from src.engine.record.lock import RunLock; "
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


def no_flock(fd, operation):
    """``fcntl.flock`` where the file system has none."""
    raise OSError(errno.ENOLCK, "No locks available")


def test_without_flock_the_file_decides(tmp_path, monkeypatch):
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
    from conftest import compose, run_cli

    from src.engine import train

    args = ["trainer.max_steps=3", "trainer.val_every=3", "trainer.monitor_every=0"]
    folder = tmp_path / "outputs" / "runs" / "digits" / "vit_digits" / "precond"
    folder = folder / "seed=0,trainer.max_steps=3,trainer.monitor_every=0,trainer.val_every=3"
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
    # the killed holder's stale lock taken over by the run the command starts (in this process: the
    # refusal above proved the command's folder; the takeover is train's, the same call src.run makes)
    train(compose([*args, f"paths.data_dir={tmp_path / 'data'}"], tmp_path / "outputs"), folder)
    assert json.loads((folder / "summary.json").read_text())["steps"] == 3 and not (folder / ".lock").exists()


# -- without flock, processes racing for one file ---------------------------------------------

RACER = """
import errno, fcntl, importlib.util, json, sys, time
spec = importlib.util.spec_from_file_location("lock_under_test", sys.argv[1])
lock = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lock)

def no_flock(fd, operation):
    raise OSError(errno.ENOLCK, "No locks available")

fcntl.flock = no_flock
folders, spacing, hold = json.loads(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
print("ready", flush=True)
base = float(sys.stdin.readline())
kept = []
for trial, folder in enumerate(folders):
    at = base + trial * spacing
    time.sleep(max(0.0, at - 0.003 - time.time()))
    while time.time() < at:  # the last milliseconds spinning: the racers start within microseconds
        pass
    held = lock.RunLock(folder)
    try:
        held.acquire()
    except lock.RunFolderBusy:
        continue
    start = time.time()
    if hold > 0:
        time.sleep(hold)
        print(json.dumps([trial, start, time.time()]), flush=True)
        held.release()
    else:
        kept.append(held)
        print(json.dumps([trial, start, None]), flush=True)
print("done", flush=True)
sys.stdin.readline()  # a lock kept (hold=0) is held until the test has read every process's answer
for held in kept:
    held.release()
"""


def race(folders, racers: int = 4, spacing: float = 0.08, hold: float = 0.05, module=None) -> list[list]:
    """``racers`` processes without flock try, all at once, to take the lock of each folder in
    turn; ``[trial, acquired, released]`` of every acquisition (released None: kept, ``hold=0``)."""
    env = {k: v for k, v in os.environ.items() if k != "SLURM_JOB_ID"}  # one job's files are stale to it
    args = [sys.executable, "-c", RACER, str(module or lock_module.__file__)]
    args += [json.dumps([str(f) for f in folders]), str(spacing), str(hold)]
    procs = [
        subprocess.Popen(args, cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for _ in range(racers)
    ]
    try:
        for proc in procs:
            assert proc.stdout.readline().strip() == "ready"
        base = f"{time.time() + 0.2}\n"
        for proc in procs:
            proc.stdin.write(base)
            proc.stdin.flush()
        held = []
        for proc in procs:
            for line in iter(proc.stdout.readline, "done\n"):
                assert line, f"a racer failed with status {proc.wait()}"
                held.append(json.loads(line))
        for proc in procs:
            proc.stdin.write("\n")
            proc.stdin.close()
            assert proc.wait(timeout=30) == 0
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    return held


def test_without_flock_racing_processes_never_hold_the_lock_at_once(tmp_path):
    """Four processes at once on each of 30 free folders: whoever holds the lock holds it alone."""
    folders = [tmp_path / str(trial) for trial in range(30)]
    held = race(folders)
    for trial in range(len(folders)):
        spans = sorted((start, end) for t, start, end in held if t == trial)
        assert spans, f"trial {trial}: nobody got the lock"
        for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
            assert start >= end, f"trial {trial}: two processes held the lock at once: {spans}"
        assert not (folders[trial] / ".lock").exists()


def test_without_flock_exactly_one_racer_takes_over_a_stale_lock(tmp_path):
    """A lock left by a dead process on this host, four processes racing to take it over, 30
    times: each time exactly one wins, and the file names it; no claim or temporary file is left."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = json.dumps({"host": socket.gethostname(), "pid": dead.pid, "started": "then", "slurm_job": None})
    folders = [tmp_path / str(trial) for trial in range(30)]
    for folder in folders:
        folder.mkdir()
        (folder / ".lock").write_text(stale)
    held = race(folders, hold=0)
    winners = sorted(trial for trial, _, _ in held)
    assert winners == list(range(len(folders))), f"not one winner per trial: {winners}"
    for folder in folders:
        assert sorted(p.name for p in folder.iterdir()) == []  # released; no claim or temporary file


@pytest.mark.parametrize("left_by", ["a dead process on this host", "another host, long ago"])
def test_without_flock_a_claim_left_behind_does_not_block_the_takeover(tmp_path, monkeypatch, left_by):
    """A process that died while taking over a stale lock left its claim: the next one passes
    it over (its PID is gone, or it is far older than a claim is held) and takes the lock."""
    monkeypatch.setattr(lock_module.fcntl, "flock", no_flock)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    here = {"host": socket.gethostname(), "pid": dead.pid, "started": "then", "slurm_job": None}
    (tmp_path / ".lock").write_text(json.dumps(here))
    claimer = here if left_by.startswith("a dead") else {**here, "host": "another-node", "pid": os.getpid()}
    claim = lock_module.claim_path(tmp_path / ".lock", lock_module._seen(tmp_path / ".lock"), 0)
    claim.write_text(json.dumps(claimer))
    if left_by.startswith("another"):
        old = time.time() - lock_module.CLAIM_ABANDONED_S - 5
        os.utime(claim, (old, old))
    started = time.monotonic()
    with RunLock(tmp_path):
        assert json.loads((tmp_path / ".lock").read_text())["pid"] == os.getpid()
        assert time.monotonic() - started < 5 and not claim.exists()
    assert list(tmp_path.iterdir()) == []
