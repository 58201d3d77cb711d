"""A real SLURM cluster on localhost (launch/local_slurm.sh) of two nodes, each a network
namespace with its own slurmd: a smoke sweep through hydra/launcher=slurm, a job on both nodes
that trains one model, and a two-node job requeued mid-run that resumes to the end of an
uninterrupted one."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import QUIET, ROOT, run_cli

from src.engine.record.files import read_metrics

SCRIPT = ROOT / "launch" / "local_slurm.sh"
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


@pytest.fixture(scope="module")
def slurm_env():
    if shutil.which("slurmctld") is None or os.geteuid() != 0:
        reason = "needs root and Debian's slurm packages (launch/local_slurm.sh install)"
        if os.environ.get("REQUIRE_SLURM"):
            pytest.fail(reason)
        pytest.skip(reason)
    two = {**os.environ, "SLURM_LOCAL_NODES": "2"}
    status = subprocess.run([SCRIPT, "status"], capture_output=True, text=True, env=two).stdout
    already = "slurmctld running" in status
    started = time.monotonic()
    subprocess.run([SCRIPT, "start"], check=True, timeout=120, env=two)
    assert time.monotonic() - started < 60, "the local cluster should start in well under a minute"
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


def summaries(root: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in root.glob("**/summary.json")]


def test_a_smoke_sweep_runs_on_the_cluster(slurm_env, tmp_path):
    result = run_cli(["-m", "experiment=smoke/digits", *ON_LOCAL_CLUSTER], cwd=tmp_path, env=slurm_env)
    assert result.returncode == 0, result.stderr[-3000:]
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


def test_a_requeued_two_node_job_resumes_and_ends_like_an_uninterrupted_one(slurm_env, tmp_path):
    """A job on both nodes (one DDP process each), requeued mid-run, resumes from its checkpoint
    and ends bit-identical to the same two-node job left alone."""
    # long enough (~20 s at 2 cores) that the requeue lands while the job trains: at 120 steps
    # (~3 s) the job once finished before scontrol's signal reached it
    args = [
        *("trainer.max_steps=1000", "trainer.checkpoint_every=10", "trainer.val_every=250", "attn=precond"),
        *("trainer.device=cpu", "task.batch_size=32", "hydra.launcher.nodes=2"),
    ]
    env = {**os.environ, **slurm_env, "PYTHONPATH": str(ROOT), "WANDB_MODE": "disabled"}
    launcher = subprocess.Popen(
        [sys.executable, "-m", "src.run", "-m", *args, "sweep_name=requeue", *ON_LOCAL_CLUSTER, *QUIET],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    metrics = None
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and metrics is None:
        found = list(tmp_path.glob("outputs/multirun/requeue/**/metrics.jsonl"))
        if found and any(r["step"] >= 45 for r in read_metrics(found[0].parent, warn=False)):
            metrics = found[0]
        time.sleep(0.2)
    assert metrics is not None, "the job never got past step 45"
    (job_id,) = array_tasks(tmp_path / "outputs" / "multirun" / "requeue")
    subprocess.run(["scontrol", "requeue", job_id], env=env, check=True)
    output, _ = launcher.communicate(timeout=600)
    assert launcher.returncode == 0, output[-3000:]

    assert final_states([job_id], slurm_env) == ["COMPLETED"]
    history = subprocess.run(
        ["sacct", "-n", "-X", "-D", "-o", "State", "-j", job_id], env=env, capture_output=True, text=True
    ).stdout.split()
    assert "REQUEUED" in history
    logs = sorted((tmp_path / "outputs" / "multirun" / "requeue" / ".submitit" / job_id).glob("*_log.out"))
    assert len(logs) == 2  # one task per node
    assert [log.read_text().count("Starting with JobEnvironment") for log in logs] == [
        2,
        2,
    ]  # killed, started again
    steps = [r["step"] for r in read_metrics(metrics.parent)]
    assert steps == sorted(steps) and steps[-1] == 1000  # resumed: no step logged twice, none lost

    reference = run_cli(["-m", *args, "sweep_name=reference", *ON_LOCAL_CLUSTER], cwd=tmp_path, env=slurm_env)
    assert reference.returncode == 0, reference.stderr[-3000:]
    (requeued,) = summaries(tmp_path / "outputs" / "multirun" / "requeue")
    (uninterrupted,) = summaries(tmp_path / "outputs" / "multirun" / "reference")
    assert requeued["world_size"] == uninterrupted["world_size"] == 2
    assert requeued["final"] == uninterrupted["final"] and requeued["best"] == uninterrupted["best"]


def test_a_job_on_two_nodes_trains_one_model(slurm_env, tmp_path):
    """nodes = 2, one task each: one DDP process per node (gloo between the two namespaces), one
    run record, the global batch kept (2 × 16), and the loss curve of the same run on one process."""
    args = ["trainer.max_steps=10", "trainer.val_every=10", "trainer.log_every=1", "trainer.device=cpu"]
    args += ["task.batch_size=32"]
    result = run_cli(
        ["-m", *args, "sweep_name=ddp", *ON_LOCAL_CLUSTER, "hydra.launcher.nodes=2"],
        cwd=tmp_path,
        env=slurm_env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
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
    single = run_cli(args, cwd=tmp_path / "single")
    assert single.returncode == 0, single.stderr

    def curve(root: Path) -> list[float]:
        (metrics,) = root.glob("**/metrics.jsonl")
        return [r["train/loss"] for r in read_metrics(metrics.parent) if r["split"] == "train"]

    two, one = curve(tmp_path / "outputs" / "multirun" / "ddp"), curve(tmp_path / "single")
    assert len(two) == len(one) == 10
    assert two == pytest.approx(one, rel=1e-4, abs=1e-5)  # the same model, up to the all-reduce's rounding
