"""Reading a file someone else may have made: regular files only, within a size, streamed.

The report, ``src.eval`` and the seed-set readers read folders received from others, so a file
they read may be anything a file name can stand for. :func:`open_file` opens one only when it is
a regular file: never a FIFO (whose open waits for a writer: the reader would hang for ever), a
device (``/dev/zero`` never ends: the reader would fill the memory), a socket or a folder; and,
given ``within``, never a link to a file outside that folder (a record's files are its own). With
a limit, a file larger than it is refused, the limit and what to do said in the one-line error
(:class:`RefusedFile`); :func:`read_bytes` reads one whole, :func:`lines` streams one line by line,
each line within its own limit.

The check is made on the name (``stat``, which opens nothing: some devices act when opened) and
again on what was opened (``fstat``): a file swapped between the two is refused too. The open
itself never blocks (``O_NONBLOCK``, harmless on a regular file).

:data:`LIMITS` are the limits of the record files by name. [reading] Each is far above what the
suite writes and far below what swamps a machine: a 300-epoch ImageNet run logs about 40,000
rows, some 10 MB of ``metrics.jsonl`` (a train row every 10 steps, ~100 bytes; a monitor row every
100, ~1 KB); a config or an identity is ~10 KB, a summary a few KB (plus ~300 bytes per session); a
seed set of 1,024 seeds × 1,000 epochs is ~40 MB of ``curves.json``. The limits are this
module's judgement, not a paper's.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from src.errors import SuiteError

MB = 2**20

#: The most each file may hold, in bytes, by its name (``eval-*.json`` as ``eval.json``).
LIMITS = {
    "metrics.jsonl": 128 * MB,
    "failures.jsonl": 16 * MB,
    "summary.json": 16 * MB,
    "identity.json": 4 * MB,
    "config.yaml": 4 * MB,  # the record's and Hydra's
    "hydra.yaml": 4 * MB,
    "overrides.yaml": 1 * MB,
    "eval.json": 4 * MB,
    "curves.json": 128 * MB,
    "memory.json": 16 * MB,
    "settle.json": 16 * MB,
}
LINE_LIMIT = 1 * MB  # the longest line of a ``.jsonl`` file: a row is ~1 KB
ROW_LIMIT = 2_000_000  # the most rows the report reads of one metrics.jsonl (~50× a long run's)


class RefusedFile(SuiteError, ValueError):
    """A file a bounded reader will not read: its message names it, says what it is and what to do.
    A ValueError too, so that a reader's ``except ValueError`` for damaged content covers it."""


def limit_of(path: Path) -> int:
    """:data:`LIMITS`' entry for ``path``'s name (``eval-<split>….json`` as ``eval.json``)."""
    name = Path(path).name
    if name.startswith("eval-") and name.endswith(".json"):
        name = "eval.json"
    return LIMITS[name]


def kind_of(mode: int) -> str:
    """What a file that is not a regular one is, in words."""
    kinds = (
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISDIR, "a folder"),
    )
    return next((words for test, words in kinds if test(mode)), "not a regular file")


def size_words(size: int) -> str:
    return f"{size / MB:.1f} MB" if size >= MB else f"{size:,} bytes"


def too_large(path: Path, size: int | str, limit: int) -> RefusedFile:
    shown = size if isinstance(size, str) else size_words(size)
    return RefusedFile(
        f"{path} holds {shown}, more than the {size_words(limit)} a {Path(path).name} may hold to be "
        "read (src/engine/record/bounded.py): not a file the suite wrote; move it aside"
    )


def check_within(path: Path, within: Path) -> None:
    """A :class:`RefusedFile` where ``path`` resolves (through its links) outside ``within``."""
    real, base = Path(os.path.realpath(path)), Path(os.path.realpath(within))
    if real != base and base not in real.parents:
        raise RefusedFile(
            f"{path} links out of its folder (to {real}): a record's files are its own; not read"
        )


def open_file(path: Path, limit: int | None = None, within: Path | None = None) -> BinaryIO:
    """``path`` opened for reading in binary, once it is a regular file (inside ``within`` where
    given, at most ``limit`` bytes where given); a :class:`RefusedFile` saying why not, or why it
    cannot be opened."""
    path = Path(path)
    if within is not None:
        check_within(path, within)
    try:
        before = os.stat(path)
    except OSError as error:
        raise RefusedFile(f"cannot read {path} ({error.strerror or error})") from error
    if not stat.S_ISREG(before.st_mode):
        raise RefusedFile(
            f"{path} is {kind_of(before.st_mode)}, not a regular file: a record holds regular files "
            "only, and this one is not read; move it aside"
        )
    if limit is not None and before.st_size > limit:
        raise too_large(path, before.st_size, limit)
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as error:
        raise RefusedFile(f"cannot read {path} ({error.strerror or error})") from error
    after = os.fstat(fd)
    if not stat.S_ISREG(after.st_mode) or (after.st_dev, after.st_ino) != (before.st_dev, before.st_ino):
        os.close(fd)
        raise RefusedFile(f"{path} was replaced while it was opened; not read: run the command again")
    return os.fdopen(fd, "rb")


def read_bytes(path: Path, limit: int | None = None, within: Path | None = None) -> bytes:
    """``path``'s content (:func:`open_file`'s checks; ``limit``: :func:`limit_of` its name where
    None); a file that grew past ``limit`` while it was read is refused too."""
    limit = limit_of(path) if limit is None else limit
    with open_file(path, limit, within) as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise too_large(path, "more than that (it grew while it was read)", limit)
    return data


def lines(
    path: Path, limit: int | None = None, within: Path | None = None, line_limit: int = LINE_LIMIT
) -> Iterator[tuple[int, str]]:
    """``(number, line)`` of ``path``, streamed (the file is never held whole), each line decoded
    as UTF-8 (bad bytes replaced) without its newline; a :class:`RefusedFile` where a line is
    longer than ``line_limit`` bytes or the lines add up to more than ``limit`` (no limit: None)."""
    with open_file(path, limit, within) as f:
        read, number = 0, 0
        while True:
            line = f.readline(line_limit + 1)
            if not line:
                return
            number += 1
            read += len(line)
            if len(line) > line_limit and not line.endswith(b"\n"):
                raise RefusedFile(
                    f"{path}:{number} is a line of more than {size_words(line_limit)}: not a line the suite "
                    "wrote; move the file aside"
                )
            if limit is not None and read > limit:
                raise too_large(path, "more than that (it grew while it was read)", limit)
            yield number, line.decode("utf-8", errors="replace").rstrip("\r\n")
