"""A real SLURM cluster on localhost (launch/cluster/local_slurm.sh) of two nodes, each a network
namespace with its own slurmd: a smoke sweep through hydra/launcher=slurm, a job on both nodes
that trains one model, and a two-node job requeued mid-run that resumes to the end of an
uninterrupted one.

The machine may be loaded (CI's 2 cores, or several test processes at once), so no test has a
fixed budget: a sweep is waited on for as long as anything it does moves (:func:`wait_moving`: its
files, its jobs' states) and fails after :data:`STALL_S` seconds of stillness, or past the
generous :data:`CAP_S`. Nor does the requeue race the job: the job is frozen at the step it
reached before it is requeued (:func:`frozen`)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import QUIET, ROOT, run_cli

from src.engine.record.files import read_metrics

SCRIPT = ROOT / "launch" / "cluster" / "local_slurm.sh"
ON_LOCAL_CLUSTER = [
    "hydra/launcher=slurm",
    "hydra.launcher.gpus_per_node=null",
    "hydra.launcher.mem_gb=null",  # the task's resources.mem_gb may exceed this machine
    "hydra.launcher.tasks_per_node=1",
    "hydra.launcher.cpus_per_task=1",
    "hydra.launcher.timeout_min=20",
    "hydra.launcher.signal_delay_s=10",
]

pytestmark = pytest.mark.slow

#: seconds a sweep may go without any of its files or job states changing: a job that stops
#: progressing (a hang, a lost requeue); a python start on a loaded machine takes well under this
STALL_S = 300
#: seconds any one sweep may take at all, however it progresses (a guard for CI, not a budget)
CAP_S = 2400


@pytest.fixture(scope="module")
def slurm_env():
    if shutil.which("slurmctld") is None or os.geteuid() != 0:
        reason = "needs root and Debian's slurm packages (launch/cluster/local_slurm.sh install)"
        if os.environ.get("REQUIRE_SLURM"):
            pytest.fail(reason)
        pytest.skip(reason)
    two = {**os.environ, "SLURM_LOCAL_NODES": "2"}
    status = subprocess.run([SCRIPT, "status"], capture_output=True, text=True, env=two).stdout
    already = "slurmctld running" in status
    subprocess.run([SCRIPT, "start"], check=True, timeout=600, env=two)  # each daemon's wait is bounded there
    conf = subprocess.run([SCRIPT, "conf"], capture_output=True, text=True, check=True).stdout.strip()
    env = {"SLURM_CONF": conf, "GLOO_SOCKET_IFNAME": "ca0"}  # each node's link (the script's header)
    nodes = subprocess.run(
        ["sinfo", "-h", "-N", "-o", "%N"], env={**os.environ, **env}, capture_output=True, text=True
    )
    assert nodes.stdout.split() == ["ca-n1", "ca-n2"], "a one-node cluster is running: stop it first"
    if not already:  # jobs a stopped cluster left in its saved state come back as RUNNING or PENDING
        clear_queue(env)
    yield env
    if not already:
        clear_queue(env, grace_s=60)  # stopping under a finishing job would leave it for the next start
        subprocess.run([SCRIPT, "stop"], check=True, env=two)


def summaries(root: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in root.glob("**/summary.json")]


def squeue(slurm_env: dict) -> str:
    """The queue as ``<id> <state>`` lines (empty where SLURM does not answer)."""
    env = {**os.environ, **slurm_env}
    listed = subprocess.run(["squeue", "-h", "-o", "%i %T"], env=env, capture_output=True, text=True)
    return listed.stdout


def tree_state(root: Path) -> tuple:
    """Every file under ``root`` with its size: a metrics row, a log line or a checkpoint changes it."""
    found = []
    for path in root.rglob("*"):
        with contextlib.suppress(OSError):
            if path.is_file():
                found.append((str(path), path.stat().st_size))
    return tuple(sorted(found))


def wait_moving(done: Callable[[], bool], roots: list[Path], slurm_env: dict, what: str) -> float:
    """Wait until ``done()`` (asked every 0.2 s), for as long as something under ``roots`` or in the
    queue keeps changing (looked at every 2 s); fail after :data:`STALL_S` still seconds or
    :data:`CAP_S` in all. Returns the seconds waited."""
    start = moved = looked = time.monotonic()
    last = None
    while not done():
        now = time.monotonic()
        if last is None or now - looked >= 2:
            state, looked = (squeue(slurm_env), *(tree_state(r) for r in roots)), now
            if state != last:
                last, moved = state, now
        queue = " ".join(last[0].split()) or "empty"
        assert now - moved < STALL_S, f"{what}: nothing moved in {STALL_S} s (queue: {queue})"
        assert now - start < CAP_S, f"{what}: still going after {CAP_S} s (queue: {queue})"
        time.sleep(0.2)
    return time.monotonic() - start


def start_sweep(
    args: list[str], cwd: Path, slurm_env: dict, name: str, launcher: list[str] = ON_LOCAL_CLUSTER
) -> subprocess.Popen:
    """``python -m src.run -m <args> sweep_name=<name>`` on the cluster, its output in ``cwd/<name>.out``."""
    env = {**os.environ, **slurm_env, "PYTHONPATH": str(ROOT), "WANDB_MODE": "disabled"}
    with open(cwd / f"{name}.out", "w") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "src.run", "-m", *args, f"sweep_name={name}", *launcher, *QUIET],
            cwd=cwd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def finish(sweeps: dict[str, subprocess.Popen], cwd: Path, slurm_env: dict) -> float:
    """Wait for the launchers (:func:`wait_moving`), each to end with status 0; the seconds it took."""
    waited = wait_moving(
        lambda: all(p.poll() is not None for p in sweeps.values()),
        [cwd / "outputs" / "multirun" / name for name in sweeps],
        slurm_env,
        f"sweeps {', '.join(sweeps)}",
    )
    for name, process in sweeps.items():
        assert process.returncode == 0, (cwd / f"{name}.out").read_text()[-3000:]
    return waited


def run_sweep(args: list[str], cwd: Path, slurm_env: dict, name: str) -> float:
    """One sweep on the cluster, to its end (:func:`finish`)."""
    return finish({name: start_sweep(args, cwd, slurm_env, name)}, cwd, slurm_env)


def clear_queue(slurm_env: dict, grace_s: float = 0) -> None:
    """Let the queue drain for up to ``grace_s``, then cancel what is left and wait until it is empty."""
    env = {**os.environ, **slurm_env}

    def queued() -> list[str]:
        listed = subprocess.run(["squeue", "-h", "-o", "%i"], env=env, capture_output=True, text=True)
        return listed.stdout.split()

    deadline = time.monotonic() + grace_s
    while queued() and time.monotonic() < deadline:
        time.sleep(0.5)
    if left := queued():
        subprocess.run(["scancel", *left], env=env, check=False)
    deadline = time.monotonic() + 60
    while queued():
        assert time.monotonic() < deadline, f"jobs {queued()} still queued a minute after scancel"
        time.sleep(0.5)


@pytest.mark.minutes(0.6)
def test_a_smoke_sweep_runs_on_the_cluster(slurm_env, tmp_path):
    run_sweep(["experiment=smoke/digits"], tmp_path, slurm_env, "smoke_digits")
    runs = summaries(tmp_path / "outputs" / "multirun" / "smoke_digits")
    assert sorted((s["attn"], s["seed"]) for s in runs) == [
        ("precond", 0),
        ("precond", 1),
        ("standard", 0),
        ("standard", 1),
    ]
    assert all(s["steps"] == 30 and s["status"] == "completed" for s in runs)
    job_ids = array_tasks(tmp_path / "outputs" / "multirun" / "smoke_digits")
    assert len(job_ids) == 4 and final_states(job_ids, slurm_env) == ["COMPLETED"] * 4


def array_tasks(sweep_dir: Path) -> list[str]:
    """The SLURM ids of a sweep's jobs (``<array>_<index>``, or a lone job's id), from submitit's folders."""
    names = sorted(p.name for p in (sweep_dir / ".submitit").iterdir() if p.is_dir())
    return [n for n in names if "_" in n] or names


def final_states(job_ids: list[str], slurm_env: dict, wait_s: float = 60) -> list[str]:
    """The jobs' accounting states once none is still running (the result can land first)."""
    deadline = time.monotonic() + wait_s
    while True:
        states = subprocess.run(
            ["sacct", "-n", "-X", "-o", "State", "-j", ",".join(job_ids)],
            env={**os.environ, **slurm_env},
            capture_output=True,
            text=True,
        ).stdout.split()
        if not {"RUNNING", "COMPLETING", "PENDING"} & set(states) or time.monotonic() > deadline:
            return states
        time.sleep(0.5)


#: the requeue test's length: the job is frozen at step 50 (its fifth metrics row) and requeued, so it
#: resumes with most of the run ahead; a validation before the stop (best.pt) and after it
REQUEUE_ARGS = [
    *("trainer.max_steps=200", "trainer.checkpoint_every=10", "trainer.val_every=50", "attn=precond"),
    *("trainer.device=cpu", "task.batch_size=32", "hydra.launcher.nodes=2"),
]
STOP_AT = 50


def job_pids(job_id: str, slurm_env: dict) -> list[int]:
    """The job's training processes (python, one per node: every node shares this host's PIDs)."""
    raw = subprocess.run(
        ["squeue", "-h", "-j", job_id, "-o", "%A"],
        env={**os.environ, **slurm_env},
        capture_output=True,
        text=True,
    ).stdout.split()
    assert raw, f"job {job_id} is not in the queue"
    pids = []
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            environ = (proc / "environ").read_bytes().split(b"\0")
            if f"SLURM_JOB_ID={raw[0]}".encode() in environ and "python" in os.readlink(proc / "exe"):
                pids.append(int(proc.name))
    return pids


def waiting(pid: int, signum: int) -> bool:
    """Whether ``pid`` is stopped (state T) without ``signum`` pending; a process that is gone is not."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
    pending = int(fields["ShdPnd"], 16) | int(fields["SigPnd"], 16)
    return fields["State"].startswith("T") and not pending & (1 << (signum - 1))


@contextlib.contextmanager
def frozen(job_id: str, slurm_env: dict, signum: int, processes: int) -> Iterator[list[int]]:
    """The job's ``processes`` training processes stopped (SIGSTOP) inside the block, so that
    ``signum``, sent there (a requeue's SIGTERM, a time limit's SIGUSR2), reaches them at the step
    they had reached, however slow the machine is. On leaving, once ``signum`` is pending on each
    (or SLURM has resumed it: it sends SIGCONT before a requeue's SIGTERM), each gets SIGCONT."""
    pids = job_pids(job_id, slurm_env)
    assert len(pids) == processes, f"job {job_id}: expected {processes} training processes, found {pids}"
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield pids
    finally:
        deadline = time.monotonic() + 60
        while any(waiting(pid, signum) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


def wait_for_step(step: int, launcher: subprocess.Popen, root: Path, slurm_env: dict) -> float:
    """Wait (:func:`wait_moving`) until the sweep under ``root`` has logged ``step``; the seconds it took."""

    def reached() -> bool:
        found = list(root.glob("**/metrics.jsonl"))
        return bool(found) and any(r["step"] >= step for r in read_metrics(found[0].parent, warn=False))

    waited = wait_moving(lambda: reached() or launcher.poll() is not None, [root], slurm_env, f"step {step}")
    assert reached(), (root.parents[2] / f"{root.name}.out").read_text()[-3000:]  # the sweep ended first
    return waited


@pytest.mark.minutes(1.5)
def test_a_requeued_two_node_job_resumes_and_ends_like_an_uninterrupted_one(slurm_env, tmp_path):
    """A job on both nodes (one DDP process each), requeued mid-run, stops at the step it reached
    with a checkpoint, resumes from that step, and ends bit-identical to the same two-node job left
    alone (run beside it, in a sweep of its own)."""
    env = {**os.environ, **slurm_env}
    sweeps = {name: start_sweep(REQUEUE_ARGS, tmp_path, slurm_env, name) for name in ("requeue", "reference")}
    root = tmp_path / "outputs" / "multirun" / "requeue"

    try:
        waited = wait_for_step(STOP_AT, sweeps["requeue"], root, slurm_env)
        (job_id,) = array_tasks(root)
        with frozen(job_id, slurm_env, signal.SIGTERM, processes=2):
            subprocess.run(["scontrol", "requeue", job_id], env=env, check=True)
        rest = finish(sweeps, tmp_path, slurm_env)
    finally:
        for process in sweeps.values():  # a failed wait: the fixture cancels the jobs, this their launchers
            if process.poll() is None:
                process.kill()

    assert final_states([job_id], slurm_env) == ["COMPLETED"]
    history = subprocess.run(
        ["sacct", "-n", "-X", "-D", "-o", "State", "-j", job_id], env=env, capture_output=True, text=True
    ).stdout.split()
    assert "REQUEUED" in history
    logs = sorted((root / ".submitit" / job_id).glob("*_log.out"))
    assert len(logs) == 2  # one task per node
    assert [log.read_text().count("Starting with JobEnvironment") for log in logs] == [
        2,
        2,
    ]  # stopped, started again
    (run_dir,) = (p.parent for p in root.glob("**/summary.json"))
    steps = [r["step"] for r in read_metrics(run_dir)]
    assert steps == sorted(steps) and steps[-1] == 200  # resumed: no step logged twice, none lost

    (stop,) = [json.loads(line) for line in (run_dir / "failures.jsonl").read_text().splitlines()]
    assert stop["error"].startswith(f"Preempted: stopped by SIGTERM at step {stop['step']} of 200")
    assert STOP_AT <= stop["step"] < 200  # where it was frozen (SIGCONT and SIGTERM may let a step or two by)
    print(f"step {STOP_AT} after {waited:.0f} s, stopped at {stop['step']}, both done {rest:.0f} s later")
    (requeued,) = summaries(root)
    (uninterrupted,) = summaries(tmp_path / "outputs" / "multirun" / "reference")
    first, second = requeued["sessions"]  # two sessions, no more
    assert first["to_step"] == second["from_step"] == stop["step"]  # resumed from the SIGTERM's checkpoint
    assert requeued["world_size"] == uninterrupted["world_size"] == 2
    assert requeued["final"] == uninterrupted["final"] and requeued["best"] == uninterrupted["best"]


@pytest.mark.minutes(1)
def test_a_job_on_two_nodes_trains_one_model(slurm_env, tmp_path):
    """nodes = 2, one task each: one DDP process per node (gloo between the two namespaces), one
    run record, the global batch kept (2 × 16), and the loss curve of the same run on one process."""
    args = ["trainer.max_steps=10", "trainer.val_every=10", "trainer.log_every=1", "trainer.device=cpu"]
    args += ["task.batch_size=32"]
    run_sweep([*args, "hydra.launcher.nodes=2"], tmp_path, slurm_env, "ddp")
    (summary,) = summaries(tmp_path / "outputs" / "multirun" / "ddp")
    assert summary["world_size"] == 2 and summary["steps"] == 10
    assert summary["batch"] == {"global_batch": 32, "per_process": 16, "world": 2, "accumulate": 1}
    (job_id,) = array_tasks(tmp_path / "outputs" / "multirun" / "ddp")
    assert final_states([job_id], slurm_env) == ["COMPLETED"]
    placed = subprocess.run(
        ["sacct", "-n", "-X", "-o", "NodeList%40", "-j", job_id],
        env={**os.environ, **slurm_env},
        capture_output=True,
        text=True,
    )
    assert placed.stdout.split() == ["ca-n[1-2]"]  # both nodes, not two tasks on one
    (tmp_path / "single").mkdir()
    single = run_cli(args, cwd=tmp_path / "single", timeout=CAP_S)
    assert single.returncode == 0, single.stderr

    def curve(root: Path) -> list[float]:
        (metrics,) = root.glob("**/metrics.jsonl")
        return [r["train/loss"] for r in read_metrics(metrics.parent) if r["split"] == "train"]

    two, one = curve(tmp_path / "outputs" / "multirun" / "ddp"), curve(tmp_path / "single")
    assert len(two) == len(one) == 10
    assert two == pytest.approx(one, rel=1e-4, abs=1e-5)  # the same model, up to the all-reduce's rounding


@contextlib.contextmanager
def partition_limit(minutes: int, slurm_env: dict) -> Iterator[None]:
    """The local cluster's partition limited to ``minutes`` (``MaxTime``) inside the block."""
    env = {**os.environ, **slurm_env}
    (before,) = subprocess.run(
        ["sinfo", "-h", "-p", "debug", "-o", "%l"], env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    update = ["scontrol", "update", "PartitionName=debug"]
    subprocess.run([*update, f"MaxTime={minutes}"], env=env, check=True)
    try:
        yield
    finally:
        subprocess.run([*update, f"MaxTime={before.upper()}"], env=env, check=True)


@pytest.mark.minutes(1)
def test_a_run_longer_than_the_partition_runs_in_attempts_requeued_at_their_time_limit(slurm_env, tmp_path):
    """A run of 600 min on a partition whose MaxTime is 5: the job asks 5 (resources.max_time_min=auto
    reads it with sinfo), and SLURM's time-limit signal (SIGUSR2, sent here early, the job frozen
    at step 50 first) makes the loop save, submitit count a timeout and requeue, and the next
    attempt resume from that step to the end."""
    env = {**os.environ, **slurm_env}
    args = ["trainer.max_steps=200", "trainer.checkpoint_every=10", "trainer.device=cpu"]
    args += ["resources.time_min=600", "resources.max_time_min=auto"]
    launcher = [o for o in ON_LOCAL_CLUSTER if not o.startswith("hydra.launcher.timeout_min")]
    root = tmp_path / "outputs" / "multirun" / "timeout"
    with partition_limit(5, slurm_env):
        sweep = start_sweep(args, tmp_path, slurm_env, "timeout", launcher)
        try:
            wait_for_step(STOP_AT, sweep, root, slurm_env)
            (job_id,) = array_tasks(root)
            with frozen(job_id, slurm_env, signal.SIGUSR2, processes=1):
                subprocess.run(["scancel", "--signal=USR2", job_id], env=env, check=True)
            finish({"timeout": sweep}, tmp_path, slurm_env)
        finally:
            if sweep.poll() is None:
                sweep.kill()

    said = (tmp_path / "timeout.out").read_text()
    needed = -(-600 * 60 // (5 * 60 - 10))  # attempts of 5 min, each signalled 10 s early
    assert (
        f"each SLURM attempt asks 5 of the run's 600 min (the partition's MaxTime): {needed} attempts" in said
    )
    (script,) = (root / ".submitit" / job_id).glob("*_submission.sh")
    assert "#SBATCH --time=5\n" in script.read_text()  # the partition's MaxTime, not the run's 600
    history = subprocess.run(
        ["sacct", "-n", "-X", "-D", "-o", "State", "-j", job_id], env=env, capture_output=True, text=True
    ).stdout.split()
    assert "REQUEUED" in history and final_states([job_id], slurm_env) == ["COMPLETED"]
    logs = "".join(log.read_text() for log in (root / ".submitit" / job_id).glob("*_log.*"))
    assert "Caught signal SIGUSR2" in logs and "this job is timed-out" in logs  # counted as a timeout

    (run_dir,) = (p.parent for p in root.glob("**/summary.json"))
    (stop,) = [json.loads(line) for line in (run_dir / "failures.jsonl").read_text().splitlines()]
    assert stop["error"].startswith(f"Preempted: stopped by SIGUSR2 at step {stop['step']} of 200")
    (summary,) = summaries(root)
    first, second = summary["sessions"]
    assert STOP_AT <= first["to_step"] == second["from_step"] == stop["step"] < 200
    steps = [r["step"] for r in read_metrics(run_dir)]
    assert steps == sorted(steps) and summary["steps"] == 200 and summary["status"] == "completed"
