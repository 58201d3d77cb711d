"""Issue 39, items 5-7: every output a command writes is locked or written whole after checking
where it goes, runs are bounded before they start, and the commands' minor cases end in one line.

Each test's docstring names its case in the issue's words; each failed on the code before the fix.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, one_error_line

from src.engine.record.lock import RunLock


def run_module(*args: str, timeout: float = 120, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


# -- item 5: locks and outputs ---------------------------------------------------------------


def a_record(folder: Path) -> Path:
    """A completed digits run's record by hand: what launch.analysis.report reads."""
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(
        "task: {name: digits}\nbackbone: {name: vit_digits}\nattn: {variant: standard}\nseed: 0\n"
    )
    (folder / "metrics.jsonl").write_text('{"step": 1, "split": "val", "val/acc": 0.5}\n')
    summary = {"status": "completed", "final": {"val/acc": 0.5}, "metric": "val/acc", "task": "digits",
               "attn": "standard", "seed": 0, "steps": 1}  # fmt: skip
    (folder / "summary.json").write_text(json.dumps(summary))
    return folder


def test_a_report_into_an_out_another_report_writes_is_refused(tmp_path, capsys):
    """Locks on every output folder a command writes: two reports into one --out at once; the
    second is one line and exit 2, writing nothing there (before: both wrote, files of either)."""
    from launch.analysis.report import main

    a_record(tmp_path / "runs" / "a")
    out = tmp_path / "out"
    with RunLock(out):
        assert main([str(tmp_path / "runs"), "--out", str(out)]) == 2
        line = one_error_line(capsys.readouterr().err)
        assert (
            f"output folder {out} is in use by process {os.getpid()}" in line
            and "launch.analysis.report" in line
        )
        assert sorted(p.name for p in out.iterdir()) == [".lock"]
    assert main([str(tmp_path / "runs"), "--out", str(out)]) == 0
    assert (out / "report.md").is_file() and not (out / ".lock").exists()


def test_gpu_check_checks_its_out_before_the_check(tmp_path, monkeypatch, capsys):
    """gpu_check --out /proc/nope/g.json ran the whole check, then a traceback: now one line and
    exit 2 before anything runs."""
    from launch.tools import gpu_check

    def ran(*args, **kwargs):
        raise AssertionError("the check ran")

    monkeypatch.setattr(gpu_check, "run", ran)
    assert gpu_check.main(["--dry", "--out", "/proc/nope/g.json"]) == 2
    assert "--out /proc/nope/g.json: cannot write there" in one_error_line(capsys.readouterr().err)
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    assert gpu_check.main(["--dry", "--out", str(blocked / "g.json")]) == 2
    assert "cannot write there" in one_error_line(capsys.readouterr().err)


def test_bench_checks_its_out_before_the_benchmark(monkeypatch, capsys):
    """The same for launch.tools.bench --out: refused before it measures anything."""
    from launch.tools import bench

    monkeypatch.setattr(bench, "machine", lambda args: (_ for _ in ()).throw(AssertionError("it ran")))
    assert bench.main(["--out", "/proc/nope/b.json"]) == 2
    assert "--out /proc/nope/b.json: cannot write there" in one_error_line(capsys.readouterr().err)


# -- item 7: the commands' minor cases --------------------------------------------------------


def test_a_wandb_sweep_whose_runs_every_agent_refuses_is_not_written(tmp_path, capsys):
    """launch.wandb_sweep … task.batch_size=0 wrote a spec every agent will refuse: now one line,
    exit 2, no file."""
    from launch.wandb_sweep import main

    out = tmp_path / "sweep.yaml"
    assert main(["experiment=digits_variants", "task.batch_size=0", "--out", str(out)]) == 2
    assert "task.batch_size=0 must be at least 1" in one_error_line(capsys.readouterr().err)
    assert not out.exists()
    assert main(["experiment=digits_variants", "seed=0,-1", "--out", str(out)]) == 2
    assert "seed=-1 must be an integer from 0" in one_error_line(capsys.readouterr().err)
    assert main(["experiment=digits_variants", "--out", str(out)]) == 0 and out.is_file()


def test_a_plan_of_a_run_src_run_refuses_prints_no_hours(capsys):
    """launch.plan trainer.max_steps=-5 printed negative GPU-hours: now src.run's own line, exit 2."""
    from launch.plan import main

    assert main(["trainer.max_steps=-5"]) == 2
    captured = capsys.readouterr()
    assert "trainer.max_steps=-5 must be at least 1" in one_error_line(captured.err)
    assert "GPU-hours" not in captured.out


def test_a_plan_of_a_step_of_millions_of_epochs_is_refused(capsys):
    """The global batch bound in the plan too: ImageNet at trainer.accumulate=1000000000."""
    from launch.plan import main

    assert main(["experiment=paper/imagenet", "trainer.accumulate=1000000000"]) == 2
    assert "more than 4 epochs of the training set" in one_error_line(capsys.readouterr().err)


def test_a_sweep_name_with_a_quote_is_one_line_not_a_syntax_error(tmp_path, capsys):
    """launch.analysis.dashboard --sweep "a'b": a SyntaxError (the name pasted into a filter expression);
    now one line, exit 2, no specification written. A name W&B can filter on still works."""
    from launch.analysis.dashboard import main

    out = tmp_path / "spec.json"
    for name in ("a'b", "a\\b", "a\nb"):
        assert main(["--entity", "e", "--project", "p", "--sweep", name, "--dry-run", str(out)]) == 2
        assert "W&B's run filters cannot select" in one_error_line(capsys.readouterr().err)
        assert not out.exists()
    assert main(["--entity", "e", "--project", "p", "--sweep", 'day "2"', "--dry-run", str(out)]) == 0
    assert 'day \\"2\\"' in out.read_text()


# -- item 6: bounds that stop a run before it starts ------------------------------------------


def test_a_huge_accumulate_is_refused_before_training(tmp_path):
    """trainer.accumulate=1000000000 was accepted ("batch 64000000000" on the 1,437 samples there
    were before the test split) and its first step never ended: now one line, exit 2, within
    seconds, and nothing trained."""
    started = time.monotonic()
    done = run_module(
        "src.run", "trainer.accumulate=1000000000", f"paths.output_dir={tmp_path}", "trainer.progress=none"
    )
    assert done.returncode == 2, done.stderr[-2000:]
    line = one_error_line(done.stderr)
    assert "the global batch 64,000,000,000" in line and "1,078 samples an epoch" in line
    assert time.monotonic() - started < 100
    assert not list(tmp_path.rglob("metrics.jsonl")) and not list(tmp_path.rglob("*.pt"))


def test_a_global_batch_of_a_few_epochs_is_refused_in_process(tmp_path):
    """The bound itself: 64 × 100 = 6,400 samples a step on digits' 1,078 (5.94 epochs) is refused
    by train() before the model is built; 64 × 67 = 4,288 (3.98 epochs) is not refused for that,
    and 64 × 68 = 4,352 (4.04 epochs) is."""
    from conftest import compose

    from src.engine import train
    from src.errors import ConfigError

    with pytest.raises(ConfigError, match=r"global batch 6,400 .* more than 4 epochs"):
        train(compose(["trainer.accumulate=100", "trainer.max_steps=1"], tmp_path), tmp_path / "run")
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
    from src.engine.loop.batching import check_global_batch, plan_batch

    check_global_batch(plan_batch(64, 67, 1), 1078)  # within the bound: no error
    with pytest.raises(ConfigError, match="more than 4 epochs"):
        check_global_batch(plan_batch(64, 68, 1), 1078)


def test_planning_a_huge_batch_is_immediate():
    """plan_batch tried every accumulation from 1 upwards: a billion for accumulate=1000000000.
    Now its smallest divisor at or above the fewest micro-batches, found in √n trials."""
    from src.engine.loop.batching import plan_batch

    started = time.monotonic()
    plan = plan_batch(64, 1_000_000_000, 1)
    assert (plan.per_process, plan.accumulate) == (64, 1_000_000_000)
    plan = plan_batch(64, 999_999_937, 1)  # a prime accumulation
    assert plan.per_process * plan.accumulate == 64 * 999_999_937 and plan.per_process <= 64
    assert time.monotonic() - started < 2


# -- a signal inside a long step: stopped at a micro-batch boundary, resumed exactly ----------

LONG_STEPS = [
    "trainer.max_steps=6",
    "task.batch_size=16",
    "trainer.accumulate=4",  # 4 micro-batches a step
    "+backbone.model.drop_rate=0.1",  # dropout: each micro-batch draws from the RNG
    "trainer.checkpoint_every=2",
    "trainer.log_every=1",
    "trainer.val_every=3",
    "trainer.monitor_every=0",
    "trainer.threads=1",
]


def signal_at_micro_batch(monkeypatch, call: int) -> None:
    """SIGTERM to this process during the ``call``-th micro-batch (1-based) of the run."""
    import signal

    from tasks.classification import Digits

    original, calls = Digits.train_loss, []

    def counted(self, model, batch):
        calls.append(1)
        if len(calls) == call:
            os.kill(os.getpid(), signal.SIGTERM)
        return original(self, model, batch)

    monkeypatch.setattr(Digits, "train_loss", counted)


def interrupted(tmp_path: Path, monkeypatch, wait_s: float | None):
    """The LONG_STEPS run stopped by SIGTERM in micro-batch 2 of step 4 (the run's 14th), with
    ``STEP_WAIT_S`` at ``wait_s`` (None: as it is); the run folder and the :class:`Preempted`."""
    from conftest import compose

    from src.engine import train
    from src.engine.loop import preemption

    for key in [k for k in os.environ if k.startswith("SLURM_")]:
        monkeypatch.delenv(key)
    if wait_s is not None:
        monkeypatch.setattr(preemption, "STEP_WAIT_S", wait_s)
    cfg = compose(LONG_STEPS, tmp_path / "outputs")
    run = tmp_path / "stopped"
    with monkeypatch.context() as hooked:
        signal_at_micro_batch(hooked, 14)
        with pytest.raises(preemption.Preempted) as stopped:
            train(cfg, run)
    return cfg, run, stopped.value


def test_a_signal_inside_a_long_step_stops_at_the_next_micro_batch_and_resumes_exactly(tmp_path, monkeypatch):
    """A signal that arrives inside a step longer than the bound ends the step at the next
    micro-batch boundary with a checkpoint (before: SIGTERM waited for a step boundary that a huge
    accumulation never reached). No partial update is applied: last.pt holds step 3's weights with
    step 4's gradients over its first 2 micro-batches; the rerun completes step 4 from there and
    ends bit-identical (weights, optimizer, every logged loss) to the run never stopped."""
    import torch

    from src.engine import train
    from src.engine.record import checkpoint
    from src.engine.record.files import read_metrics

    cfg, run, stopped = interrupted(tmp_path, monkeypatch, wait_s=0.0)
    assert (stopped.step, stopped.within) == (3, (2, 4))
    assert "at step 3 of 6, 2 of 4 micro-batches into step 4: checkpoint saved" in str(stopped)
    saved = checkpoint.load(run / "checkpoints" / "last.pt")
    assert saved["loop"]["step"] == 3 and saved["partial"]["micro"] == 2
    assert saved["loop"]["position"]["batch"] == 3 * 4 + 2  # the micro-batches served so far
    step_3 = checkpoint.load(run / "checkpoints" / "previous.pt")  # the boundary before (checkpoint_every=2)
    assert step_3["loop"]["step"] == 2

    train(cfg, run)  # the same command again
    whole = tmp_path / "whole"
    train(cfg, whole)
    mine, theirs = (checkpoint.load(r / "checkpoints" / "last.pt") for r in (run, whole))
    assert mine["loop"]["step"] == theirs["loop"]["step"] == 6 and "partial" not in mine
    for key in theirs["model"]:
        assert torch.equal(mine["model"][key], theirs["model"][key]), key
    for a, b in zip(mine["optimizer"]["state"].values(), theirs["optimizer"]["state"].values(), strict=True):
        assert all(torch.equal(a[k], b[k]) for k in b)
    rows = [[{k: v for k, v in r.items() if k not in ("throughput", "time")} for r in read_metrics(r)]
            for r in (run, whole)]  # fmt: skip
    strip = [[{k: v for k, v in r.items() if "per_s" not in k and k != "wall_s"} for r in rs] for rs in rows]
    assert strip[0] == strip[1]


def test_a_signal_inside_a_short_step_still_ends_that_step(tmp_path, monkeypatch):
    """The bound: a step far shorter than STEP_WAIT_S is not cut; the signal stops the run at its
    end, step 4, with no partial state in last.pt."""
    from src.engine.record import checkpoint

    _, run, stopped = interrupted(tmp_path, monkeypatch, wait_s=None)
    assert (stopped.step, stopped.within) == (4, None)
    assert "partial" not in checkpoint.load(run / "checkpoints" / "last.pt")


def test_a_step_saved_midway_is_not_resumed_under_another_split(tmp_path, monkeypatch):
    """Gradients summed over one split of the batch cannot go on under another, nor can a partial
    step that is not one (damaged, foreign): one line naming previous.pt, from which the step is
    redone whole."""
    import torch

    from src.engine import train
    from src.engine.record import checkpoint
    from src.engine.record.checkpoint import CheckpointError

    cfg, run, _ = interrupted(tmp_path, monkeypatch, wait_s=0.0)
    last = run / "checkpoints" / "last.pt"
    saved = checkpoint.load(last)
    saved["partial"]["plan"] = {**saved["partial"]["plan"], "world": 2, "per_process": 8}
    torch.save(saved, last)
    with pytest.raises(CheckpointError, match="holds step 4 midway .* move last.pt aside to redo that step"):
        train(cfg, run)
    saved["partial"] = {**saved["partial"], "grads": "not gradients"}  # a damaged or foreign file
    torch.save(saved, last)
    with pytest.raises(CheckpointError, match="holds step 4 midway in a form this run cannot resume"):
        train(cfg, run)


# -- a failed job of a multirun ends in its line and the sweep's ------------------------------


def test_a_refused_job_of_a_multirun_ends_in_its_line_and_the_sweeps(tmp_path):
    """Two sweeps with an overlapping seed into one sweep folder: the refused one ended in a
    15-line traceback and no `sweep done` line (every failed job ended a multirun that way). Now:
    the other jobs run, then one `error:` line for the refused job, the sweep's line counting it
    failed, exit 2, no traceback; the folder the other sweep holds is left as it was."""
    sweep = tmp_path / "outputs" / "multirun" / "day"
    held = sweep / "digits" / "vit_digits" / "precond" / "seed=0,trainer.max_steps=2"
    args = ["-m", "seed=0,1", "trainer.max_steps=2", "sweep_name=day"]
    with RunLock(held):  # the other sweep, training seed 0 there
        done = run_module("src.run", *args, "trainer.progress=none", cwd=tmp_path, timeout=300)
        assert {p.name for p in held.iterdir()} <= {".lock", "run.log"}  # no record (Hydra's log aside)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert (
        len(errors) == 1
        and f"job 0 ({held}): run folder {held} is in use by process {os.getpid()}" in errors[0]
    )
    end = done.stdout.strip().splitlines()[-1]
    assert end.startswith("sweep done: 2 runs (1 completed, 1 failed) in ")
    assert json.loads((sweep / "digits" / "vit_digits" / "precond" / "seed=1,trainer.max_steps=2" /
                       "summary.json").read_text())["status"] == "completed"  # fmt: skip


def test_a_bug_in_a_job_is_its_line_with_the_traceback_kept_beside(tmp_path, capsys):
    """A job that fails on an unexpected error: its line names the error and the file that keeps
    its traceback; the sweep line counts it failed and the multirun exits 2."""
    from hydra.core.utils import JobReturn, JobStatus
    from omegaconf import OmegaConf

    from launch.cluster.callbacks import SweepEnd

    sweep = tmp_path / "sweep"
    config = OmegaConf.create({"hydra": {"mode": "RunMode.MULTIRUN", "sweep": {"dir": str(sweep)}}})
    driver = SweepEnd()
    driver.on_multirun_start(config)
    job = OmegaConf.merge(
        config, {"hydra": {"runtime": {"output_dir": str(tmp_path / "run")}, "job": {"num": 0}}}
    )
    try:
        raise KeyError("boom")
    except KeyError as error:
        ret = JobReturn(status=JobStatus.FAILED, _return_value=error)
    driver.on_job_start(job, task_function=None)
    driver.on_job_end(job, job_return=ret)
    assert ret.status == JobStatus.COMPLETED and ret.return_value is None  # the sweeper goes on
    with pytest.raises(SystemExit) as exited:
        driver.on_multirun_end(config)
    assert exited.value.code == 2
    out = capsys.readouterr()
    line = one_error_line(out.err)
    traceback_file = Path(driver.tracking) / "job-0.traceback.txt"
    assert line == f"error: job 0 ({tmp_path / 'run'}): KeyError: 'boom' (traceback: {traceback_file})"
    assert "raise KeyError" in traceback_file.read_text()
    assert out.out.startswith("sweep done: 1 run (1 failed) in ")


# -- trainer.resume=restart keeps each session's log with its record ------------------------


def test_a_restart_moves_the_superseded_runs_log_with_its_record(tmp_path, caplog):
    """After trainer.resume=restart, superseded/1/ had no run.log and the new record's run.log
    started with the superseded run's lines. Now superseded/1/run.log holds the first run's lines
    (its one end line), and the new run.log starts with the new session's own. The log is written
    as Hydra's job log writes it: a FileHandler on the root logger, open for the whole process."""
    import logging

    from conftest import compose

    from src.engine import train

    caplog.set_level(logging.INFO)
    run = tmp_path / "run"
    run.mkdir()
    handler = logging.FileHandler(run / "run.log")
    handler.setFormatter(logging.Formatter("[%(name)s] - %(message)s"))
    logging.getLogger().addHandler(handler)
    try:
        args = ["trainer.max_steps=2", "trainer.monitor_every=0", "trainer.eval_batches=1"]
        train(compose(args, tmp_path), run)
        handler.flush()
        before = (run / "run.log").read_text()
        assert before.count("] - done: ") == 1
        train(compose([*args, "trainer.resume=restart"], tmp_path), run)
        handler.flush()
    finally:
        logging.getLogger().removeHandler(handler)
        handler.close()
    assert (run / "superseded" / "1" / "run.log").read_text() == before
    now = (run / "run.log").read_text()
    assert now.count("] - done: ") == 1 and before not in now
    assert now.splitlines()[-1].endswith(f"{run}: summary.json, eval-test.json, checkpoints/best.pt")
