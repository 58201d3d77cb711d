"""What a run says: its start and end lines, a complete record's line, progress as log lines
where no bar can be drawn, and the line that ends a multirun (its own runs only)."""

from __future__ import annotations

import json
import logging
import pickle
from pathlib import Path

import pytest
from conftest import compose, run_cli
from hydra.types import RunMode
from omegaconf import OmegaConf

from launch.cluster.callbacks import SweepEnd
from src.engine import train
from src.engine.loop.progress import LogProgress, make_progress
from src.engine.task import Task

FAST = [
    "trainer.max_steps=20",
    "trainer.checkpoint_every=10",
    "trainer.val_every=10",
    "trainer.monitor_every=0",
]


def said(caplog, logger: str = "src.run") -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == logger]


def test_start_and_end_lines_say_what_trains_what_it_reached_and_where(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    cfg = compose([*FAST, "attn=spectral", "attn.mode=svd"], tmp_path)
    summary = train(cfg, tmp_path / "run")
    start, end = said(caplog)
    assert start.startswith(
        "train digits · vit_digits · spectral(mode=svd, lam=10.0, targets=q, detach=True)"
    )
    assert " · seed 0 · fresh · " in start and start.endswith(str(tmp_path / "run"))
    metric, best = summary["metric"], summary["best"]
    assert f"{metric} {summary['final'][metric]:.4f} (best {best[metric]:.4f} at step {best['step']})" in end
    assert f"{summary['steps']} steps" in end
    assert end.endswith(
        f"{tmp_path / 'run'}: summary.json, eval-test.json, checkpoints/best.pt"
    )  # what it made


def test_a_resumed_run_names_its_step_and_a_complete_one_says_how_to_start_over(
    tmp_path, caplog, monkeypatch
):
    cfg = compose(FAST, tmp_path)

    def fail_after_the_first_checkpoint(self, model, step, run_dir, final):
        if step == 20:  # validation comes before the checkpoint of its step: the last one is step 10
            raise RuntimeError("killed")

    with monkeypatch.context() as patch:
        patch.setattr(Task, "after_validation", fail_after_the_first_checkpoint)
        with pytest.raises(RuntimeError):
            train(cfg, tmp_path / "run")
    caplog.set_level(logging.INFO)
    train(cfg, tmp_path / "run")
    assert "resumed from step 10 of 20" in said(caplog)[0]

    caplog.clear()
    summary = train(cfg, tmp_path / "run")
    (line,) = said(caplog)
    assert line.startswith("already complete: digits · vit_digits · precond")
    assert f"{summary['steps']} steps" in line and "trainer.resume=restart" in line
    assert not said(caplog, "src.progress")  # no bar, no progress: nothing trained


def test_progress_without_a_terminal_is_a_log_line_per_tenth_of_the_run(caplog, monkeypatch):
    caplog.set_level(logging.INFO)
    monkeypatch.setattr("sys.stdout.isatty", lambda: False, raising=False)
    progress = make_progress("tqdm", total=200, start=40, description="digits")
    assert isinstance(progress, LogProgress)
    for step in range(41, 201):
        progress.update(step, loss=1.0)
    lines = said(caplog, "src.progress")
    steps = [int(line.split("step ")[1].split("/")[0]) for line in lines]
    assert steps == list(range(60, 201, 20))  # every 10% of 200 steps from step 40, and the last
    assert lines[-1].startswith("digits step 200/200 (100%) loss=1 ")


@pytest.mark.minutes(0.5)
def test_a_job_log_and_a_multirun_say_it_all_without_a_terminal(tmp_path):
    out = run_cli(["-m", "attn=standard,precond", "trainer.max_steps=20", "sweep_name=day"], cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    sweep = tmp_path / "outputs" / "multirun" / "day"
    assert f"sweep done: 2 runs (2 completed) in {sweep.relative_to(tmp_path)}" in out.stdout
    assert f"python -m launch.analysis.report {sweep.relative_to(tmp_path)}" in out.stdout.splitlines()[-1]
    for summary_path in sweep.rglob("summary.json"):
        log_lines = (summary_path.parent / "run.log").read_text().splitlines()
        summary = json.loads(summary_path.read_text())
        assert "] - train digits · vit_digits · " in log_lines[0]
        assert any("digits step 20/20 (100%)" in line for line in log_lines)
        took = f"0:{round(summary['wall_s']):02d}"
        folder = summary_path.parent.relative_to(tmp_path)
        assert log_lines[-1].endswith(
            f"· 20 steps in {took} · {folder}: summary.json, eval-test.json, checkpoints/best.pt"
        )
    # a second multirun into the same folder, its job in a submitit process (as on SLURM): its own run
    again = ["-m", "attn=precond", "trainer.max_steps=20", "sweep_name=day", "hydra/launcher=local"]
    out = run_cli(again, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert f"sweep done: 1 run (1 completed) in {sweep.relative_to(tmp_path)}" in out.stdout


# -- the line that ends a multirun counts that multirun's jobs, by their records -------------------


def hydra_config(sweep: Path, run_dir: Path | None = None, num: int | None = None):
    """The part of a job's (or, without ``run_dir``, the multirun's) config the callback reads."""
    hydra = {"mode": RunMode.MULTIRUN, "sweep": {"dir": str(sweep)}}
    if run_dir is not None:
        hydra |= {"runtime": {"output_dir": str(run_dir)}, "job": {"num": num}}
    return OmegaConf.create({"hydra": hydra})


def record(folder: Path, summary: object = None, rows: int = 0, config: bool = True) -> Path:
    """A run folder by hand: its config, ``rows`` rows, and ``summary`` (None: none) as JSON."""
    folder.mkdir(parents=True)
    if config:
        (folder / "config.yaml").write_text("task: {name: digits}\nattn: {variant: standard}\nseed: 0\n")
    (folder / "metrics.jsonl").write_text(
        "".join(f'{{"step": {s}, "split": "val"}}\n' for s in range(1, rows + 1))
    )
    if summary is not None:
        (folder / "summary.json").write_text(json.dumps(summary))
    return folder


def start(sweep: Path) -> tuple[SweepEnd, SweepEnd]:
    """A multirun started: the driver's callback, and the copy its jobs get (pickled, as submitit
    sends it to a SLURM job)."""
    driver = SweepEnd()
    driver.on_multirun_start(hydra_config(sweep))
    return driver, pickle.loads(pickle.dumps(driver))


def jobs(job: SweepEnd, sweep: Path, folders: list[Path]) -> None:
    for num, folder in enumerate(folders):
        job.on_job_start(hydra_config(sweep, folder, num), task_function=None)
        job.on_job_end(hydra_config(sweep, folder, num), job_return=None)


def end_line(driver: SweepEnd, sweep: Path, capsys) -> str:
    driver.on_multirun_end(hydra_config(sweep))
    (line,) = capsys.readouterr().out.splitlines()
    return line


def test_two_multiruns_into_one_folder_each_count_their_own_runs(tmp_path, capsys):
    sweep = tmp_path / "multirun" / "sweep"  # every ad-hoc multirun's folder
    first, first_jobs = start(sweep)
    second, second_jobs = start(sweep)  # started while the first runs: .sweeps/latest names it
    jobs(
        first_jobs,
        sweep,
        [
            record(sweep / "a", {"status": "completed"}, rows=2),
            record(sweep / "b", {"status": "failed", "error": "RuntimeError: x"}, rows=2),
            record(sweep / "c", rows=3),  # killed: rows, no summary
        ],
    )
    line = end_line(first, sweep, capsys)
    assert line.startswith("sweep done: 3 runs (1 completed, 1 failed, 1 incomplete) in ")
    jobs(
        second_jobs,
        sweep,
        [
            record(sweep / "d", {"status": "completed"}, rows=2),
            record(sweep / "e", config=False),  # failed before its record started
            record(sweep / "f", []),  # a summary that is not an object
        ],
    )
    (Path(second.tracking) / "job-9.json").write_text("{")  # a torn note
    line = end_line(second, sweep, capsys)
    expected = "sweep done: 4 runs (1 completed, 1 failed to start, 2 unreadable)"
    assert line == f"{expected} in {sweep}; tables and plots: python -m launch.analysis.report {sweep}"


def test_a_multirun_whose_jobs_cannot_be_tracked_says_so_and_does_not_count(tmp_path, capsys):
    blocked = tmp_path / "sweep"
    blocked.write_text("a file where the sweep folder would be")
    driver, job = start(blocked)
    job.on_job_start(hydra_config(blocked, tmp_path / "run", 0), task_function=None)  # nothing to write into
    line = end_line(driver, blocked, capsys)
    assert line.startswith("sweep done (its runs were not counted: NotADirectoryError: ")
    assert line.endswith(f") in {blocked}; tables and plots: python -m launch.analysis.report {blocked}")


def test_the_end_line_names_the_files_the_run_wrote_and_the_sandbox_page(tmp_path):
    """Only files that exist: last.pt where there is no best.pt, and a modadd run's page."""
    from src.engine.record.announce import end_line

    summary = {"metric": "val/acc", "final": {"val/acc": 0.5}, "steps": 3}
    (tmp_path / "checkpoints").mkdir()
    for name in ("summary.json", "checkpoints/last.pt"):
        (tmp_path / name).write_text("{}")
    assert end_line(summary, tmp_path).endswith(": summary.json, checkpoints/last.pt")
    (tmp_path / "sandbox").mkdir()
    (tmp_path / "sandbox" / "index.html").write_text("<html>")
    (tmp_path / "checkpoints" / "best.pt").write_text("")
    assert end_line(summary, tmp_path).endswith(": summary.json, checkpoints/best.pt, sandbox/index.html")
