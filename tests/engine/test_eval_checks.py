"""What ``python -m src.eval`` checks before it believes a run folder: the config builds only the
suite's own classes, it is the configuration the record ran, its data folder is the record's, the
overrides are recorded, the checkpoint is the record's own, and an unreadable one is set aside."""

from __future__ import annotations

import base64
import hashlib
import json
import pickle
import shutil
from pathlib import Path

import pytest
import yaml
from conftest import compose
from smoke.lra import SMALL_LISTOPS, TINY
from test_eval import eval_cli

from launch.analysis import report
from src.engine import train
from src.engine.record import checkpoint
from src.engine.record.identity import Identity, IdentityMismatch
from src.engine.record.safe_config import UntrustedConfig, check_buildable

QUICK = ["trainer.log_every=1", "trainer.monitor_every=0", "trainer.threads=1"]
LISTOPS = ["task=lra_listops_small", *TINY, *SMALL_LISTOPS]
SHORT = ["trainer.max_steps=4", "trainer.val_every=2", "trainer.checkpoint_every=2"]


def trained(tmp_path: Path, name: str, *overrides: str) -> tuple[dict, Path]:
    cfg = compose([*QUICK, *SHORT, *overrides], tmp_path)
    return train(cfg, tmp_path / name), tmp_path / name


class Payload:
    """A pickle that, once loaded, creates ``sentinel``: what an attacker's ``torch.load`` runs."""

    def __init__(self, sentinel: Path) -> None:
        self.sentinel = sentinel

    def __reduce__(self):
        return (Path.touch, (self.sentinel,))


def payload_node(sentinel: Path) -> dict:
    """finding 1's payload: ``torch.load(weights_only=False)`` of base64-decoded bytes."""
    data = base64.b64encode(pickle.dumps(Payload(sentinel))).decode()
    inner = {"_target_": "io.BytesIO", "initial_bytes": {"_target_": "base64.b64decode", "s": data}}
    return {"_target_": "torch.load", "weights_only": False, "f": inner}


def plant(run_dir: Path, key: tuple[str, ...], node: object) -> None:
    """Put ``node`` at ``key`` in the run's config.yaml and identity.json alike (with a new, right
    hash), as someone who sends a crafted folder would."""
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    meta = json.loads((run_dir / "identity.json").read_text())
    for tree in (config, meta["config"]):
        parent = tree
        for part in key[:-1]:
            parent = parent.setdefault(part, {})
        parent[key[-1]] = node
    meta["hash"] = Identity(meta["config"]).hash
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    (run_dir / "identity.json").write_text(json.dumps(meta))


def test_a_planted_target_runs_nothing_in_eval_the_report_or_a_resume(tmp_path, capsys):
    """finding 1's payload planted in a finished run's record: eval refuses it in one line, the
    report lists the run as unreadable with that line, and the same command refuses to resume
    another configuration; the payload never runs."""
    cfg = compose([*QUICK, *SHORT], tmp_path)
    train(cfg, tmp_path / "run")
    run_dir, sentinel = tmp_path / "run", tmp_path / "pwned"
    plant(run_dir, ("task", "val_fraction"), payload_node(sentinel))
    code, out, err = eval_cli(capsys, run_dir)
    assert code == 2 and err.count("\n") == 1 and out == ""
    assert "names _target_ 'torch.load' at task.val_fraction._target_" in err and "refused" in err
    assert not (run_dir / "eval-val.json").exists()

    assert report.main([str(run_dir), "--out", str(tmp_path / "report")]) == 0
    (row,) = json.loads((tmp_path / "report" / "results.json").read_text())
    assert row["status"] == "unreadable" and "task.val_fraction._target_" in row["error"]
    assert row["final"] is None

    with pytest.raises(IdentityMismatch, match="task.val_fraction"):
        train(cfg, run_dir)
    assert not sentinel.exists()


@pytest.mark.parametrize(
    "tree, named",
    [
        ({"task": {"_target_": "tasks.classification.Digits"}}, None),  # the suite's own: allowed
        ({"logger": {"x": {"_target_": "os.system"}}}, "logger.x._target_"),  # a key out of the identity
        ({"task": {"_target_": "builtins.exec"}}, "task._target_"),  # a target key, another class
        ({"backbone": {"model": {"_target_": "tasks.classification.Digits"}}}, "backbone.model._target_"),
        ({"attn": {"parts": [{"_target_": "src.attention.build"}]}}, "attn.parts.0._target_"),
        ({"paths": {"data_dir": "${oc.env:HOME}"}}, "paths.data_dir"),  # an interpolation
    ],
)
def test_only_the_suites_own_targets_where_its_configs_put_them(tree, named):
    if named is None:
        check_buildable(tree, "config.yaml")
        return
    with pytest.raises(UntrustedConfig, match=named.replace(".", r"\.")):
        check_buildable(tree, "config.yaml")


@pytest.mark.parametrize(
    "overrides",
    [
        [],
        ["attn=compose"],
        ["task=mlm_tiny", "backbone=crammed_bert_micro", "attn=cond_tokens"],
        ["task=lm_char", "backbone=gpt_micro", "sched=rsqrt"],
        ["task=lra_listops_small", "backbone=nystromformer", "sched=triangle"],
        ["task=modadd", "backbone=sandbox_multihead", "attn=mimetic"],
        ["task=coco_shapes", "backbone=vit_micro_det"],
    ],
    ids=lambda o: " ".join(o) or "default",
)
def test_what_the_suite_composes_is_accepted(tmp_path, overrides):
    """The check refuses nothing the suite itself records: a config of each task family, resolved
    as ``config.yaml`` is written."""
    from omegaconf import OmegaConf

    tree = OmegaConf.to_container(compose(overrides, tmp_path), resolve=True)
    check_buildable(tree, "config.yaml")


def test_eval_reads_the_records_data_folder_wherever_it_runs_from(tmp_path, monkeypatch, capsys):
    """The record's config says ``./data``; from another folder with its own ``data/`` (other
    data), eval still reads the data the run read (identity.json's absolute path)."""
    here, elsewhere = tmp_path / "here", tmp_path / "elsewhere"
    here.mkdir(), elsewhere.mkdir()
    monkeypatch.chdir(here)
    _, run_dir = trained(here, "run", *LISTOPS, "paths.data_dir=data")
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["paths"]["data_dir"] == "data"
    monkeypatch.chdir(elsewhere)
    shutil.copytree(here / "data", elsewhere / "data")
    for tsv in (elsewhere / "data").rglob("basic_val.tsv"):
        tsv.write_text("\n".join(tsv.read_text().splitlines()[:4]) + "\n")  # 3 rows, not 8
    code, _, err = eval_cli(capsys, run_dir)
    assert code == 0, err
    result = json.loads((run_dir / "eval-val.json").read_text())
    assert result["samples"] == 8 and result["data_dir"] == str(here / "data")


def test_an_edited_config_is_refused_and_an_override_is_recorded_beside_the_runs_own(tmp_path, capsys):
    summary, run_dir = trained(tmp_path, "run")
    code, _, err = eval_cli(capsys, run_dir)
    assert code == 0, err
    own = (run_dir / "eval-val.json").read_bytes()
    record = json.loads(own)
    assert record["identity"] == record["record_identity"] and record["overrides"] == []

    code, _, err = eval_cli(capsys, run_dir, "task.val_fraction=0.5")  # other data: recorded, set aside
    assert code == 0, err
    (beside,) = run_dir.glob("eval-val.*.json")
    other = json.loads(beside.read_text())
    assert other["overrides"] == ["task.val_fraction=0.5"] and other["identity"] != other["record_identity"]
    assert other["samples"] == 899 and beside.name == f"eval-val.{other['identity']}.json"
    assert (run_dir / "eval-val.json").read_bytes() == own and "the report does not use it" in err

    code, _, err = eval_cli(capsys, run_dir, "trainer.device=cpu")  # no bearing: the run's own
    assert code == 0 and json.loads((run_dir / "eval-val.json").read_text())["overrides"] == [
        "trainer.device=cpu"
    ]

    config = run_dir / "config.yaml"
    config.write_text(config.read_text().replace("val_fraction: 0.2", "val_fraction: 0.5"))
    code, _, err = eval_cli(capsys, run_dir)
    assert code == 2 and err.count("\n") == 1
    assert "is not the configuration its record ran" in err and "task.val_fraction: 0.2 → 0.5" in err


def test_a_best_checkpoint_from_another_run_is_refused(tmp_path, capsys):
    _, mine = trained(tmp_path, "mine")
    _, theirs = trained(tmp_path, "theirs", "seed=1")
    shutil.copy(theirs / "checkpoints" / "best.pt", mine / "checkpoints" / "best.pt")
    code, _, err = eval_cli(capsys, mine)
    assert code == 2 and err.count("\n") == 1 and "was written by another run" in err
    assert not (mine / "eval-val.json").exists()


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def test_unreadable_checkpoints_are_set_aside_and_eval_falls_back(tmp_path, capsys):
    summary, run_dir = trained(tmp_path, "run")
    folder = run_dir / "checkpoints"
    truncate(folder / "best.pt")
    code, _, err = eval_cli(capsys, run_dir)
    assert code == 0, err
    assert "unreadable checkpoint" in err and "best.pt.corrupt" in err and "evaluating last.pt" in err
    result = json.loads((run_dir / "eval-val.json").read_text())
    assert (result["checkpoint"], result["checkpoint_step"]) == ("last", 4)
    assert (folder / "best.pt.corrupt").exists() and not (folder / "best.pt").exists()

    truncate(folder / "last.pt")
    code, _, err = eval_cli(capsys, run_dir, "checkpoint=last")
    assert code == 0 and "moved to last.pt.corrupt" in err
    result = json.loads((run_dir / "eval-val.json").read_text())
    assert (result["checkpoint_file"], result["checkpoint_step"]) == ("previous.pt", 2)

    import torch

    torch.save({"state_dict": {}}, folder / "last.pt")  # readable, but another program's
    code, _, err = eval_cli(capsys, run_dir, "checkpoint=last")
    assert code == 0 and "not a checkpoint of this suite" in err and "KeyError" not in err
    assert json.loads((run_dir / "eval-val.json").read_text())["checkpoint_file"] == "previous.pt"


def test_a_resumed_run_with_a_truncated_best_checkpoint_tests_last_and_completes(tmp_path):
    args = [*LISTOPS, f"paths.data_dir={tmp_path / 'data'}", "trainer.test_after=best"]
    summary, run_dir = trained(tmp_path, "run", *args)
    (run_dir / "summary.json").unlink()  # killed after its last checkpoint, before its summary
    truncate(run_dir / "checkpoints" / "best.pt")
    again, _ = trained(tmp_path, "run", *args)
    assert again["status"] == "completed" and again["final"] == summary["final"]
    result = json.loads((run_dir / "eval-test.json").read_text())
    assert (result["checkpoint"], result["checkpoint_step"]) == ("last", 4)
    assert (run_dir / "checkpoints" / "best.pt.corrupt").exists()
    assert checkpoint.load(run_dir / "checkpoints" / "last.pt")["loop"]["step"] == 4


def test_a_record_made_before_a_class_moved_is_still_its_own(tmp_path, capsys):
    """A record whose config names a class by its old path (``identity.MOVED_TARGETS``): its
    identity.json and checkpoints carry the hash written then; eval takes them as the record's."""
    import torch

    from src.engine.record.identity import MOVED_TARGETS

    old = "src.engine.schedule.RsqrtLRScheduler"  # before src/engine split into loop/ and record/
    new = MOVED_TARGETS[old]
    _, run_dir = trained(tmp_path, "run", "sched=rsqrt")
    config = run_dir / "config.yaml"
    config.write_text(config.read_text().replace(new, old))
    meta = json.loads((run_dir / "identity.json").read_text())
    meta["config"]["sched"]["_target_"] = old
    text = json.dumps(meta["config"], sort_keys=True, separators=(",", ":"), default=str)
    meta["hash"] = hashlib.sha256(text.encode()).hexdigest()[:16]  # as written then
    (run_dir / "identity.json").write_text(json.dumps(meta))
    for path in (run_dir / "checkpoints").glob("*.pt"):
        state = checkpoint.load(path)
        state["record"]["identity"] = meta["hash"]
        torch.save(state, path)
    code, _, err = eval_cli(capsys, run_dir)
    assert code == 0, err
    result = json.loads((run_dir / "eval-val.json").read_text())
    assert result["identity"] == result["record_identity"] == Identity(meta["config"]).hash
