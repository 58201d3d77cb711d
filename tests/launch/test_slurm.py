"""A real SLURM cluster on localhost (launch/local_slurm.sh): a smoke sweep through
hydra/launcher=slurm, and a job requeued mid-run that resumes to the same result."""

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
    status = subprocess.run([SCRIPT, "status"], capture_output=True, text=True).stdout
    already = "slurmctld running" in status
    started = time.monotonic()
    subprocess.run([SCRIPT, "start"], check=True, timeout=120)
    assert time.monotonic() - started < 60, "the local cluster should start in well under a minute"
    conf = subprocess.run([SCRIPT, "conf"], capture_output=True, text=True, check=True).stdout.strip()
    env = {"SLURM_CONF": conf}
    if not already:  # jobs a stopped cluster left in its saved state come back as RUNNING or PENDING
        clear_queue(env)
    yield env
    if not already:
        clear_queue(env, grace_s=60)  # stopping under a finishing job would leave it for the next start
        subprocess.run([SCRIPT, "stop"], check=True)


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


def test_a_requeued_job_resumes_and_ends_like_an_uninterrupted_run(slurm_env, tmp_path):
    # long enough (~20 s at 2 cores) that the requeue lands while the job trains: at 120 steps
    # (~3 s) the job once finished before scontrol's signal reached it
    args = ["trainer.max_steps=1000", "trainer.checkpoint_every=10", "trainer.val_every=250", "attn=precond"]
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
    (log,) = (tmp_path / "outputs" / "multirun" / "requeue" / ".submitit" / job_id).glob("*_log.out")
    assert log.read_text().count("Starting with JobEnvironment") == 2  # killed mid-run, started again
    steps = [r["step"] for r in read_metrics(metrics.parent)]
    assert steps == sorted(steps) and steps[-1] == 1000  # resumed: no step logged twice, none lost

    (tmp_path / "reference").mkdir()
    reference = run_cli(args, cwd=tmp_path / "reference")
    assert reference.returncode == 0, reference.stderr
    (requeued,) = summaries(tmp_path / "outputs" / "multirun" / "requeue")
    (uninterrupted,) = summaries(tmp_path / "reference" / "outputs")
    assert requeued["final"] == uninterrupted["final"] and requeued["best"] == uninterrupted["best"]


def test_a_job_with_two_tasks_trains_with_ddp(slurm_env, tmp_path):
    """tasks_per_node = 2 (as GPUs per node would set it): one DDP process per task (gloo here)."""
    args = [
        "trainer.max_steps=10",
        "trainer.val_every=10",
        "trainer.device=cpu",
        "task.batch_size=32",
        "sweep_name=ddp",
        *ON_LOCAL_CLUSTER,
        "hydra.launcher.tasks_per_node=2",
    ]
    result = run_cli(["-m", *args], cwd=tmp_path, env=slurm_env)
    assert result.returncode == 0, result.stderr[-3000:]
    (summary,) = summaries(tmp_path / "outputs" / "multirun" / "ddp")
    assert summary["world_size"] == 2 and summary["steps"] == 10
    job_ids = array_tasks(tmp_path / "outputs" / "multirun" / "ddp")
    assert final_states(job_ids, slurm_env) == ["COMPLETED"]
