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

**Generated data carries its own checksums.** Beside the marker lies its *manifest*
(``<marker stem>.manifest.json``, :func:`manifest_path`), written when the data is made, before the
marker: each file's size, row count (lines of a text file, items of a token array) and SHA-256, and
for a file too large to re-hash at every use the BLAKE2 digest of each of its 1 MiB blocks; and the
``hash`` of all of that, the data's content hash. Every file is fsynced before the manifest, and the
manifest before the marker, each written whole (:mod:`src.engine.record.atomic`: a temporary name,
fsynced, renamed, the folder fsynced): after a crash the marker is never there without its data.
A file written through :func:`hashed_output` (the token caches, which can be GBs) is hashed as it
is written, never read back. Each use checks the files against the manifest (:func:`check_files`,
at most once per process while their inode, size and times stay the same): a file up to
:data:`FULL_CHECK_BYTES` is hashed whole, a larger one in :data:`SAMPLED_BLOCKS` blocks drawn at
random (the first and last included) unless ``VERIFY_DATA=full`` is set. A file that differs (a
zero-filled token cache at its own size, a TSV cut to 10 of its 40 rows) is damaged: the data is
generated again, with a warning naming the file, as for any other damage. A marker without a
manifest (data made before manifests existed) is generated again once, to record one.

**The content hash is part of the run's identity.** :func:`reading` collects, for every
artefact handed out in its block, ``{artefact: content hash}`` (the artefact named by its marker's
path below the data folder); the run (:func:`src.engine.experiment.train`) makes or checks its data
in such a block before it opens its record, and the identity holds what it read
(:mod:`src.engine.record.identity`), so that runs on other data never resume one another's record
nor pool in the report. Data that is the user's own (no marker) is hashed whole at each use (no
manifest is written into the user's folder): it is in the identity the same way, and a record made
on other files refuses to resume (the identity's one-line mismatch, naming the artefact).

Preparing ahead (:func:`preparing`, what ``python -m launch.cluster.prepare`` and the SLURM sweep's check
use): inside the block every call notes what it found or made (an :class:`Artefact`: built, already
there, or the user's own), says when it starts to build and how far a long build is; with
``check=True`` it builds nothing and raises :class:`NotPrepared` for the first data that is not
there (or not of its spec). Outside the block (a run) it behaves as above and notes nothing.
"""

from __future__ import annotations

import contextlib
import contextvars
import fcntl
import hashlib
import json
import logging
import os
import random
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from src.engine.record import atomic
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
    """Make sure the data that ``marker`` describes was generated with ``spec`` and is intact;
    returns the marker's content (``spec`` and what ``generate`` reported).

    Args:
        marker: the JSON file that says the data is complete and what it was made from.
        spec: what the data is generated from (JSON values); keys of the marker beyond the spec's
            are what the generator reported, not compared.
        generate: writes the data; returns facts for the marker (e.g. ``{"tokens": n}``) or None.
        damage: why data generated with ``spec`` is unusable after all (a file of the wrong
            size), or None; damaged data is generated again. The manifest's check
            (:func:`check_files`) comes after it.
        lock: the lock file (default: the marker's name with ``.lock``).
        present: whether the data is there. Data that is there without a marker was not made
            by this function (the user's own files, e.g. LRA's released ListOps): it is used as
            it is, never overwritten (returns ``{}``); its files are hashed for the identity.
        what: what is generated, for the one line the generating process logs
            (``generated ListOps (96,000 train / 2,000 val / 2,000 test) in data/lra/listops in
            3.1 s``); default: the marker's folder name. Nothing is logged when the data is there.
        outputs: the files and folders the data is (its manifest lists every file in them; named,
            with their size, in :func:`preparing`'s report); default: the marker's folder.
    """
    wanted = json.loads(json.dumps(dict(spec)))  # tuples as lists, as the marker holds them
    what = what or marker.parent.name
    note = _SESSION.get() or _Unnoted()
    owned = tuple(outputs) or (marker.parent,)
    found = _usable(marker, wanted, damage, warn=False)
    if found is not None:
        return _ready(note, what, marker, owned, found)
    if note.check:  # a check builds nothing: what is missing, and why
        if read_marker(marker) is None and present():
            return _users_own(note, what, marker, owned)
        raise NotPrepared(what, marker.parent, _why_unusable(marker, wanted, damage))
    marker.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(lock or marker.with_suffix(".lock")):
        found = _usable(marker, wanted, damage, warn=True)
        if found is not None:  # another process generated it while this one waited
            return _ready(note, what, marker, owned, found)
        if read_marker(marker) is None and present():
            return _users_own(note, what, marker, owned)
        return _build(note, what, marker, owned, wanted, generate)


def _ready(
    note: Any, what: str, marker: Path, owned: tuple[Path, ...], found: dict[str, Any]
) -> dict[str, Any]:
    """Data generated earlier with the same spec, intact: noted as ready, with its manifest's hash."""
    note.add(Artefact(what, marker, "ready", owned))
    _note_read(marker, _VERIFIED[_key(marker)][1])
    return found


def _users_own(note: Any, what: str, marker: Path, owned: tuple[Path, ...]) -> dict[str, Any]:
    """Data that is there without a marker (the user's own files): used as it is, hashed whole."""
    note.add(Artefact(what, marker, "found", owned))
    _note_read(marker, _users_hash(marker, owned))
    return {}


def _build(
    note: Any,
    what: str,
    marker: Path,
    owned: tuple[Path, ...],
    wanted: dict[str, Any],
    generate: Callable[[], Mapping[str, Any] | None],
) -> dict[str, Any]:
    """The data generated, under the caller's lock: the old marker and manifest removed first (a
    reader never takes what follows for complete), every file written and fsynced, then the
    manifest, then the marker; returns the marker's content."""
    marker.unlink(missing_ok=True)
    manifest_path(marker).unlink(missing_ok=True)
    _VERIFIED.pop(_key(marker), None)
    note.say(f"building {what} in {marker.parent} ...")
    _PROGRESS["last"] = time.monotonic()
    start = time.perf_counter()
    written: dict[Path, dict[str, Any]] = {}
    token = _WRITTEN.set(written)
    try:
        facts = generate() or {}
    finally:
        _WRITTEN.reset(token)
    manifest = make_manifest(marker, owned, written)  # every file fsynced, hashed
    seconds = time.perf_counter() - start
    line = generated_line(what, marker.parent, seconds, facts)
    log.info(line)
    note.say(line)
    saved = {**wanted, **facts}
    atomic.write_text(manifest_path(marker), json.dumps(manifest, indent=1))
    atomic.write_text(marker, json.dumps(saved, indent=1))
    _VERIFIED[_key(marker)] = (_signature(marker, manifest), manifest["hash"])
    note.add(Artefact(what, marker, "built", owned, seconds))
    _note_read(marker, manifest["hash"])
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
    return str(damage(saved) or _damaged(marker))


def _usable(marker: Path, wanted: dict[str, Any], damage, warn: bool) -> dict[str, Any] | None:
    """The marker's content when it holds ``wanted`` and the data is intact (the caller's
    ``damage`` and the manifest's check agree); else None (with a warning, when ``warn``, saying what
    is regenerated and why)."""
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
    reason = damage(saved) or _damaged(marker)
    if reason is not None:
        if warn:
            warnings.warn(f"{marker}: {reason}; generating again", stacklevel=4)
        return None
    return saved


# -- the manifest: what the data is, written when it is made, checked when it is used ----------------

#: Blocks of a large file are hashed one by one, so that a use can check some of them.
BLOCK_BYTES = 1 << 20
#: [reading] Files up to this size are hashed whole at each use (SHA-256 reads about 1 GB/s on one
#: core: a quarter of a second at most); larger ones (token caches of GBs) in sampled blocks. The
#: suite's choice, not a source's: the cost of a run's start against the chance of missing damage.
FULL_CHECK_BYTES = 256 << 20
#: [reading] Blocks checked in a large file at each use (32 MiB read), the first and last among them:
#: damage that spans the file (zeros, another file's content, a cut) is found at once; damage confined
#: to a few blocks of a large file is found with probability about 32/blocks per use, and always with
#: ``VERIFY_DATA=full`` (every file hashed whole) or a run that regenerates the file.
SAMPLED_BLOCKS = 32
#: Files whose rows are their lines (a TSV, a vocabulary): the manifest counts them.
TEXT_SUFFIXES = (".tsv", ".txt", ".csv", ".jsonl")
SKIPPED_SUFFIXES = (".lock", ".tmp", ".partial")  # in a folder of outputs: never the data


def manifest_path(marker: Path) -> Path:
    """The manifest beside ``marker``: ``generator.json`` -> ``generator.manifest.json``."""
    return marker.with_name(f"{marker.stem}.manifest.json")


class Digest:
    """A file's size, SHA-256, rows and (kept for files over :data:`FULL_CHECK_BYTES`) the BLAKE2
    digests of its :data:`BLOCK_BYTES` blocks, fed in pieces of any size as the file is read or
    written."""

    def __init__(self, text: bool = False, itemsize: int | None = None) -> None:
        self.text, self.itemsize = text, itemsize
        self.sha, self.size, self.lines, self.last = hashlib.sha256(), 0, 0, b"\n"
        self.blocks: list[str] = []
        self._pending = bytearray()

    def update(self, data: bytes | memoryview) -> None:
        data = memoryview(data).cast("B")
        if not len(data):
            return
        self.sha.update(data)
        self.size += len(data)
        if self.text:
            self.lines += bytes(data).count(b"\n")
            self.last = bytes(data[-1:])
        self._pending += data
        if len(self._pending) >= BLOCK_BYTES:
            whole = len(self._pending) // BLOCK_BYTES * BLOCK_BYTES
            for start in range(0, whole, BLOCK_BYTES):
                self.blocks.append(_block_digest(bytes(self._pending[start : start + BLOCK_BYTES])))
            del self._pending[:whole]

    def entry(self) -> dict[str, Any]:
        """What the manifest says of the file."""
        blocks = self.blocks + ([_block_digest(self._pending)] if self._pending else [])
        entry: dict[str, Any] = {"bytes": self.size, "sha256": self.sha.hexdigest()}
        rows = self.rows()
        if rows is not None:
            entry["rows"] = rows
        if self.size > FULL_CHECK_BYTES:
            entry["blocks"] = blocks
        return entry

    def rows(self) -> int | None:
        if self.text:
            return self.lines + (self.last != b"\n")  # a last line without its newline counts
        return self.size // self.itemsize if self.itemsize else None


def _block_digest(block) -> str:
    return hashlib.blake2b(block, digest_size=8).hexdigest()


def digest_file(path: Path, itemsize: int | None = None) -> dict[str, Any]:
    """The manifest's entry of ``path``, read in blocks."""
    digest = Digest(text=path.suffix in TEXT_SUFFIXES, itemsize=itemsize)
    with open(path, "rb") as handle:
        while block := handle.read(BLOCK_BYTES):
            digest.update(block)
    return digest.entry()


class HashedFile:
    """A binary file being written whose digest grows with it (:func:`hashed_output`)."""

    def __init__(self, handle, digest: Digest) -> None:
        self.handle, self.digest = handle, digest

    def write(self, data) -> None:
        self.handle.write(data)
        self.digest.update(data)


@contextlib.contextmanager
def hashed_output(path: Path, itemsize: int | None = None) -> Iterator[HashedFile]:
    """Write ``path`` through the block (``out.write(bytes)``), hashed as it is written: under a
    temporary name, fsynced, then renamed into place (a crash leaves no half-file under ``path``).
    Inside a generation (:func:`ensure_generated`'s ``generate``) the manifest takes this digest
    instead of reading the file back; ``itemsize``: the bytes of one row (a token array's item)."""
    out = HashedFile(None, Digest(text=path.suffix in TEXT_SUFFIXES, itemsize=itemsize))
    with atomic.writing(path) as handle:
        out.handle = handle
        yield out
    written = _WRITTEN.get()
    if written is not None:
        stat = path.stat()
        written[path.absolute()] = {**out.digest.entry(), "_stat": (stat.st_ino, stat.st_mtime_ns)}


def _files(marker: Path, owned: Iterable[Path]) -> list[Path]:
    """The files of ``owned`` (a folder: every file below it), the marker, its manifest, locks and
    temporary files aside; sorted."""
    skipped = {marker.absolute(), manifest_path(marker).absolute()}
    found: set[Path] = set()
    for path in owned:
        below = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        below = [p for p in below if p.is_file()]  # an output the generator did not make: not listed
        found |= {p.absolute() for p in below if not p.name.endswith(SKIPPED_SUFFIXES)}
    return sorted(found - skipped)


def _name(marker: Path, path: Path) -> str:
    """``path`` as the manifest names it: relative to the marker's folder where it lies below it."""
    folder = marker.parent.absolute()
    return str(path.relative_to(folder)) if path.is_relative_to(folder) else str(path)


def _content_hash(files: Mapping[str, Mapping[str, Any]]) -> str:
    """The data's content hash: the files' names, sizes and SHA-256s, hashed (16 hex digits)."""
    plain = {name: [entry["bytes"], entry["sha256"]] for name, entry in sorted(files.items())}
    return hashlib.sha256(json.dumps(plain, separators=(",", ":")).encode()).hexdigest()[:16]


def make_manifest(marker: Path, owned: Iterable[Path], written: Mapping[Path, dict[str, Any]]) -> dict:
    """The manifest of the files just generated: each one fsynced (before the marker that says the
    data is complete), hashed (or its digest as :func:`hashed_output` computed it while writing)."""
    files: dict[str, Any] = {}
    folders: set[Path] = set()
    for path in _files(marker, owned):
        entry = dict(written.get(path) or {})
        stat = path.stat()
        if entry.pop("_stat", None) != (stat.st_ino, stat.st_mtime_ns):  # not written, or rewritten since
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())
            entry = digest_file(path)
        files[_name(marker, path)] = entry
        folders.add(path.parent)
    for folder in folders:
        atomic.fsync_folder(folder)
    return {"files": files, "hash": _content_hash(files)}


def read_manifest(marker: Path) -> dict[str, Any] | None:
    """The manifest beside ``marker``, or None when it is missing, unreadable or not one."""
    try:
        manifest = json.loads(manifest_path(marker).read_text())
    except (OSError, ValueError):
        return None
    ok = isinstance(manifest, dict) and isinstance(manifest.get("files"), dict) and "hash" in manifest
    return manifest if ok else None


def check_files(marker: Path, manifest: Mapping[str, Any], full: bool | None = None) -> str | None:
    """Why the files differ from what ``manifest`` says was written (the first that does), or None.
    Sizes first; then contents: whole for files up to :data:`FULL_CHECK_BYTES` (and every file when
    ``full``, default: ``VERIFY_DATA=full`` in the environment), else :data:`SAMPLED_BLOCKS` blocks."""
    full = os.environ.get("VERIFY_DATA", "").lower() == "full" if full is None else full
    folder = marker.parent
    for name, entry in manifest["files"].items():
        path = folder / name
        try:
            size = path.stat().st_size if path.is_file() else None
        except OSError:
            size = None
        if size is None:
            return f"{path} is missing"
        rows = entry.get("rows")
        if size != entry["bytes"] or full or "blocks" not in entry:
            if size != entry["bytes"] and size > FULL_CHECK_BYTES:
                return f"{path} is damaged: {size:,} bytes where {entry['bytes']:,} were written"
            now = digest_file(path, _itemsize(entry))
            if now["sha256"] != entry["sha256"]:
                said = (
                    f"{size:,} bytes where {entry['bytes']:,} were written"
                    if size != entry["bytes"]
                    else (
                        f"its content is not what was written ({entry['bytes']:,} bytes, sha256 "
                        f"{entry['sha256'][:12]}…, now {now['sha256'][:12]}…)"
                    )
                )
                if rows is not None and now.get("rows") != rows:
                    said += f"; {now.get('rows'):,} rows where {rows:,} were written"
                return f"{path} is damaged: {said}"
            continue
        blocks = entry["blocks"]
        drawn = {0, len(blocks) - 1} | set(_RNG.sample(range(len(blocks)), min(SAMPLED_BLOCKS, len(blocks))))
        with open(path, "rb") as handle:
            for index in sorted(drawn)[: SAMPLED_BLOCKS + 2]:
                handle.seek(index * BLOCK_BYTES)
                if _block_digest(handle.read(BLOCK_BYTES)) != blocks[index]:
                    where = f"bytes {index * BLOCK_BYTES:,} to {min(size, (index + 1) * BLOCK_BYTES):,}"
                    return f"{path} is damaged: its content is not what was written ({where} differ)"
    return None


def _itemsize(entry: Mapping[str, Any]) -> int | None:
    """The bytes of one row of a binary file the manifest counts rows of (a token array)."""
    rows = entry.get("rows")
    return entry["bytes"] // rows if rows and entry["bytes"] % rows == 0 else None


def _damaged(marker: Path) -> str | None:
    """Why the data of ``marker`` is not what its manifest says was written, or None (and its content
    hash kept, :data:`_VERIFIED`): checked once per process while the files' inodes, sizes and
    times stay the same (a file rewritten in place changes its ctime, which no one can set back)."""
    manifest = read_manifest(marker)
    if manifest is None:
        return (
            f"no checksums ({manifest_path(marker).name} is missing or unreadable: made before generated "
            "data carried its manifest, or cut short)"
        )
    signature = _signature(marker, manifest)
    known = _VERIFIED.get(_key(marker))
    if known is not None and known == (signature, manifest["hash"]):
        return None
    reason = check_files(marker, manifest)
    if reason is None:
        _VERIFIED[_key(marker)] = (signature, manifest["hash"])
    return reason


def _signature(marker: Path, manifest: Mapping[str, Any]) -> tuple:
    """The stat of the manifest and of every file it lists (None for one that is not there)."""
    paths = [manifest_path(marker), *(marker.parent / name for name in manifest["files"])]
    return tuple(_stat(path) for path in paths)


def _stat(path: Path) -> tuple | None:
    try:
        s = path.stat()
    except OSError:
        return None
    return (s.st_ino, s.st_dev, s.st_size, s.st_mtime_ns, s.st_ctime_ns)


def _key(marker: Path) -> Path:
    return marker.absolute()


def _users_hash(marker: Path, owned: Iterable[Path]) -> str:
    """The content hash of the user's own files (no marker, no manifest): hashed whole, once per
    process while they stay the same."""
    paths = _files(marker, owned)
    signature = tuple((_name(marker, p), _stat(p)) for p in paths)
    known = _USERS.get(_key(marker))
    if known is not None and known[0] == signature:
        return known[1]
    digest = _content_hash({_name(marker, p): digest_file(p) for p in paths})
    _USERS[_key(marker)] = (signature, digest)
    return digest


# -- what a run reads: the content hashes its identity holds -----------------------------------------


@contextlib.contextmanager
def reading(data_dir: Path) -> Iterator[dict[str, str]]:
    """Collect ``{artefact: content hash}`` for every artefact :func:`ensure_generated` hands out in
    the block (made, found ready, or the user's own), the artefact named by :func:`artefact_name`."""
    read: dict[str, str] = {}
    token = _READING.set((Path(data_dir), read))
    try:
        yield read
    finally:
        _READING.reset(token)


def artefact_name(marker: Path, data_dir: Path) -> str:
    """The artefact as a run's identity names it: its marker's path below ``data_dir`` (absolute
    where it lies elsewhere), without the ``.json``, dots as underscores (the identity's keys are
    dotted paths): ``lra/listops_small/generator``, ``cache/lm/wikitext103/bytes-utf8/validation``."""
    path, root = marker.absolute().with_suffix(""), Path(os.path.abspath(data_dir))
    name = str(path.relative_to(root)) if path.is_relative_to(root) else str(path)
    return name.replace(".", "_")


def _note_read(marker: Path, digest: str) -> None:
    session = _READING.get()
    if session is not None:
        data_dir, read = session
        read[artefact_name(marker, data_dir)] = digest


_WRITTEN: contextvars.ContextVar[dict[Path, dict[str, Any]] | None] = contextvars.ContextVar(
    "written", default=None
)
_READING: contextvars.ContextVar[tuple[Path, dict[str, str]] | None] = contextvars.ContextVar(
    "reading", default=None
)
#: marker -> (signature of its files, content hash): checked in this process, unchanged since
_VERIFIED: dict[Path, tuple[tuple, str]] = {}
_USERS: dict[Path, tuple[tuple, str]] = {}  # the same for the user's own files (no marker)
_RNG = random.SystemRandom()  # the blocks a check draws: never the run's seeded random state


# -- preparing ahead: what launch.cluster.prepare and the SLURM sweep's check see --------------------------


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
