"""The one tail of every ``python -m`` command (src/command.py): its exit statuses, its one error line
on stderr, and every entry point's ``--help`` under its own ``python -m`` name."""

from __future__ import annotations

import argparse
import importlib
import re
import subprocess
import sys

import pytest
from conftest import ROOT

from src.command import command_parser, run_command
from src.errors import ConfigError, DataError

#: Every module of the suite with a ``__main__`` block, but src.run (Hydra's; src/cli.py is its tail).
ENTRY_POINTS = sorted(
    ".".join(path.relative_to(ROOT).with_suffix("").parts)
    for folder in ("src", "tasks", "launch")
    for path in (ROOT / folder).rglob("*.py")
    if re.search(r'^if __name__ == "__main__":', path.read_text(encoding="utf-8"), re.M)
    and path != ROOT / "src/run.py"
)


def toy(handler, argv: list[str] | None = None, **options) -> int:
    """``python -m toy.command [argv]`` with ``handler`` as its work."""
    parser = command_parser("toy.command", "What the toy does.\n\nMore about it.")
    parser.add_argument("--value", type=int, default=0)
    return run_command(parser, handler, argv or [], **options)


def raises(error: BaseException):
    """A handler that raises ``error``."""

    def handler(args: argparse.Namespace) -> None:
        raise error

    return handler


def test_the_suites_error_is_one_line_on_stderr_and_status_2(capsys):
    assert toy(raises(ConfigError("--value 3: give an even number"))) == 2
    out = capsys.readouterr()
    assert out.err == "error: --value 3: give an even number\n" and out.out == ""


def test_a_suite_error_wrapped_by_another_library_is_its_own_line(capsys):
    """As Hydra's instantiate wraps what a target raises: the cause's message, not the wrapper's."""
    try:
        raise DataError("no data folder data/x: run make data")
    except DataError as cause:
        wrapped = RuntimeError("Error in call to target 'tasks.x.Task':\nDataError(...)")
        wrapped.__cause__ = cause
    assert toy(raises(wrapped)) == 2
    assert capsys.readouterr().err == "error: no data folder data/x: run make data\n"


def test_expected_errors_are_one_line_and_named_ones_carry_their_type(capsys):
    assert toy(raises(ValueError("bad margin")), expected=(ValueError,)) == 2
    assert capsys.readouterr().err == "error: bad margin\n"
    assert toy(raises(KeyError("nokey")), named=(Exception,)) == 2
    assert capsys.readouterr().err == "error: KeyError: 'nokey'\n"
    assert toy(raises(LookupError("first line\nsecond line")), named=(LookupError,)) == 2
    assert capsys.readouterr().err == "error: LookupError: first line\n"


def test_ctrl_c_is_status_130_with_one_line_and_nothing_on_stdout(capsys):
    assert toy(raises(KeyboardInterrupt())) == 130
    out = capsys.readouterr()
    assert out.err == "interrupted\n" and out.out == ""


def test_the_handlers_status_is_the_commands_and_none_is_0(capsys):
    assert toy(lambda args: args.value, ["--value", "7"]) == 7
    assert toy(lambda args: print(f"value {args.value}"), ["--value", "3"]) == 0
    assert capsys.readouterr().out == "value 3\n"


def test_help_is_status_0_under_the_python_m_name_with_the_first_paragraph(capsys):
    with pytest.raises(SystemExit) as done:
        toy(lambda args: 1, ["--help"])
    out = capsys.readouterr().out
    assert done.value.code == 0 and out.startswith("usage: python -m toy.command ")
    assert "What the toy does." in out and "More about it." not in out


def test_a_usage_error_is_argparses_status_2_and_the_handler_never_runs(capsys):
    called = []
    with pytest.raises(SystemExit) as done:
        toy(called.append, ["--value", "x"])
    assert done.value.code == 2 and called == []
    assert "python -m toy.command: error: argument --value: invalid int value: 'x'" in capsys.readouterr().err


def test_a_bug_keeps_its_traceback_and_status_1():
    """Not the user's mistake: Python's own ending (the traceback to report), not one line."""
    code = (
        "from src.command import command_parser, run_command\n"
        "def work(args):\n"
        "    return {}['missing']\n"
        "raise SystemExit(run_command(command_parser('toy', None), work, []))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith("Traceback (most recent call last):")
    assert done.stderr.rstrip().endswith("KeyError: 'missing'") and "error: " not in done.stderr


def test_every_entry_point_is_found():
    assert {"src.eval", "launch.plan", "launch.analysis.report", "tasks.lra.generate"} <= set(ENTRY_POINTS)
    assert "src.run" not in ENTRY_POINTS


@pytest.mark.parametrize("module", ["src.eval", "tasks.lm.sample"])
def test_the_evaluation_and_sampling_commands_answer_help_without_importing_torch(module):
    """Their work imports torch and the suite after the command line parsed (``src.engine.run_eval``,
    ``tasks.lm.sampling``): ``--help`` is the usage alone, not 8–12 s of imports."""
    code = (
        "import runpy, sys\n"
        f"sys.argv = [{module!r}, '--help']\n"
        "try:\n"
        f"    runpy.run_module({module!r}, run_name='__main__')\n"
        "except SystemExit as done:\n"
        "    assert done.code == 0, done.code\n"
        "print(sorted(m for m in ('torch', 'timm', 'hydra') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"usage: python -m {module}" in done.stdout and done.stdout.splitlines()[-1] == "[]"


@pytest.mark.parametrize("module", ENTRY_POINTS)
def test_every_entry_points_help_names_it_and_its_docstrings_first_paragraph(module, capsys, monkeypatch):
    """``python -m X --help`` (in this process: ``X.main(["--help"])``) exits 0, its usage names
    ``python -m X``, and its description is the module docstring's first paragraph."""
    monkeypatch.setenv("COLUMNS", "10000")  # one line per paragraph: the text compares whole
    imported = importlib.import_module(module)
    with pytest.raises(SystemExit) as done:
        imported.main(["--help"])
    out = capsys.readouterr().out
    assert done.value.code == 0 and out.startswith(f"usage: python -m {module} ")
    first_paragraph = " ".join(imported.__doc__.strip().split("\n\n")[0].split())
    assert first_paragraph in re.sub(r"\s+", " ", out)
