"""Generated data (src/engine/generated.py): made once, again when its spec changes or its files
are damaged, never taken for complete while half-written, and made by one of two processes."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from conftest import ROOT

from src.engine.generated import ensure_generated


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
