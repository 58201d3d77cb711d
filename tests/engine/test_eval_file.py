"""``python -m src.eval <file.pt>``: one checkpoint file evaluated, inside its run folder (that run's
config, its identity checked) or copied elsewhere (the config it carries, checked as a record's is,
or the run folder ``run=`` names); what it cannot rebuild safely is refused in one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import compose
from test_eval import eval_cli
from test_eval_checks import payload_node

from src.engine import train
from src.engine.record import checkpoint
from src.engine.record.identity import Identity

SHORT = ["trainer.max_steps=4", "trainer.val_every=2", "trainer.checkpoint_every=2", "trainer.log_every=1"]
QUICK = ["trainer.monitor_every=0", "trainer.threads=1", "trainer.eval_batches=2"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("evalfile")
    train(compose([*SHORT, *QUICK], root), root / "run")
    return root / "run"


def evaluated(capsys, *args) -> dict:
    code, out, err = eval_cli(capsys, *args)
    assert code == 0, err
    return json.loads(Path(out.rsplit(" -> ", 1)[1].strip()).read_text())


@pytest.mark.parametrize("which", ["last", "best"])
def test_a_file_in_its_run_folder_gives_what_checkpoint_gives(run_dir, capsys, which):
    by_name = evaluated(capsys, run_dir, f"checkpoint={which}")
    by_file = evaluated(capsys, run_dir / "checkpoints" / f"{which}.pt")
    assert (
        by_file["metrics"] == by_name["metrics"] and by_file["checkpoint_step"] == by_name["checkpoint_step"]
    )
    assert by_file["identity"] == by_name["identity"] == by_file["record_identity"]
    assert (run_dir / "eval-val.json").is_file()


def test_a_copied_file_is_evaluated_from_the_config_it_carries_and_its_result_goes_beside_it(
    run_dir, tmp_path, capsys
):
    copy = tmp_path / "elsewhere" / "last.pt"
    copy.parent.mkdir()
    shutil.copy(run_dir / "checkpoints" / "last.pt", copy)
    ran = evaluated(capsys, run_dir, "checkpoint=last")
    result = evaluated(capsys, copy)
    assert result["metrics"] == ran["metrics"] and result["record_identity"] == ran["record_identity"]
    assert (tmp_path / "elsewhere" / "last.eval-val.json").is_file()


def rewrite(source: Path, target: Path, change) -> Path:
    state = checkpoint.load(source)
    change(state["record"])
    target.parent.mkdir(parents=True, exist_ok=True)
    torch.save(state, target)
    return target


def test_a_planted_target_in_the_carried_config_runs_nothing(run_dir, tmp_path, capsys):
    sentinel = tmp_path / "pwned"

    def plant(record: dict) -> None:
        record["config"]["task"]["val_fraction"] = payload_node(sentinel)
        record["identity"] = Identity.of(record["config"]).hash  # a crafted file, with a right hash

    copy = rewrite(run_dir / "checkpoints" / "last.pt", tmp_path / "sent" / "last.pt", plant)
    code, out, err = eval_cli(capsys, copy)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "names _target_ 'torch.load'" in err and "refused" in err
    assert not sentinel.exists() and list(copy.parent.iterdir()) == [copy]


def test_a_copy_that_carries_no_config_needs_its_run_folder(run_dir, tmp_path, capsys):
    copy = rewrite(
        run_dir / "checkpoints" / "best.pt", tmp_path / "old" / "best.pt", lambda r: r.pop("config")
    )
    code, out, err = eval_cli(capsys, copy)
    assert code == 2 and err.count("\n") == 1 and "carries no config" in err and "run=<run_dir>" in err
    result = evaluated(capsys, copy, f"run={run_dir}")
    assert result["metrics"] == evaluated(capsys, run_dir, "checkpoint=best")["metrics"]
    assert (tmp_path / "old" / "best.eval-val.json").is_file()


def test_an_edited_carried_config_is_refused(run_dir, tmp_path, capsys):
    def edit(record: dict) -> None:
        record["config"]["optim"]["lr"] = 1.0  # the identity's hash no longer names it

    copy = rewrite(run_dir / "checkpoints" / "last.pt", tmp_path / "edited" / "last.pt", edit)
    code, _, err = eval_cli(capsys, copy)
    assert code == 2 and err.count("\n") == 1 and "was edited; refused" in err


@pytest.mark.parametrize(
    "make, said",
    [
        (lambda d: d / "missing.pt", "no checkpoint file"),
        (
            lambda d: (d / "other.pt", torch.save({"state_dict": {}}, d / "other.pt"))[0],
            "not a checkpoint of",
        ),
    ],
)
def test_a_missing_or_foreign_file_is_one_line(tmp_path, capsys, make, said):
    code, out, err = eval_cli(capsys, make(tmp_path))
    assert code == 2 and out == "" and err.count("\n") == 1 and err.startswith("error: ") and said in err


def test_checkpoint_with_a_file_and_run_with_a_folder_are_one_line(run_dir, capsys):
    code, _, err = eval_cli(capsys, run_dir / "checkpoints" / "last.pt", "checkpoint=best")
    assert code == 2 and "already one file" in err
    code, _, err = eval_cli(capsys, run_dir, f"run={run_dir}")
    assert code == 2 and "is a folder" in err
