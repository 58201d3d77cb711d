"""Run folders: none holds another (a restart moves only its own record), the layout before that
is adopted, a process refused a folder leaves Hydra's copy of the command as it was, and a failure
that a later session trained past is no longer what the record says.

The runs are the digits default, a few steps, in this process (``train`` with the folder the
entry point would give it); the entry point's ``cli()`` writes and refuses in this process, and
one refused command is a real process.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import QUIET, compose, main_in_process, make_image_folder, run_cli, src_run_here
from test_record_integrity import killed

from launch.analysis.records import read_run, read_runs
from src.engine import train
from src.errors import DataError
from src.resolvers import named_before

SHORT = [
    "trainer.max_steps=6",
    "trainer.checkpoint_every=3",
    "trainer.val_every=3",
    "trainer.log_every=5",
    "trainer.monitor_every=0",
]
VARIANT = Path("runs/digits/vit_digits/precond")


def trained(tmp_path: Path, folder: Path, *extra: str) -> dict:
    return train(compose([*SHORT, *extra], tmp_path), folder)


def record_files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_restart_moves_its_own_record_never_another_runs(tmp_path):
    """``seed=0`` (no overrides) beside ``seed=0,trainer.val_every=2``; and, in the layout before
    overrides joined the seed's name, a completed run nested inside ``seed=0/``: a restart of
    ``seed=0`` moves neither."""
    plain = tmp_path / VARIANT / "seed=0"
    sibling, nested = plain.with_name("seed=0,trainer.val_every=2"), plain / "trainer.val_every=2"
    trained(tmp_path, plain)
    trained(tmp_path, sibling, "trainer.val_every=2")
    trained(tmp_path, nested, "trainer.val_every=2")
    kept = {folder: record_files(folder) for folder in (sibling, nested)}
    summary = trained(tmp_path, plain, "trainer.resume=restart")
    assert summary["status"] == "completed"
    assert {folder: record_files(folder) for folder in kept} == kept  # byte for byte, where it was
    moved = sorted(p.name for p in (plain / "superseded" / "1").iterdir())
    assert moved == [
        "checkpoints",
        "config.yaml",
        "eval-test.json",
        "identity.json",
        "metrics.jsonl",
        "summary.json",
    ]


def test_the_same_command_adopts_its_record_from_the_nested_layout_and_resumes(tmp_path):
    """A run killed at step 4 in ``seed=0/trainer.val_every=2`` (the layout before): the same
    command, whose folder is now ``seed=0,trainer.val_every=2``, moves that record over and
    resumes it from its checkpoint instead of starting over."""
    old = tmp_path / VARIANT / "seed=0" / "trainer.val_every=2"
    killed(tmp_path, old.relative_to(tmp_path), 5, *SHORT, "trainer.val_every=2")
    rows_before = (old / "metrics.jsonl").read_text().splitlines()
    new = old.parent.with_name("seed=0,trainer.val_every=2")
    summary = trained(tmp_path, new, "trainer.val_every=2")
    assert summary["status"] == "completed" and summary["steps"] == 6
    assert [s["from_step"] for s in summary["sessions"]] == [0, 3]  # resumed at its step-3 checkpoint
    assert not old.exists() and not old.parent.exists()  # emptied, then removed
    assert (new / "metrics.jsonl").read_text().splitlines()[: len(rows_before) - 1] == rows_before[:-1]


def test_the_same_command_adopts_its_record_from_a_name_that_held_options_now_out_of_it(tmp_path):
    """A run killed at step 4 when ``trainer.checkpoint_every`` and ``trainer.progress`` were still
    in the folder's name (``seed=0,trainer.checkpoint_every=3,trainer.progress=false,
    trainer.val_every=2``): the same command, whose folder is now ``seed=0,trainer.val_every=2``,
    moves that record over and resumes it. A sibling of another configuration (``optim.lr``) and
    one whose recorded identity differs are left where they are."""
    args = [*SHORT, "trainer.val_every=2", "trainer.progress=false"]
    new = tmp_path / VARIANT / "seed=0,trainer.val_every=2"
    old = new.with_name("seed=0,trainer.checkpoint_every=3,trainer.progress=false,trainer.val_every=2")
    other = new.with_name("seed=0,optim.lr=0.5,trainer.progress=false,trainer.val_every=2")
    stale = new.with_name("seed=0,trainer.progress=false,trainer.val_every=2")
    killed(tmp_path, old.relative_to(tmp_path), 5, *args)
    trained(tmp_path, other, *args, "optim.lr=0.5")
    trained(tmp_path, stale, *args, "trainer.max_steps=4")  # its identity is not this run's
    untouched = {folder: record_files(folder) for folder in (other, stale)}
    rows_before = (old / "metrics.jsonl").read_text().splitlines()
    summary = trained(tmp_path, new, *args)
    assert summary["status"] == "completed" and summary["steps"] == 6
    assert [s["from_step"] for s in summary["sessions"]] == [0, 3]  # resumed at its step-3 checkpoint
    assert not (old / "metrics.jsonl").exists()
    assert (new / "metrics.jsonl").read_text().splitlines()[: len(rows_before) - 1] == rows_before[:-1]
    assert {folder: record_files(folder) for folder in untouched} == untouched


def test_earlier_names_are_read_item_by_item_values_with_commas_included(tmp_path):
    """named_before splits a name at each ``,key=`` (a list value keeps its commas) and drops only
    the keys now out of the name: the seed must match and every other item stay."""
    variant = tmp_path / "v"
    names = [
        "seed=0,optim.betas=[0.9,0.95],trainer.threads=1",  # yes: threads is out of the name now
        "seed=0,logger.project=x,optim.betas=[0.9,0.95]",  # yes
        "seed=0,optim.betas=[0.9,0.95]",  # the run itself
        "seed=0,optim.betas=[0.9,0.99],trainer.threads=1",  # another value
        "seed=1,optim.betas=[0.9,0.95],trainer.threads=1",  # another seed
        "seed=0,optim.betas=[0.9,0.95],optim.lr=1,trainer.threads=1",  # another option
    ]
    for name in names:
        (variant / name).mkdir(parents=True)
    found = named_before(variant / "seed=0,optim.betas=[0.9,0.95]")
    assert sorted(f.name for f in found) == sorted(names[:2])


def test_two_records_under_earlier_names_are_both_left_and_named(tmp_path, caplog):
    new = tmp_path / VARIANT / "seed=0,trainer.val_every=2"
    earlier = [new.with_name(f"seed=0,trainer.progress={v},trainer.val_every=2") for v in ("false", "true")]
    for folder in earlier:
        trained(tmp_path, folder, "trainer.val_every=2")
    kept = {folder: record_files(folder) for folder in earlier}
    summary = trained(tmp_path, new, "trainer.val_every=2")
    assert summary["sessions"][0]["from_step"] == 0  # trained afresh: neither was moved
    assert {folder: record_files(folder) for folder in kept} == kept
    assert "2 records of this run under earlier names" in caplog.text


def test_a_refused_process_leaves_hydras_copy_of_the_command_as_it_was(tmp_path, capsys):
    """The entry point writes ``.hydra/`` once it holds the folder and trains there; a second
    command refused the same folder (``trainer.resume=never``, or a record of another
    configuration) writes nothing into it."""
    args = ["trainer.max_steps=2", "trainer.val_every=2"]
    with src_run_here([*args, *QUIET], tmp_path) as cli:  # the entry point's cli(), in this process
        cli()
    (hydra,) = tmp_path.glob("outputs/runs/**/.hydra")
    written = record_files(hydra)
    assert set(written) == {"config.yaml", "hydra.yaml", "overrides.yaml"}
    assert "trainer.max_steps=2" in written["overrides.yaml"].decode()
    result = run_cli([*args, "trainer.resume=never"], cwd=tmp_path)  # a real process refused
    assert result.returncode == 2, result.stderr
    assert record_files(hydra) == written
    another = [*args, "optim.lr=0.5", f"hydra.run.dir={hydra.parent}", *QUIET]
    with src_run_here(another, tmp_path) as cli:  # the same refusal path, in this process
        code, _, stderr = main_in_process(lambda _: cli(), capsys)
    assert code == 2, stderr
    assert record_files(hydra) == written


def test_a_run_that_trains_after_a_failure_no_longer_says_failed(tmp_path):
    """A missing data folder refuses the first session before its first step (it leaves no record:
    no summary, nothing a report lists); the data is put there and a second session trains 4 steps
    and is killed: the record says incomplete (rows, no summary)."""
    folder = tmp_path / "run"
    args = ["task=imagenet", "backbone=vit_micro", "task.img_size=32", "task.batch_size=4"]
    args += ["task.eval_batch_size=4", "task.num_classes=3", "trainer.num_workers=0", "task.repeated_aug=0"]
    args += [f"paths.data_dir={tmp_path / 'data'}"]
    with pytest.raises(DataError, match="missing data folder"):
        trained(tmp_path, folder, *args)
    assert not (folder / "summary.json").exists() and not read_runs([tmp_path])
    make_image_folder(tmp_path / "data")
    killed(tmp_path, Path("run"), 5, *SHORT, *args)
    assert not (folder / "summary.json").exists()
    run = read_run(folder)
    assert run.status == "incomplete" and "last logged step 3" in run.error  # its validation at step 3
    assert not (folder / "failures.jsonl").exists()  # the refusal was the command's, not a run's
