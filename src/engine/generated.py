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
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

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
    """
    wanted = json.loads(json.dumps(dict(spec)))  # tuples as lists, as the marker holds them
    found = _usable(marker, wanted, damage, warn=False)
    if found is not None:
        return found
    marker.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(lock or marker.with_suffix(".lock")):
        found = _usable(marker, wanted, damage, warn=True)
        if found is not None:  # another process generated it while this one waited
            return found
        if read_marker(marker) is None and present():
            return {}
        marker.unlink(missing_ok=True)
        start = time.perf_counter()
        facts = generate() or {}
        seconds = time.perf_counter() - start
        log.info(generated_line(what or marker.parent.name, marker.parent, seconds, facts))
        saved = {**wanted, **facts}
        tmp = marker.with_name(f"{marker.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(saved, indent=1))
        tmp.replace(marker)
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
