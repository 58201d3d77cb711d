"""Data generated on first use, once however many processes ask, and again when its spec changes.

The generated sets (ListOps for the LRA default, COCO shapes for detection's) and the token
caches of the language-modelling tasks all go through :func:`ensure_generated`, with one rule:

    **a changed spec regenerates.** Beside the data lies a *marker*, a JSON file written last,
    holding the spec the data was generated from (and what the generator reported, e.g. a
    token count). When the marker holds the spec asked for, and the files pass the caller's
    check, the data is used as it is; otherwise (no marker, another spec, damaged files) it is
    generated again, with a warning naming the spec it replaces. Data that is there without a
    marker was not generated here (the user's own files): it is used as it is, never overwritten.

Why regenerate rather than refuse: generated data is a function of its spec alone (the
generators are seeded by it, the token caches are made from files the spec fingerprints),
and every run's ``config.yaml`` holds the spec it used, so regenerating loses nothing that
cannot be made again exactly; refusing would make the user delete a folder by hand whenever a
config changes, and a token cache must follow the files it was made from anyway. Two runs
that want different specs in one folder at the same time regenerate it in turn: give them
their own folders (``task.folder``, ``task.cache_dir``).

Concurrency: the marker is read first without a lock (the common case: present and the
same). Otherwise the caller takes an exclusive ``flock`` on a lock file beside the marker (the
kernel's, so it vanishes with a killed process), reads the marker again (another process may
have generated the data meanwhile: then it is read, not made twice), removes it (a reader
without the lock never takes half-written data for complete), generates, and writes the
marker (a temporary file, then a rename). The processes of a DDP run and the runs of a
multirun thus wait for one of them, then read what it made.

Preparing ahead (:func:`preparing`, what ``python -m launch.prepare`` and the SLURM sweep's check
use): inside the block every call notes what it found or made (an :class:`Artefact`: built, already
there, or the user's own), says when it starts to build and how far a long build is; with
``check=True`` it builds nothing and raises :class:`NotPrepared` for the first data that is not
there (or not of its spec). Outside the block (a run) it behaves as above and notes nothing.
"""

from __future__ import annotations

import contextlib
import contextvars
import fcntl
import json
import logging
import os
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from src.errors import DataError

log = logging.getLogger(__name__)


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``path`` for the block (blocks until it is free)."""
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def ensure_generated(
    marker: Path,
    spec: Mapping[str, Any],
    generate: Callable[[], Mapping[str, Any] | None],
    damage: Callable[[dict[str, Any]], str | None] = lambda saved: None,
    lock: Path | None = None,
    present: Callable[[], bool] = lambda: False,
    what: str | None = None,
    outputs: Sequence[Path] = (),
) -> dict[str, Any]:
    """Make sure the data that ``marker`` describes was generated with ``spec``; returns the marker's
    content (``spec`` and what ``generate`` reported).

    Args:
        marker: the JSON file that says the data is complete and what it was made from.
        spec: what the data is generated from (JSON values); keys of the marker beyond the spec's
            are what the generator reported, not compared.
        generate: writes the data; returns facts for the marker (e.g. ``{"tokens": n}``) or None.
        damage: why data generated with ``spec`` is unusable after all (a file of the wrong
            size), or None; damaged data is generated again.
        lock: the lock file (default: the marker's name with ``.lock``).
        present: whether the data is there. Data that is there without a marker was not made
            by this function (the user's own files, e.g. LRA's released ListOps): it is used as
            it is, never overwritten (returns ``{}``).
        what: what is generated, for the one line the generating process logs
            (``generated ListOps (96,000 train / 2,000 val / 2,000 test) in data/lra/listops in
            3.1 s``); default: the marker's folder name. Nothing is logged when the data is there.
        outputs: the files and folders the data is (named, with their size, in :func:`preparing`'s
            report); default: the marker's folder.
    """
    wanted = json.loads(json.dumps(dict(spec)))  # tuples as lists, as the marker holds them
    what = what or marker.parent.name
    note = _SESSION.get() or _Unnoted()
    owned = tuple(outputs) or (marker.parent,)
    found = _usable(marker, wanted, damage, warn=False)
    if found is not None:
        note.add(Artefact(what, marker, "ready", owned))
        return found
    if note.check:  # a check builds nothing: what is missing, and why
        if read_marker(marker) is None and present():
            note.add(Artefact(what, marker, "found", owned))
            return {}
        raise NotPrepared(what, marker.parent, _why_unusable(marker, wanted, damage))
    marker.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(lock or marker.with_suffix(".lock")):
        found = _usable(marker, wanted, damage, warn=True)
        if found is not None:  # another process generated it while this one waited
            note.add(Artefact(what, marker, "ready", owned))
            return found
        if read_marker(marker) is None and present():
            note.add(Artefact(what, marker, "found", owned))
            return {}
        marker.unlink(missing_ok=True)
        note.say(f"building {what} in {marker.parent} ...")
        _PROGRESS["last"] = time.monotonic()
        start = time.perf_counter()
        facts = generate() or {}
        seconds = time.perf_counter() - start
        line = generated_line(what, marker.parent, seconds, facts)
        log.info(line)
        note.say(line)
        saved = {**wanted, **facts}
        tmp = marker.with_name(f"{marker.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(saved, indent=1))
        tmp.replace(marker)
        note.add(Artefact(what, marker, "built", owned, seconds))
        return saved


def generated_line(what: str, folder: Path, seconds: float, facts: Mapping[str, Any] | None = None) -> str:
    """``generated <what> in <folder> in 3.1 s`` (with what the generator reported, e.g.
    ``(tokens=1,204,311)``): the one line said when data is made on first use."""
    said = ", ".join(f"{k}={v:,}" if isinstance(v, int) else f"{k}={v}" for k, v in (facts or {}).items())
    return f"generated {what} in {folder} in {seconds:.1f} s" + (f" ({said})" if said else "")


def read_marker(marker: Path) -> dict[str, Any] | None:
    """The marker's content, or None when it is missing or unreadable."""
    try:
        saved = json.loads(marker.read_text())
    except (OSError, ValueError):
        return None
    return saved if isinstance(saved, dict) else None


def _why_unusable(marker: Path, wanted: dict[str, Any], damage) -> str:
    """Why the data of ``marker`` is not the data of ``wanted`` (it is not, :func:`_usable` said)."""
    saved = read_marker(marker)
    if saved is None:
        return "not built yet"
    changed = sorted(k for k in wanted if saved.get(k) != wanted[k])
    if changed:
        return f"built from another {', '.join(changed)}"
    return str(damage(saved))


def _usable(marker: Path, wanted: dict[str, Any], damage, warn: bool) -> dict[str, Any] | None:
    """The marker's content when it holds ``wanted`` and the data is intact; else None (with a
    warning, when ``warn``, saying what is regenerated and why)."""
    saved = read_marker(marker)
    if saved is None:
        return None
    if {k: saved.get(k) for k in wanted} != wanted:
        if warn:
            before = {k: saved.get(k) for k in wanted if saved.get(k) != wanted[k]}
            after = {k: wanted[k] for k in before}
            message = f"{marker}: generated with {before}, now {after}: generating again"
            warnings.warn(message, stacklevel=4)
        return None
    reason = damage(saved)
    if reason is not None:
        if warn:
            warnings.warn(f"{marker}: {reason}; generating again", stacklevel=4)
        return None
    return saved


# -- preparing ahead: what launch.prepare and the SLURM sweep's check see --------------------------


class NotPrepared(DataError):
    """Data that a check (:func:`preparing` with ``check=True``) found missing, or not of its spec."""

    def __init__(self, what: str, folder: Path, why: str) -> None:
        super().__init__(f"{what} in {folder}: {why}")
        self.what, self.folder, self.why = what, folder, why


class Artefact(NamedTuple):
    """One piece of prepared data as :func:`ensure_generated` left it: ``built`` (made now),
    ``ready`` (there already, of the spec asked for) or ``found`` (there without a marker: the
    user's own files, used as they are)."""

    what: str
    marker: Path
    state: str
    outputs: tuple[Path, ...]  # its files and folders (the first is the one to name)
    seconds: float | None = None

    def size(self) -> int:
        """Bytes of its files (a folder's, all below it)."""
        total = 0
        for path in self.outputs:
            if path.is_file():
                total += path.stat().st_size
            elif path.is_dir():
                total += sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
        return total


class Preparation:
    """What a :func:`preparing` block saw, one :class:`Artefact` per marker (the first state
    noted: a set built once and then read again stays ``built``). A plain class, as this module is
    also loaded on its own (by file, outside the package) where a dataclass cannot be."""

    def __init__(self, check: bool = False, say: Callable[[str], None] = print) -> None:
        self.check, self.say = check, say
        self.artefacts: dict[Path, Artefact] = {}

    def add(self, artefact: Artefact) -> None:
        self.artefacts.setdefault(artefact.marker.absolute(), artefact)


class _Unnoted:
    """Outside a :func:`preparing` block: nothing is noted or said (the log has the line)."""

    check = False

    def add(self, artefact: Artefact) -> None:
        pass

    def say(self, line: str) -> None:
        pass


_SESSION: contextvars.ContextVar[Preparation | None] = contextvars.ContextVar("preparing", default=None)


@contextlib.contextmanager
def preparing(check: bool = False, say: Callable[[str], None] = print) -> Iterator[Preparation]:
    """Note every :func:`ensure_generated` of the block (module docstring); ``say`` gets the
    progress lines; ``check``: build nothing, raise :class:`NotPrepared` at the first gap."""
    session = Preparation(check=check, say=say)
    token = _SESSION.set(session)
    try:
        yield session
    finally:
        _SESSION.reset(token)


def progress(line: str) -> None:
    """How far a long build is (``tokenised 120,000,000 tokens``), at most every 30 s from the
    build's start: said in a :func:`preparing` block, logged in a run."""
    now = time.monotonic()
    if now - _PROGRESS["last"] < PROGRESS_EVERY_S:
        return
    _PROGRESS["last"] = now
    session = _SESSION.get()
    if session is None:
        log.info(line)
    else:
        session.say(line)


def counted(items: Iterable[Any], what: str, every: int = 10_000) -> Iterator[Any]:
    """``items`` as they come, with a :func:`progress` line (``1,230,000 texts read``) as they are
    consumed: for a build that reads a long stream (a tokenizer's training)."""
    for n, item in enumerate(items, 1):
        if n % every == 0:
            progress(f"{n:,} {what}")
        yield item


PROGRESS_EVERY_S = 30.0
_PROGRESS = {"last": 0.0}  # when progress() last spoke, or the current build started
