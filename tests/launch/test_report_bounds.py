"""The report reads only what it can bound (issue 39, item 4, and item 7's cases in the records'
readers): a FIFO, a device or a link out of a run's folder is one ``unreadable`` row, never a hang
nor a swamped machine; a file over its size is refused with the size in its line; a number
outside what its metric can be is not averaged; two records of one experiment and seed that
disagree are both shown and flagged; a debug run is not an experiment's; a checkpoint whose
fields are of the wrong type is one line or set aside with a note (hand-made folders:
``write_run``)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path

import pytest
import torch
from conftest import main_in_process, report_in_a_bounded_process
from test_report import write_run

from launch.analysis import report
from launch.analysis.records import read_runs
from src.engine.record import files
from src.errors import SuiteError

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def deadline():
    """Fail, instead of hanging, where a read blocks (a FIFO's open waits for a writer for ever):
    SIGALRM's handler raises, which ends the blocked call (PEP 475)."""

    def expired(signum, frame):
        signal.alarm(5)  # and again, should a later read block too
        raise TimeoutError("the report was still reading after 20 s: it hangs")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(20)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def runs_by_folder(root: Path) -> dict[Path, object]:
    return {Path(r.name): r for r in read_runs([root])}


def report_rows(root: Path, out: Path) -> list[dict]:
    assert report.main([str(root), "--out", str(out)]) == 0
    return json.loads((out / "results.json").read_text())


# -- a FIFO, a device, a link out of the folder ------------------------------------------------------


def test_the_report_finishes_within_seconds_next_to_a_fifo_and_dev_zero(tmp_path):
    """`metrics.jsonl` → `/dev/zero` (19 GB RSS, OOM-killed) and `summary.json` a FIFO (hangs for
    ever), beside a good run: the report finishes, the two are unreadable rows naming what they are,
    the good run is counted."""
    runs = tmp_path / "runs"
    good = write_run(runs, "standard", 0, [0.8] * 10)
    zero = write_run(runs, "standard", 1, [0.8] * 10)
    (zero / "metrics.jsonl").unlink()
    (zero / "metrics.jsonl").symlink_to("/dev/zero")
    fifo = write_run(runs, "standard", 2, [0.8] * 10)
    (fifo / "summary.json").unlink()
    os.mkfifo(fifo / "summary.json")
    started = time.monotonic()
    result = report_in_a_bounded_process(runs, tmp_path / "out")
    took = time.monotonic() - started
    assert result.returncode == 0, result.stderr[-2000:]
    assert took < 60, f"the report took {took:.0f} s"  # its imports are most of it
    rows = {r["run_dir"]: r for r in json.loads((tmp_path / "out" / "results.json").read_text())}
    assert rows[str(good)]["status"] == "completed"
    assert rows[str(zero)]["status"] == rows[str(fifo)]["status"] == "unreadable"
    assert "metrics.jsonl links out of its folder (to /dev/zero)" in rows[str(zero)]["error"]
    assert "is a FIFO (named pipe), not a regular file" in rows[str(fifo)]["error"]
    (group,) = [r for r in rows.values() if r["kind"] == "group"]
    assert group["n"] == 1


RECORD_FILES = [
    "config.yaml",
    ".hydra/config.yaml",
    ".hydra/hydra.yaml",
    "identity.json",
    "metrics.jsonl",
    "summary.json",
]


@pytest.mark.parametrize("name", RECORD_FILES)
def test_any_record_file_that_is_a_fifo_is_one_unreadable_row(tmp_path, deadline, name):
    """`summary.json` a FIFO (hangs forever), and every other file of a run folder the report reads:
    one unreadable row saying what the file is, never a hang."""
    folder = write_run(tmp_path, "standard", 0, [0.8] * 10)
    path = folder / name
    path.parent.mkdir(exist_ok=True)
    path.unlink(missing_ok=True)
    os.mkfifo(path)
    (run,) = read_runs([tmp_path])
    assert run.status == "unreadable" and run.final == {}
    assert run.error == (
        f"{path} is a FIFO (named pipe), not a regular file: a record holds regular files only, and this "
        "one is not read; move it aside"
    )


def test_a_fifo_as_failures_jsonl_or_an_evaluation_never_hangs_the_report(tmp_path, deadline):
    """The files read for a run that failed to start (`failures.jsonl`) and its evaluations
    (`eval-test.json`): a FIFO makes the run unreadable, or its evaluation left out with a warning."""
    started = write_run(tmp_path, "standard", 0, None, status="incomplete")
    (started / "metrics.jsonl").write_text("")
    os.mkfifo(started / "failures.jsonl")
    tested = write_run(tmp_path, "standard", 1, [0.5] * 10, test=0.7)
    (tested / "eval-test.json").unlink()
    os.mkfifo(tested / "eval-test.json")
    with pytest.warns(UserWarning, match=r"eval-test.json is left out \(.* is a FIFO"):
        runs = runs_by_folder(tmp_path)
    assert runs[started].status == "unreadable" and "failures.jsonl is a FIFO" in runs[started].error
    assert (runs[tested].status, runs[tested].reported.split) == ("completed", "val")


def test_a_settle_state_that_is_a_fifo_is_one_line(tmp_path, capsys, deadline):
    """The report reads a settled sweep's `settle.json` too: a FIFO is one `error:` line, exit 2."""
    write_run(tmp_path, "standard", 0, [0.8] * 10)
    os.mkfifo(tmp_path / "settle.json")
    assert report.main([str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"error: {tmp_path / 'settle.json'} is a FIFO (named pipe)")
    assert not (tmp_path / "out").exists()


def test_a_link_out_of_the_run_folder_is_not_read(tmp_path):
    """Links out of the tree: a summary linked to another folder's file (here a good summary with a
    better number) is refused, not read as this run's."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    folder = write_run(tmp_path / "runs", "standard", 0, [0.8] * 10)
    summary = json.loads((folder / "summary.json").read_text())
    (elsewhere / "summary.json").write_text(json.dumps({**summary, "final": {"val/acc": 0.99}}))
    (folder / "summary.json").unlink()
    (folder / "summary.json").symlink_to(elsewhere / "summary.json")
    (run,) = read_runs([tmp_path / "runs"])
    assert run.status == "unreadable" and run.reported is None
    assert run.error == (
        f"{folder / 'summary.json'} links out of its folder (to {elsewhere / 'summary.json'}): a record's "
        "files are its own; not read"
    )


# -- sizes: a cap per file, stated in the error; streamed rows ----------------------------------------


@pytest.mark.parametrize(("name", "size"), [("metrics.jsonl", 129 * 2**20), ("summary.json", 17 * 2**20)])
def test_a_file_over_its_size_is_refused_and_the_error_says_the_cap(tmp_path, name, size):
    """A size cap per file, stated in the error (a sparse file: nothing written to the disk)."""
    folder = write_run(tmp_path, "standard", 0, [0.8] * 10)
    with open(folder / name, "r+b") as f:
        f.truncate(size)
    (run,) = read_runs([tmp_path])
    from src.engine.record.bounded import LIMITS

    cap = f"{LIMITS[name] / 2**20:.1f} MB"
    assert run.status == "unreadable"
    assert run.error == (
        f"{folder / name} holds {size / 2**20:.1f} MB, more than the {cap} a {name} may hold to be read "
        "(src/engine/record/bounded.py): not a file the suite wrote; move it aside"
    )


def test_the_rows_are_streamed_and_counted_against_their_cap(tmp_path, monkeypatch):
    """Streaming reads: metrics.jsonl is read line by line, and its rows are capped (here at 12:
    the run logs 13)."""
    folder = write_run(tmp_path, "standard", 0, [0.8] * 10)
    assert len(files.read_metrics(folder, bounded=True)) == 13
    monkeypatch.setattr(files, "ROW_LIMIT", 12)
    (run,) = read_runs([tmp_path])
    assert run.status == "unreadable" and "holds more than 12 rows" in run.error
    assert len(files.read_metrics(folder)) == 13  # the trainer's own reads are not capped in rows


# -- ranges of the metrics the report averages ----------------------------------------------------


@pytest.mark.parametrize("value", [-5.0, 85.0, 1.5])
def test_an_accuracy_outside_0_1_in_a_summary_is_not_averaged(tmp_path, value):
    """An accuracy of -5.0 in a summary is averaged in: now its run is unreadable, and the
    experiment's mean is over the other seeds alone."""
    write_run(tmp_path, "standard", 0, [0.8] * 10)
    bad = write_run(tmp_path, "standard", 1, [0.8] * 9 + [value])
    rows = report_rows(tmp_path, tmp_path / "out")
    (group,) = [r for r in rows if r["kind"] == "group"]
    assert (group["n"], group["mean"]) == (1, pytest.approx(0.8))
    (row,) = [r for r in rows if r["run_dir"] == str(bad)]
    assert row["status"] == "unreadable" and row["final"] is None
    assert f"final.val/acc is {value!r}, outside [0, 1], what it can be" in row["error"]
    assert ("a percentage?" in row["error"]) == (value > 1)


def test_out_of_range_rows_and_test_numbers_are_not_used(tmp_path):
    """The same check on the curve (a row's val/acc of 3.0) and on a test number (test/acc 7.0 in
    eval-test.json: left out with a warning, the validation number used)."""
    curve = write_run(tmp_path, "standard", 0, [0.8] * 10)
    lines = (curve / "metrics.jsonl").read_text().splitlines()
    row = json.loads(lines[2])
    lines[2] = json.dumps({**row, "val/acc": 3.0})
    (curve / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    tested = write_run(tmp_path, "standard", 1, [0.8] * 10, test=7.0)
    with pytest.warns(UserWarning, match=r"its test/acc is 7\.0, outside \[0, 1\]"):
        runs = runs_by_folder(tmp_path)
    assert runs[curve].status == "unreadable"
    assert "metrics.jsonl: row 3 (step 300) has val/acc is 3.0, outside [0, 1]" in runs[curve].error
    assert (runs[tested].reported.split, runs[tested].reported.value) == ("val", 0.8)


def test_a_loss_below_zero_and_a_correlation_beyond_one_are_unreadable(tmp_path):
    """The ranges by metric: a loss is at least 0, a correlation within [-1, 1]."""
    loss = write_run(tmp_path, "standard", 0, [0.8] * 10)
    summary = json.loads((loss / "summary.json").read_text())
    (loss / "summary.json").write_text(json.dumps({**summary, "final": {"val/acc": 0.8, "val/loss": -1.0}}))
    corr = write_run(tmp_path, "standard", 1, [0.8] * 10)
    (corr / "summary.json").write_text(json.dumps({**summary, "final": {"val/acc": 0.8, "val/pearson": 1.2}}))
    runs = runs_by_folder(tmp_path)
    assert "final.val/loss is -1.0, outside at least 0" in runs[loss].error
    assert "final.val/pearson is 1.2, outside [-1, 1]" in runs[corr].error


# -- records of one identity and seed that disagree ------------------------------------------------


def test_two_records_of_one_identity_and_seed_that_disagree_are_both_shown_and_flagged(tmp_path):
    """Two records of one identity and seed with different numbers: one was dropped as a "repeat"
    without a word, chosen by folder name. Now both are shown with their numbers, flagged, and
    neither is counted; a third seed is."""
    write_run(tmp_path, "standard", 1, [0.7] * 10)
    first = write_run(tmp_path, "standard", 0, [0.8] * 10, folder=tmp_path / "a" / "seed=0")
    second = write_run(tmp_path, "standard", 0, [0.9] * 10, folder=tmp_path / "b" / "seed=0")
    rows = report_rows(tmp_path, tmp_path / "out")
    (group,) = [r for r in rows if r["kind"] == "group"]
    assert (group["seeds"], group["mean"]) == ([1], pytest.approx(0.7))
    by_dir = {r["run_dir"]: r for r in rows if r["kind"] == "run"}
    assert (by_dir[str(first)]["status"], by_dir[str(first)]["final"]) == ("disagrees", 0.8)
    assert (by_dir[str(second)]["status"], by_dir[str(second)]["final"]) == ("disagrees", 0.9)
    assert (
        by_dir[str(first)]["error"]
        == f"the same experiment and seed as {second}, other numbers: val/acc 0.8 vs 0.9"
    )
    text = (tmp_path / "out" / "report.md").read_text()
    assert "## Records that disagree (2)" in text and "repeats" not in text
    assert f"| {first} | imagenet | vit_base | standard | 0 | val/acc | 0.8 |" in text
    assert f"| {second} | imagenet | vit_base | standard | 0 | val/acc | 0.9 |" in text


def test_two_records_that_agree_are_counted_once_and_the_tested_one_kept(tmp_path):
    """Records of one identity and seed with the same numbers are the same run twice: counted once
    (the one with a test number kept, whatever the folders' names), said so."""
    write_run(tmp_path, "standard", 0, [0.8] * 10, folder=tmp_path / "a" / "seed=0")
    tested = write_run(tmp_path, "standard", 0, [0.8] * 10, folder=tmp_path / "b" / "seed=0", test=0.75)
    rows = report_rows(tmp_path, tmp_path / "out")
    (group,) = [r for r in rows if r["kind"] == "group"]
    assert (group["n"], group["split"], group["mean"]) == (1, "test", pytest.approx(0.75))
    text = (tmp_path / "out" / "report.md").read_text()
    assert f"repeats {tested} (seed 0)" in text


# -- a debug run under an output folder -----------------------------------------------------------


def make_debug(folder: Path, how: str) -> None:
    """What ``python -m src.run debug=fdr`` leaves in ``.hydra/``: its choice and its override."""
    (folder / ".hydra").mkdir()
    if how == "hydra.yaml":
        hydra = {
            "hydra": {"runtime": {"choices": {"debug": "fdr", "task": "imagenet"}}, "run": {"dir": "${x}"}}
        }
        (folder / ".hydra" / "hydra.yaml").write_text(json.dumps(hydra))
    (folder / ".hydra" / "overrides.yaml").write_text("- debug=fdr\n- task=imagenet\n")


@pytest.mark.parametrize("how", ["hydra.yaml", "overrides.yaml"])
def test_a_debug_run_under_an_output_folder_is_not_a_completed_experiment(tmp_path, how):
    """A `debug=fdr` run under an output folder is reported as a completed experiment: now it is
    shown as a debug run, not counted (no group, no cell)."""
    folder = write_run(tmp_path, "standard", 0, [0.8] * 10)
    make_debug(folder, how)
    rows = report_rows(tmp_path, tmp_path / "out")
    assert [r["kind"] for r in rows] == ["run"]
    assert (rows[0]["status"], rows[0]["final"]) == ("debug", None)
    text = (tmp_path / "out" / "report.md").read_text()
    assert "## Debug runs (1): not counted" in text and "(debug=fdr)" in text
    assert "| imagenet | vit_base | standard |" not in text.split("## Steps")[0]  # no row in the table
    assert "## Claims" not in text and not list((tmp_path / "out").glob("*.png"))  # nor claims, nor plots


# -- checkpoint fields of the wrong type (item 7) ----------------------------------------------------


SHORT = ["trainer.max_steps=4", "trainer.val_every=2", "trainer.checkpoint_every=2", "trainer.log_every=1"]
QUICK = ["trainer.monitor_every=0", "trainer.threads=1"]


def trained(root: Path) -> dict:
    """A 4-step run of the default task in ``root / "run"`` (checkpoints at steps 2 and 4; ~2 s), no
    test at its end: the eval-*.json files these tests look for are python -m src.eval's."""
    from conftest import compose

    from src.engine import train

    return train(compose([*SHORT, *QUICK, "trainer.test_after=null"], root), root / "run")


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("trained")
    trained(root)
    return root / "run"


def copied(run_dir: Path, tmp_path: Path) -> Path:
    target = tmp_path / "run"
    shutil.copytree(run_dir, target)
    return target


def rewritten(path: Path, target: Path, change) -> Path:
    state = torch.load(path, weights_only=True)
    change(state)
    target.parent.mkdir(parents=True, exist_ok=True)
    torch.save(state, target)
    return target


def eval_cli(capsys, *args) -> tuple[int, str, str]:
    """``python -m src.eval <args>`` in this process: (exit status, stdout, stderr)."""
    from src.eval import main

    return main_in_process(main, capsys, *args)


def test_a_checkpoint_whose_record_is_a_string_is_one_line(trained_run, tmp_path, capsys):
    """A `.pt` whose `record` is a string (AttributeError): one `error:` line, exit 2, nothing
    written."""
    copy = rewritten(
        trained_run / "checkpoints" / "best.pt",
        tmp_path / "sent" / "best.pt",
        lambda s: s.update(record="abc"),
    )
    code, out, err = eval_cli(capsys, copy)
    assert (code, out) == (2, "")
    assert err == (
        f"error: {copy} is not a checkpoint of this suite (its 'record' is a str, not the record's meta "
        "(an object))\n"
    )
    assert list(copy.parent.iterdir()) == [copy]


def test_a_checkpoint_whose_step_is_a_word_is_one_line_and_never_written_into_a_result(
    trained_run, tmp_path, capsys
):
    """A `.pt` whose `step` is `"abc"` (written into the result): one `error:` line, exit 2, no
    result."""
    run_dir = copied(trained_run, tmp_path)
    copy = rewritten(
        run_dir / "checkpoints" / "best.pt", tmp_path / "kept" / "best.pt", lambda s: s.update(step="abc")
    )
    code, out, err = eval_cli(capsys, copy, f"run={run_dir}")
    assert (code, out) == (2, "")
    assert err == f"error: {copy} is not a checkpoint of this suite (its step is 'abc', not a step)\n"
    assert list(copy.parent.iterdir()) == [copy] and not list(run_dir.glob("eval-*.json"))


def test_a_best_checkpoint_whose_step_is_a_word_is_set_aside_with_a_note(trained_run, tmp_path, capsys):
    """The same file as the run's own best.pt: set aside (best.pt.corrupt) with a note, and last.pt
    evaluated, its step an integer in the result."""
    run_dir = copied(trained_run, tmp_path)
    best = run_dir / "checkpoints" / "best.pt"
    rewritten(best, best, lambda s: s.update(step="abc"))
    code, _, err = eval_cli(capsys, run_dir)
    assert code == 0, err
    assert "its step is 'abc', not a step" in err and "moved to best.pt.corrupt" in err
    result = json.loads((run_dir / "eval-val.json").read_text())
    assert (result["checkpoint"], result["checkpoint_step"]) == ("last", 4)
    assert (run_dir / "checkpoints" / "best.pt.corrupt").exists()


def test_a_last_checkpoint_whose_record_is_a_string_is_set_aside_and_the_run_resumes(trained_run, tmp_path):
    """A `.pt` whose `record` is a string, as the run's last.pt (an AttributeError on resume):
    set aside (last.pt.corrupt) with a note, the run resumed from previous.pt to its end."""
    run_dir = copied(trained_run, tmp_path)
    last = run_dir / "checkpoints" / "last.pt"
    rewritten(last, last, lambda s: s.update(record="abc"))
    (run_dir / "summary.json").unlink()  # killed after its last checkpoint, before its summary
    with pytest.warns(
        UserWarning, match=r"its 'record' is a str.*moved to last.pt.corrupt.*previous.pt \(step 2\)"
    ):
        summary = trained(tmp_path)
    assert summary["status"] == "completed" and summary["steps"] == 4
    assert (run_dir / "checkpoints" / "last.pt.corrupt").exists()


def test_settle_counts_no_debug_run_as_a_seed_of_its_experiment(tmp_path):
    """A `debug=fdr` run under a sweep folder is no seed of an experiment for settle either: it
    never joins a group whose verdict it would enter."""
    from launch.analysis.records import read_runs
    from launch.analysis.settle import group

    write_run(tmp_path, "standard", 1, [0.8] * 10)
    make_debug(write_run(tmp_path, "standard", 0, [0.8] * 10), "overrides.yaml")
    runs = read_runs([tmp_path])
    assert sorted(r.status for r in runs) == ["completed", "debug"]
    assert [r.seed for members in group(runs).values() for r in members] == [1]


def test_settle_reads_a_settle_json_that_is_a_fifo_as_one_line(tmp_path, deadline):
    """settle itself on a received folder whose `settle.json` is a FIFO: the state is refused in one
    line (it would wait for a writer for ever), never read."""
    from launch.analysis.settle import load_state

    os.mkfifo(tmp_path / "settle.json")
    with pytest.raises(SuiteError, match=r"settle\.json is a FIFO \(named pipe\).*move it aside"):
        load_state(tmp_path)


def test_src_eval_refuses_a_giant_config_yaml_before_parsing_it(trained_run, tmp_path, capsys, deadline):
    """`python -m src.eval RUN` on a received run whose `config.yaml` is over the config cap (a
    sparse file): one `error:` line naming the cap, exit 2, nothing written; before, the whole file
    was read into memory and parsed (a giant one would fill it)."""
    from src.engine.record.bounded import limit_of

    run = copied(trained_run, tmp_path)
    before = sorted(p.name for p in run.iterdir())
    with open(run / "config.yaml", "r+b") as f:
        f.truncate(limit_of(run / "config.yaml") + 1)
    code, out, err = eval_cli(capsys, run)
    assert (code, out) == (2, "")
    assert err.startswith(f"error: {run / 'config.yaml'} holds 4.0 MB, more than the 4.0 MB")
    assert len(err.splitlines()) == 1 and "not a file the suite wrote" in err
    assert sorted(p.name for p in run.iterdir()) == before
