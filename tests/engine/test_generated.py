"""Generated data (src/engine/generated.py): made once, again when its spec changes or its files
are damaged, never taken for complete while half-written, and made by one of two processes."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from conftest import ROOT

from src.engine.generated import NotPrepared, ensure_generated, preparing


class Generator:
    """Writes ``data.txt`` from the spec's seed and counts its calls."""

    def __init__(self, folder, fail: bool = False):
        self.folder, self.calls, self.fail = folder, 0, fail

    def __call__(self, seed: int):
        self.calls += 1
        (self.folder / "data.txt").write_text(f"seed {seed}")
        if self.fail:
            raise RuntimeError("killed while generating")
        return {"rows": 3}


def ensure(folder, generator, seed: int, **kw):
    return ensure_generated(folder / "generator.json", {"seed": seed}, lambda: generator(seed), **kw)


def test_the_same_spec_is_generated_once_and_another_spec_generates_again(tmp_path):
    make = Generator(tmp_path)
    assert ensure(tmp_path, make, 1) == {"seed": 1, "rows": 3}  # the spec and what the generator said
    assert ensure(tmp_path, make, 1) == {"seed": 1, "rows": 3} and make.calls == 1
    changed = r"generated with \{'seed': 1\}, now \{'seed': 2\}: generating again"
    with pytest.warns(UserWarning, match=changed):
        assert ensure(tmp_path, make, 2)["seed"] == 2
    assert make.calls == 2 and (tmp_path / "data.txt").read_text() == "seed 2"
    assert json.loads((tmp_path / "generator.json").read_text()) == {"seed": 2, "rows": 3}


def test_a_generation_cut_short_is_not_taken_for_complete(tmp_path):
    ensure(tmp_path, Generator(tmp_path), 1)
    with pytest.raises(RuntimeError), pytest.warns(UserWarning, match="generating again"):
        ensure(tmp_path, Generator(tmp_path, fail=True), 2)  # files half-rewritten, then killed
    assert not (tmp_path / "generator.json").exists()  # the marker went before the files changed
    make = Generator(tmp_path)
    ensure(tmp_path, make, 1)
    assert make.calls == 1 and (tmp_path / "data.txt").read_text() == "seed 1"


def test_damaged_files_are_generated_again_saying_why(tmp_path):
    make = Generator(tmp_path)

    def damage(saved):
        return None if (tmp_path / "data.txt").is_file() else "data.txt is missing"

    ensure(tmp_path, make, 1, damage=damage)
    (tmp_path / "data.txt").unlink()
    with pytest.warns(UserWarning, match="data.txt is missing; generating again"):
        ensure(tmp_path, make, 1, damage=damage)
    assert make.calls == 2 and (tmp_path / "data.txt").is_file()


# What each of two processes runs: generated.py is loaded alone (not the package, whose imports
# are slow); its generator holds the lock until the test creates `release`.
WORKER = """
import importlib.util, json, sys, time
from pathlib import Path
spec = importlib.util.spec_from_file_location("generated", sys.argv[3])
generated = importlib.util.module_from_spec(spec)
spec.loader.exec_module(generated)
folder, name = Path(sys.argv[1]), sys.argv[2]

def generate():
    with open(folder / "calls", "a") as f:
        f.write(name + "\\n")
    (folder / "started").touch()
    deadline = time.monotonic() + 60
    while not (folder / "release").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    (folder / "data.txt").write_text("made by " + name)

print("checking", flush=True)
saved = generated.ensure_generated(folder / "generator.json", {"seed": 1}, generate)
print(json.dumps(saved), (folder / "data.txt").read_text(), flush=True)
"""


def worker(folder, name: str) -> subprocess.Popen:
    module = ROOT / "src" / "engine" / "generated.py"
    return subprocess.Popen(
        [sys.executable, "-c", WORKER, str(folder), name, str(module)], stdout=subprocess.PIPE, text=True
    )


def wait_for(path, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def test_of_two_processes_one_generates_and_the_other_waits_then_reads_it(tmp_path):
    first = worker(tmp_path, "first")
    wait_for(tmp_path / "started")  # the first generates, holding the lock
    second = worker(tmp_path, "second")
    try:
        assert second.stdout.readline().strip() == "checking"
        time.sleep(1.0)
        assert second.poll() is None  # waiting for the lock, not generating
        assert (tmp_path / "calls").read_text().split() == ["first"]
        (tmp_path / "release").touch()
        outputs = [p.communicate(timeout=60)[0].strip().splitlines()[-1] for p in (first, second)]
    finally:
        for p in (first, second):
            p.kill()
    assert first.returncode == second.returncode == 0
    assert outputs == ['{"seed": 1} made by first'] * 2
    assert (tmp_path / "calls").read_text().split() == ["first"]


def test_data_that_is_there_without_a_marker_is_the_users_and_is_never_overwritten(tmp_path):
    (tmp_path / "data.txt").write_text("the user's own release")
    make = Generator(tmp_path)
    present = (tmp_path / "data.txt").is_file
    assert ensure(tmp_path, make, 1, present=present) == {} and make.calls == 0
    assert (tmp_path / "data.txt").read_text() == "the user's own release"
    assert not (tmp_path / "generator.json").exists()


def test_first_use_says_in_one_line_what_was_generated_where_and_how_long_and_a_second_says_nothing(
    tmp_path, caplog
):
    """Finding 8: generating ListOps logs one line naming the set, its sizes, the folder and the
    time; using it again logs none."""
    import logging
    import re

    from tasks.lra.listops import ListOpsSpec
    from tasks.lra.tasks import ensure_listops

    spec = ListOpsSpec(num_train=40, num_val=8, num_test=8)
    folder = tmp_path / "lra" / "listops"
    with caplog.at_level(logging.INFO):
        ensure_listops(folder, spec)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("generated")]
    assert len(lines) == 1, lines
    expected = rf"generated ListOps \(40 train / 8 val / 8 test\) in {folder} in \d+\.\d s"
    assert re.fullmatch(expected, lines[0])
    caplog.clear()
    with caplog.at_level(logging.INFO):
        ensure_listops(folder, spec)
    assert not [r for r in caplog.records if r.getMessage().startswith("generated")]


# -- preparing ahead: a block that notes what it found or built, and a check that builds nothing -----


def test_a_check_builds_nothing_and_says_what_is_missing_and_why(tmp_path):
    make = Generator(tmp_path)
    marker = tmp_path / "generator.json"
    damage = lambda saved: None if (tmp_path / "data.txt").is_file() else "data.txt is missing"  # noqa: E731
    with preparing(check=True) as check:
        with pytest.raises(NotPrepared, match=rf"in {tmp_path}: not built yet"):
            ensure(tmp_path, make, 1, damage=damage)
        assert make.calls == 0 and list(tmp_path.iterdir()) == []  # no lock file either
    ensure(tmp_path, make, 1, damage=damage)
    with preparing(check=True) as check:
        assert ensure(tmp_path, make, 1, damage=damage) == {"seed": 1, "rows": 3}
        with pytest.raises(NotPrepared, match="built from another seed"):
            ensure(tmp_path, make, 2, damage=damage)
        (tmp_path / "data.txt").unlink()
        with pytest.raises(NotPrepared, match="data.txt is missing"):
            ensure(tmp_path, make, 1, damage=damage)
    assert make.calls == 1 and marker.is_file()  # the marker a check found stale is left as it was
    assert [a.state for a in check.artefacts.values()] == ["ready"]
    (tmp_path / "data.txt").write_text("the user's own")
    marker.unlink()
    with preparing(check=True) as check:
        assert ensure(tmp_path, make, 1, present=(tmp_path / "data.txt").is_file) == {}
    assert [a.state for a in check.artefacts.values()] == ["found"] and make.calls == 1


def test_a_preparing_block_notes_each_artefact_once_with_its_files_and_says_what_it_builds(tmp_path):
    make, said = Generator(tmp_path), []
    data = tmp_path / "data.txt"
    with preparing(say=said.append) as first:
        ensure(tmp_path, make, 1, what="the data", outputs=(data,))
        ensure(tmp_path, make, 1, what="the data", outputs=(data,))  # read again: still one, built
    ((marker, artefact),) = first.artefacts.items()
    assert marker == tmp_path / "generator.json" and artefact.state == "built" and make.calls == 1
    assert artefact.outputs == (data,) and artefact.size() == len("seed 1") and artefact.seconds >= 0
    assert said[0] == f"building the data in {tmp_path} ..." and said[1].startswith(
        f"generated the data in {tmp_path}"
    )
    with preparing(say=said.append) as second:
        ensure(tmp_path, make, 1, what="the data", outputs=(data,))
    assert [a.state for a in second.artefacts.values()] == ["ready"] and len(said) == 2 and make.calls == 1
    with pytest.warns(UserWarning, match="generating again"):
        ensure(tmp_path, make, 2)  # outside a block: nothing noted, nothing said
    assert len(said) == 2 and [a.state for a in second.artefacts.values()] == ["ready"]


def test_a_long_build_says_how_far_it_is_at_most_every_interval(tmp_path, monkeypatch):
    from src.engine import generated

    said = []
    monkeypatch.setitem(generated._PROGRESS, "last", time.monotonic())  # a build has just started
    with preparing(say=said.append):
        assert list(generated.counted(range(25), "texts read", every=10)) == list(range(25))
        assert said == []  # within the interval of the build's start: nothing said
        monkeypatch.setattr(generated, "PROGRESS_EVERY_S", 0.0)
        assert list(generated.counted(range(25), "texts read", every=10)) == list(range(25))
    assert said == ["10 texts read", "20 texts read"]
