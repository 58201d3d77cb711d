"""One tail for every ``python -m`` command other than ``src.run``: its parser, its handler, its exit status.

Each command (``src.eval``, ``launch.analysis.report``, ``tasks.lra.generate``, …) builds its
parser with :func:`command_parser` (``prog`` is ``python -m <module>``, the description its
docstring's first paragraph) and ends in :func:`run_command`, so that every command answers alike:

* **0**, or the handler's own status (``gpu_check``'s 1 for a failed check), on success;
* **2** and one line ``error: …`` on stderr, nothing more, for the user's mistake: a
  :class:`~src.errors.SuiteError` (also one that another library wrapped, as Hydra's instantiate
  does), or an error the command names as the user's (``expected``; ``named``: printed with its
  type, for Hydra's grammar and composition errors, whose messages say little without it);
  argparse's own usage errors keep argparse's usage line and status 2;
* **130** and one line on stderr for Ctrl-C (:class:`KeyboardInterrupt`), as a shell reports it;
* **1** and the traceback for anything else: a bug, whose traceback is what to report.

A command's module ends ``def main(argv=None) -> int: return run_command(…)`` and
``if __name__ == "__main__": raise SystemExit(main())``; tests call ``main([...])`` in process.
(``src/cli.py`` is another thing: ``src.run``'s argv before Hydra parses it.)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from src.errors import message_of, user_error

#: The exit status of bad input, of Ctrl-C (128 + SIGINT, as a shell reports it).
USER_ERROR, INTERRUPTED = 2, 130


def command_parser(
    module: str, doc: str | None, parser_class: type[argparse.ArgumentParser] = argparse.ArgumentParser
) -> argparse.ArgumentParser:
    """The parser of ``python -m <module>`` (pass the module's ``__spec__.name``, which is its
    dotted name under ``python -m`` too), described by ``doc``'s first paragraph."""
    description = (doc or "").strip().split("\n\n")[0] or None
    return parser_class(prog=f"python -m {module}", description=description)


def run_command(
    parser: argparse.ArgumentParser,
    handler: Callable[[argparse.Namespace], int | None],
    argv: Sequence[str] | None = None,
    *,
    intermixed: bool = False,
    expected: tuple[type[BaseException], ...] = (),
    named: tuple[type[BaseException], ...] = (),
) -> int:
    """Parse ``argv`` (``sys.argv[1:]`` when None; ``intermixed``: options between positionals) and
    call ``handler``; the exit status as the module's docstring states it. ``--help`` and usage
    errors end in argparse's :class:`SystemExit`, as ever."""
    try:  # a parser may raise the suite's errors too (tasks.lm.sample's: one line, not argparse's usage)
        args = parser.parse_intermixed_args(argv) if intermixed else parser.parse_args(argv)
        status = handler(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return INTERRUPTED
    except Exception as error:
        line = error_line(error, expected, named)
        if line is None:
            raise
        print(line, file=sys.stderr)
        return USER_ERROR
    return 0 if status is None else status


def error_line(
    error: Exception, expected: tuple[type[BaseException], ...], named: tuple[type[BaseException], ...]
) -> str | None:
    """The one ``error:`` line for ``error``, or None where it is not the user's (a bug)."""
    cause = user_error(error)
    if cause is not None:
        return f"error: {message_of(cause)}"
    if isinstance(error, expected):
        return f"error: {message_of(error)}"
    if isinstance(error, named):
        lines = str(error).strip().splitlines()
        return f"error: {type(error).__name__}: {lines[0] if lines else ''}".rstrip()
    return None
