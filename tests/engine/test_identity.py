"""The run's identity: which settings it depends on, and how two of them differ."""

from __future__ import annotations

import os

import pytest
from conftest import compose
from omegaconf import OmegaConf

from src.engine.record.identity import ABSENT, CHANGES_BITS, EXCLUDED, NO_BEARING, Identity, IdentityMismatch

CHANGED = {  # one new value for each key left out of the identity
    "logger": {"name": "wandb", "project": "p"},
    "paths.output_dir": "/somewhere/else",
    "sweep_name": "another",
    "trainer.progress": "rich",
    "trainer.resume": "restart",
    "trainer.checkpoint_every": 7,
    "trainer.checkpoints": False,
    "trainer.num_workers": 3,
    "trainer.nonfinite": "skip",
    "trainer.nonfinite_limit_consecutive": 3,
    "trainer.nonfinite_limit_total": 5,
    "trainer.collapse_entropy": 0.5,
    "trainer.test_after": "best",
    "trainer.val_at_start": False,
    "trainer.threads": 1,
    "trainer.device": "cpu",
    "trainer.compile": True,
    "trainer.flush_denormal": False,
    "resources": {"nodes": 2, "gpus_per_node": 8, "cpus_per_task": 10, "mem_gb": 480, "time_min": 4320},
}
BEARING = {  # keys that do bear on the result, and a new value for each
    "optim.lr": 0.123,
    "trainer.max_steps": 77,
    "trainer.val_every": 9,
    "attn.eps": 0.5,
    "seed": 5,
    "task.batch_size": 8,
    "backbone.model.depth": 2,
}


def identity_with(tmp_path, key: str, value) -> Identity:
    cfg = compose(["trainer.max_steps=20"], tmp_path)
    OmegaConf.update(cfg, key, value, force_add=True, merge=False)
    return Identity.of(cfg)


def test_every_key_left_out_is_documented_and_changes_nothing(tmp_path):
    assert set(CHANGED) == set(EXCLUDED) == set(NO_BEARING) | set(CHANGES_BITS)
    base = Identity.of(compose(["trainer.max_steps=20"], tmp_path))
    for key, value in CHANGED.items():
        assert identity_with(tmp_path, key, value).hash == base.hash, key


@pytest.mark.parametrize("key, value", BEARING.items())
def test_a_key_that_bears_changes_the_identity_and_is_named_with_both_values(tmp_path, key, value):
    base = Identity.of(compose(["trainer.max_steps=20"], tmp_path))
    other = identity_with(tmp_path, key, value)
    assert other.hash != base.hash
    before = OmegaConf.select(compose(["trainer.max_steps=20"], tmp_path), key)
    assert base.differences(other) == {key: (before, value)}
    with pytest.raises(IdentityMismatch) as error:
        other.check_same(base, tmp_path / "run")
    message = str(error.value)
    assert f"{key}: " in message and "trainer.resume=restart" in message and "\n" not in message


def test_the_data_folder_joins_the_identity_as_an_absolute_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    relative = identity_with(tmp_path, "paths.data_dir", "./data")
    absolute = identity_with(tmp_path, "paths.data_dir", str(tmp_path / "data"))
    elsewhere = identity_with(tmp_path, "paths.data_dir", str(tmp_path / "other"))
    assert relative.hash == absolute.hash != elsewhere.hash
    assert relative.config["paths"]["data_dir"] == os.path.join(str(tmp_path), "data")
    assert list(relative.differences(elsewhere)) == ["paths.data_dir"]


def test_a_key_one_side_lacks_is_null_and_an_added_null_option_changes_nothing(tmp_path):
    a = Identity({"attn": {"variant": "spectral"}})
    b = Identity({"attn": {"variant": "spectral", "lam": 1.0}})
    assert a.differences(b) == {"attn.lam": (ABSENT, 1.0)}
    with pytest.raises(IdentityMismatch, match=r"attn\.lam: null → 1\.0"):
        b.check_same(a, "run")
    before = Identity.of(compose(["trainer.max_steps=20"], tmp_path))  # a record from before an option
    after = identity_with(tmp_path, "task.new_option", None)  # ... that came with a null default
    assert before.hash == after.hash


def test_a_record_naming_a_class_by_its_old_path_keeps_its_identity():
    """``conf/sched/rsqrt.yaml``'s class moved from tasks/lra to src/engine: a record made before
    the move resumes (same hash) and groups with new runs."""
    from src.engine.record.identity import MOVED_TARGETS, Identity

    for old, new in MOVED_TARGETS.items():
        before = Identity({"sched": {"_target_": old, "warmup_steps": 10}, "seed": 0})
        after = Identity.of({"sched": {"_target_": new, "warmup_steps": 10}, "seed": 0})
        assert before.hash == after.hash and not before.differences(after)
        assert Identity({"sched": {"_target_": new, "warmup_steps": 11}}).hash != after.hash


def _git(root, *args):
    import subprocess

    subprocess.run(
        ["git", *args],
        cwd=root,
        check=True,
        capture_output=True,
        env={
            "GIT_AUTHOR_NAME": "t",
            "GIT_AUTHOR_EMAIL": "t@t",
            "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@t",
            "HOME": str(root),
            "PATH": "/usr/bin:/bin",
        },
    )


def test_code_version_ignores_a_venv_link_and_stray_files_but_not_code(tmp_path):
    """Finding 10: a `.venv` symlink (which `.venv/` in .gitignore did not match) and an untracked
    note outside the code folders leave the revision clean; an edited tracked file, or a new
    module under src/, make it `-dirty`."""
    from src.engine.record.identity import revision_of

    repo = tmp_path / "repo"
    (repo / "src").mkdir(parents=True)
    (repo / "src" / "a.py").write_text("x = 1\n")
    (repo / ".gitignore").write_text(".venv/\n")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "init")
    (tmp_path / "venv").mkdir()
    (repo / ".venv").symlink_to(tmp_path / "venv")
    (repo / "notes.txt").write_text("mine\n")
    clean = revision_of(repo)
    assert clean is not None and not clean.endswith("-dirty")
    (repo / "src" / "new.py").write_text("y = 2\n")
    assert revision_of(repo) == clean + "-dirty"
    (repo / "src" / "new.py").unlink()
    (repo / "src" / "a.py").write_text("x = 2\n")
    assert revision_of(repo) == clean + "-dirty"


def test_gitignore_matches_a_venv_link():
    """`.venv` (no slash) matches the folder and a link to one."""
    from src.engine.record.identity import ROOT

    assert ".venv" in (ROOT / ".gitignore").read_text().splitlines()
