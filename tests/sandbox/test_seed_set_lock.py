"""Issue 39, item 5 and the seed sets' minor cases of item 7: a seed set's ``--out`` (and a joined
set's ``OUT``) is held by one command at a time, a damaged ``progress.pt`` is set aside, and the
command's numeric arguments are checked before anything trains."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from conftest import ROOT, SMALL_MODADD

from src.engine.record.lock import RunLock
from src.sandbox.curves import Curves

SMALL = [*SMALL_MODADD, "trainer.max_steps=null", "trainer.threads=1"]


def error_line(capsys) -> str:
    """The command's stderr, which must be one ``error:`` line."""
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def test_a_second_seed_set_into_the_same_out_is_refused_while_the_first_trains(tmp_path, capsys):
    """Two seed sets into one --out at once: the second is refused (one line naming the first's
    process, exit 2) and writes nothing; before, both exited 0 and the folder held the second."""
    from src.sandbox.seeds import main

    out = tmp_path / "set"
    first = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "src.sandbox.seeds",
            *SMALL,
            "--seeds",
            "0-1",
            "--epochs",
            "400",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
    )
    try:
        assert first.stdout.readline().startswith("epoch 20/400"), "the first set did not start"
        assert main([*SMALL, "--seeds", "0-1", "--epochs", "1", "--out", str(out)]) == 2
        line = error_line(capsys)
        assert f"output folder {out} is in use by process {first.pid}" in line
        assert "python -m src.sandbox.seeds" in line and "another --out" in line
        assert first.poll() is None  # the first trains on
        assert not (out / "curves.json").exists() and not (out / "weights.safetensors").exists()
    finally:
        first.kill()
        first.wait()


def test_a_grid_cell_held_by_another_command_is_refused(tmp_path, capsys):
    """A grid into --out D whose cell D/<cell> is another command's --out (held): refused before the
    cell trains, the cell left to its holder."""
    from src.sandbox.seeds import main

    grid = [*SMALL, "optim.lr=1e-3,3e-3", "--seeds", "0", "--epochs", "1", "--out", str(tmp_path / "grid")]
    cell = tmp_path / "grid" / "optim.lr=0.003"
    with RunLock(cell):
        assert main(grid) == 2
        assert "is in use by process" in error_line(capsys)
    assert not (cell / "curves.json").exists()


def test_a_joined_set_into_a_held_folder_is_refused(tmp_path, capsys):
    """src.sandbox.join into an OUT another command writes: one line, exit 2, nothing written."""
    from src.sandbox.join import main
    from src.sandbox.seeds import main as seeds

    assert seeds([*SMALL, "--seeds", "0", "--epochs", "1", "--out", str(tmp_path / "s0")]) == 0
    assert seeds([*SMALL, "--seeds", "1", "--epochs", "1", "--out", str(tmp_path / "s1")]) == 0
    capsys.readouterr()
    out = tmp_path / "both"
    with RunLock(out):
        assert main([str(out), str(tmp_path / "s0"), str(tmp_path / "s1")]) == 2
        assert f"output folder {out} is in use by process {os.getpid()}" in error_line(capsys)
        assert sorted(p.name for p in out.iterdir()) == [".lock"]
    assert main([str(out), str(tmp_path / "s0"), str(tmp_path / "s1")]) == 0  # free again
    assert Curves.load(out / "curves.json").seeds == [0, 1]


def test_a_damaged_progress_file_is_set_aside_and_the_set_starts_afresh(tmp_path, capsys):
    """A damaged seed-set progress.pt: before, a traceback on every rerun and never set aside; now
    moved to progress.pt.corrupt with one note, and the set trains afresh to the same curves and
    weights as a set that never had one."""
    from safetensors.torch import load_file

    from src.sandbox.seeds import main

    args = [*SMALL, "--seeds", "0-1", "--epochs", "2"]
    assert main([*args, "--out", str(tmp_path / "clean")]) == 0
    out = tmp_path / "damaged"
    out.mkdir()
    junk = b"PK\x03\x04 not a zip that torch can read" * 10
    (out / "progress.pt").write_bytes(junk)
    capsys.readouterr()
    assert main([*args, "--out", str(out)]) == 0
    note = [line for line in capsys.readouterr().err.splitlines() if "progress" in line]
    assert len(note) == 1 and "moved to progress.pt.corrupt" in note[0]
    assert (out / "progress.pt.corrupt").read_bytes() == junk and not (out / "progress.pt").exists()
    clean, again = Curves.load(tmp_path / "clean" / "curves.json"), Curves.load(out / "curves.json")
    assert again.acc == clean.acc and again.loss == clean.loss
    before, after = (
        load_file(tmp_path / "clean" / "weights.safetensors"),
        load_file(out / "weights.safetensors"),
    )
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)


def test_a_progress_of_this_set_that_does_not_fit_it_is_set_aside(tmp_path, capsys):
    """A progress.pt with this set's seeds, epochs and overrides but weights that fit no model of it
    (a hand-edited or foreign file): set aside, not half-loaded; the set trains afresh."""
    from src.sandbox.seeds import cells, main

    out = tmp_path / "set"
    out.mkdir()
    ((overrides, _),) = cells(SMALL)  # as the command records them (frames=False)
    progress = {"seeds": [0], "epochs": 2, "overrides": overrides, "epoch": 1, "accs": [[0.0]],
                "losses": [[1.0]], "seconds": 1.0, "holder": {"nope": torch.zeros(3)}, "optimizer": {},
                "buffers": {}, "clustering": [], "focus": []}  # fmt: skip
    torch.save(progress, out / "progress.pt")
    assert main([*SMALL, "--seeds", "0", "--epochs", "2", "--out", str(out)]) == 0
    assert "moved to progress.pt.corrupt" in capsys.readouterr().err
    assert (out / "progress.pt.corrupt").is_file() and len(Curves.load(out / "curves.json").acc[0]) == 2


@pytest.mark.parametrize(
    "given, said",
    [
        (["--epochs", "0"], "--epochs 0: give at least 1"),
        (["--epochs", "-3"], "--epochs -3: give at least 1"),
        (["--probe-every", "-1"], "--probe-every -1: give at least 0"),
    ],
    ids=["epochs-0", "epochs-negative", "probe-every-negative"],
)
def test_epochs_and_probe_cadence_out_of_range_are_one_line(tmp_path, capsys, given, said):
    """--epochs 0 silently trained the recipe's 1,000, --epochs -3 an AssertionError, --probe-every
    -1 was accepted: each is now one error line, exit 2, no folder made."""
    from src.sandbox.seeds import main

    out = tmp_path / "set"
    assert main([*SMALL, "--seeds", "0", *given, "--out", str(out)]) == 2
    assert said in error_line(capsys)
    assert not out.exists()


def test_a_memory_measurement_into_a_held_folder_is_refused(tmp_path, capsys):
    """src.sandbox.memory --out is an output folder too: a second command into it while the first
    writes is one line, exit 2, nothing written."""
    from src.sandbox.memory import main

    out = tmp_path / "memory"
    with RunLock(out):
        assert main(["--seeds", "0-1", "--steps", "3", "--out", str(out)]) == 2
        assert "is in use by process" in error_line(capsys)
        assert sorted(p.name for p in out.iterdir()) == [".lock"]
