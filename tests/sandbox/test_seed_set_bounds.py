"""Seed sets read only as far as they can be bounded (issue 39, item 4 and item 7): a torn or
wrongly shaped ``curves.json``, a FIFO or ``/dev/zero`` in its place, a damaged ``memory.json``:
``launch.analysis.report`` lists the file with its reason and goes on with the other sets;
``launch.analysis.seed_sets`` and ``src.sandbox.join`` end in one ``error:`` line, exit 2, nothing
written."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import report_in_a_bounded_process

from launch.analysis import report, seed_sets
from src.sandbox import join
from src.sandbox.curves import Curves

ROOT = Path(__file__).resolve().parents[2]


def a_set(seeds: list[int], learns: list[int | None], epochs: int = 20, variant: str = "standard") -> Curves:
    """A set whose seed ``i`` reaches 100% test accuracy at epoch ``learns[i]`` (never: 0.5 flat)."""
    acc = [[1.0 if at is not None and e + 1 >= at else 0.5 for e in range(epochs)] for at in learns]
    overrides = ["experiment=paper/p5", *([f"attn={variant}"] if variant != "standard" else [])]
    return Curves(seeds, overrides, epochs, 10, 100, acc=acc, loss=[[1.0] * epochs for _ in learns])


def saved(folder: Path, curves: Curves) -> Path:
    folder.mkdir(parents=True)
    curves.save(folder / "curves.json")
    return folder


def tear(path: Path) -> None:
    """Cut a file in the middle of its content, as a copy or a write cut short leaves it."""
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def good_sets(root: Path) -> None:
    saved(root / "standard", a_set([0, 1, 2, 3], [5, 6, None, 7]))
    saved(root / "cond_init", a_set([0, 1, 2, 3], [3, 4, 5, 6], variant="cond_init"))


WRONG_SHAPES = {  # a parsed curves.json changed, and what its one line says
    "no-seeds": (lambda t: {k: v for k, v in t.items() if k != "seeds"}, "no seeds"),
    "a-list": (lambda t: [t], "a JSON list, not an object"),
    "short-rows": (lambda t: {**t, "acc": [row[:5] for row in t["acc"]]}, "acc: row 0 is not 20 values"),
    "rows-not-per-seed": (lambda t: {**t, "acc": t["acc"][:1]}, "acc: not 2 rows, one per seed"),
    "accuracy-of-5": (
        lambda t: {**t, "acc": [[5.0] * 20, t["acc"][1]]},
        "acc: row 0 holds 5.0, not an accuracy in [0, 1]",
    ),
    "epochs-a-word": (lambda t: {**t, "epochs": "twenty"}, "its epochs is 'twenty', not an integer"),
    "unknown-key": (lambda t: {**t, "payload": 1}, "unknown keys ['payload']"),
}


def shaped(folder: Path, change, seeds: tuple[int, int] = (0, 1)) -> Path:
    """A two-seed set in ``folder`` whose curves.json is ``change``d."""
    saved(folder, a_set(list(seeds), [5, None]))
    path = folder / "curves.json"
    path.write_text(json.dumps(change(json.loads(path.read_text()))))
    return path


# -- launch.analysis.report ----------------------------------------------------------------------------


def test_a_torn_curves_json_anywhere_in_the_tree_is_listed_and_the_report_goes_on(tmp_path, capsys):
    """A torn sandbox `curves.json` anywhere in the tree gives a traceback and no report at all:
    now the report is written, the other sets paired and judged, the torn file listed with why."""
    good_sets(tmp_path)
    torn = saved(tmp_path / "deep" / "er" / "torn", a_set([0, 1], [5, None])) / "curves.json"
    tear(torn)
    assert report.main([str(tmp_path), "--out", str(tmp_path / "out")]) == 0
    text = (tmp_path / "out" / "report.md").read_text()
    assert "| `attn=cond_init` (4) | 4 of 4" in text  # the good sets, paired as ever
    assert "### Seed-set files that cannot be read (1): not counted" in text
    assert f"- `{torn}`: {torn} is torn or damaged (not JSON: " in text


@pytest.mark.parametrize("shape", WRONG_SHAPES, ids=list(WRONG_SHAPES))
def test_a_wrongly_shaped_curves_json_is_listed_by_the_report(tmp_path, shape):
    """A wrongly shaped `curves.json` in the report's tree: listed with its reason, never a traceback
    nor a rate computed from it."""
    change, reason = WRONG_SHAPES[shape]
    good_sets(tmp_path)
    path = shaped(tmp_path / "odd", change)
    assert report.main([str(tmp_path), "--out", str(tmp_path / "out")]) == 0
    text = (tmp_path / "out" / "report.md").read_text()
    assert f"- `{path}`: {path} is not a seed set's curves.json ({reason}" in text


@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_a_curves_json_that_is_a_fifo_or_dev_zero_never_stops_the_report(tmp_path, kind):
    """A seed set's `curves.json` a FIFO (the report hung) or a link to `/dev/zero` (it read until
    the memory ran out): listed, the report written within seconds (in its own process, its memory
    limited, its time bounded)."""
    good_sets(tmp_path)
    path = tmp_path / "odd" / "curves.json"
    path.parent.mkdir()
    os.mkfifo(path) if kind == "fifo" else path.symlink_to("/dev/zero")
    result = report_in_a_bounded_process(tmp_path, tmp_path / "out")
    assert result.returncode == 0, result.stderr[-2000:]
    text = (tmp_path / "out" / "report.md").read_text()
    said = "is a FIFO (named pipe), not a regular file" if kind == "fifo" else "links out of its folder"
    assert f"- `{path}`: {path} {said}" in text


@pytest.mark.parametrize(
    ("content", "reason"),
    [("{", "is not JSON"), ('{"statistics": [{"lr": "x"}]}', "statistics[0]: lr, seeds")],
)
def test_a_damaged_memory_json_is_listed_and_the_report_goes_on(tmp_path, content, reason):
    """The report's other seed-set record, `memory.json`: torn or wrongly shaped, listed with its
    reason (it ended the report in a traceback)."""
    good_sets(tmp_path)
    (tmp_path / "memory").mkdir()
    (tmp_path / "memory" / "memory.json").write_text(content)
    assert report.main([str(tmp_path), "--out", str(tmp_path / "out")]) == 0
    text = (tmp_path / "out" / "report.md").read_text()
    assert f"- `{tmp_path / 'memory' / 'memory.json'}`: " in text and reason in text


# -- launch.analysis.seed_sets and src.sandbox.join -------------------------------------------------------


def test_success_on_a_torn_curves_json_is_one_line(tmp_path, capsys):
    """`launch.analysis.seed_sets` on a torn `curves.json` (a traceback): one `error:` line, exit 2."""
    good_sets(tmp_path)
    tear(tmp_path / "cond_init" / "curves.json")
    assert seed_sets.main([str(tmp_path / "standard"), str(tmp_path / "cond_init")]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    (line,) = err.splitlines()
    assert line.startswith(f"error: {tmp_path / 'cond_init' / 'curves.json'} is torn or damaged (not JSON: ")


@pytest.mark.parametrize("shape", ["no-seeds", "short-rows", "accuracy-of-5"])
def test_success_on_a_wrongly_shaped_curves_json_is_one_line(tmp_path, capsys, shape):
    change, reason = WRONG_SHAPES[shape]
    path = shaped(tmp_path / "odd", change)
    assert seed_sets.main([str(path.parent)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == f"error: {path} is not a seed set's curves.json ({reason}): move it aside\n"


@pytest.mark.parametrize("shape", ["torn", *WRONG_SHAPES])
def test_join_with_a_torn_or_wrongly_shaped_curves_json_is_one_line_and_writes_nothing(
    tmp_path, capsys, shape
):
    """`src.sandbox.join` with a torn or wrongly shaped `curves.json` (tracebacks): one `error:`
    line, exit 2, the joined folder never made."""
    part = saved(tmp_path / "a", a_set([0, 1], [5, None]))
    if shape == "torn":
        other = saved(tmp_path / "b", a_set([2, 3], [5, None])) / "curves.json"
        tear(other)
        reason = "is torn or damaged (not JSON: "
    else:
        change, said = WRONG_SHAPES[shape]
        other = shaped(tmp_path / "b", change, seeds=(2, 3))  # a part join would take but for its shape
        reason = f"is not a seed set's curves.json ({said}"
    assert join.main([str(tmp_path / "joined"), str(part), str(other.parent)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    (line,) = err.splitlines()
    assert line.startswith(f"error: {other} {reason}")
    assert not (tmp_path / "joined").exists()


def test_a_good_set_still_loads_and_joins(tmp_path, capsys):
    """The checks refuse no set the suite writes: two parts join, and the joined set reads back."""
    first = saved(tmp_path / "a", a_set([0, 1], [5, None]))
    second = saved(tmp_path / "b", a_set([2, 3], [6, 7]))
    assert join.main([str(tmp_path / "joined"), str(first), str(second)]) == 0
    joined = Curves.load(tmp_path / "joined" / "curves.json")
    assert joined.seeds == [0, 1, 2, 3] and joined.acc[3] == a_set([3], [7]).acc[0]
