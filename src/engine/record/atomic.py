"""The suite's one way to put a file in place whole: after a crash, a reader finds the old content
or all of the new one, never half of it and never zeros.

The content goes into a temporary file beside the target (same folder, so the rename is one step
of one file system), named ``.<name>.<pid>.<random>.tmp`` so that two processes never share one
and a folder's reader (a glob for ``*.json``, a manifest that skips ``*.tmp``) passes it over.
The file is fsynced before it is renamed over the target (else a crash can leave the new name
holding zeros) and the folder after (else the rename itself can be lost); on any failure the
temporary file is removed and the target is left as it was.

:func:`write_text` and :func:`write_bytes` for content in memory; :func:`writing` for a writer
that streams into a handle (``torch.save``, a token cache); :func:`write_together` for a set of
files that must change together (a report's files: all of them on disk before any is renamed).
Appended logs (``metrics.jsonl``) are
not written this way: they grow a line at a time and their reader drops a torn last line.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import BinaryIO


def temporary_name(path: Path) -> Path:
    """A fresh hidden name beside ``path`` ending in ``.tmp``, unique to this process and call."""
    hidden = path.name if path.name.startswith(".") else f".{path.name}"
    return path.with_name(f"{hidden}.{os.getpid()}.{secrets.token_hex(6)}.tmp")


@contextlib.contextmanager
def writing(path: Path, before_replace: Callable[[], None] | None = None) -> Iterator[BinaryIO]:
    """A binary handle whose content replaces ``path`` whole when the block ends without error.

    ``before_replace`` runs once the new content is on disk, just before the rename (a checkpoint
    sets its predecessor aside there). An error in the block or in the writing leaves ``path``
    untouched and no temporary file."""
    path = Path(path)
    tmp = temporary_name(path)
    try:
        with open(tmp, "xb") as handle:
            yield handle
            synced(handle)
        if before_replace is not None:
            before_replace()
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_folder(path.parent)


def write_bytes(path: Path, data: bytes) -> None:
    """``data`` put at ``path`` whole (see the module docstring)."""
    with writing(path) as handle:
        handle.write(data)


def write_text(path: Path, text: str, encoding: str = "utf-8") -> None:
    """``text`` put at ``path`` whole, encoded (no newline translation: ``\\n`` stays ``\\n``)."""
    write_bytes(path, text.encode(encoding))


def write_together(files: Mapping[Path, bytes]) -> None:
    """Every file of ``files`` whole, or (an error before the renames) none of them changed: each
    written and fsynced under its temporary name, then, all of them on disk, each renamed into
    place and their folders fsynced. A target that is a folder is refused before anything is
    written. An :class:`OSError` names the target it concerns (its ``filename``), never the
    temporary file; only a rename failing midway (the folder vanishing) leaves some renamed."""
    staged = [(temporary_name(Path(path)), Path(path)) for path in files]
    for _, path in staged:
        if path.is_dir():  # the one rename that would fail for sure: before any is written
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
    try:
        for (tmp, path), data in zip(staged, files.values(), strict=True):
            with naming(path), open(tmp, "xb") as handle:
                handle.write(data)
                synced(handle)
        for tmp, path in staged:
            with naming(path):
                os.replace(tmp, path)
    finally:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)
    for folder in {path.parent for _, path in staged}:
        fsync_folder(folder)


def synced(handle: BinaryIO) -> None:
    """What was written to ``handle`` flushed and on its disk (before a rename may show it)."""
    handle.flush()
    os.fsync(handle.fileno())


@contextlib.contextmanager
def naming(path: Path) -> Iterator[None]:
    """An :class:`OSError` of the block raised again naming ``path`` (same errno and subclass)."""
    try:
        yield
    except OSError as error:
        raise OSError(error.errno, error.strerror or str(error), str(path)) from error


def fsync_folder(folder: Path) -> None:
    """The folder's entries (a rename into it) made durable; a no-op where the system refuses."""
    with contextlib.suppress(OSError):
        handle = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(handle)
        finally:
            os.close(handle)
