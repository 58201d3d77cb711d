"""One training process per run folder: an exclusive lock on ``<run>/.lock``.

The lock is the kernel's (``flock``), so it vanishes with its process however that process
ends: a folder whose holder was killed (SIGKILL, a SLURM requeue, a node's reboot) is taken
over at once, and a PID reused by another program never looks like a holder. The file holds
the holder's host, PID, start time and SLURM job, so that a second process names it when it
refuses. Where the file system has no ``flock`` (some network mounts), the file alone decides:
it is taken over when its holder ran on this host and is gone, or belonged to this same SLURM
job (a requeue); otherwise the second process refuses and says which file to remove.

Without ``flock`` exactly one process still holds the file, however many race for it: the file
is created with its content already in it, by ``link``-ing a finished temporary file to
``.lock`` (which fails when ``.lock`` exists), and a stale one is replaced only by the process
that created its *claim* (``.lock.takeover-<that file>-<round>``, made the same way), which
checks under the claim that the file it judged stale is still there. A claim whose process died
(on this host; or older than :data:`CLAIM_ABANDONED_S`) is passed over to the next round.

Only the main process of a run takes the lock (DDP ranks write nothing to the record).

A command that writes an output folder of its own (a seed set, a joined set, a report) takes the
same lock on that folder (:class:`OutputLock`): a second command into the folder while the first
writes is refused in one line naming the first, instead of both overwriting each other's files.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import itertools
import json
import os
import socket
import time
import uuid
import zlib
from pathlib import Path
from typing import Any

from src.engine.record import atomic
from src.errors import SuiteError

LOCK_NAME = ".lock"
NO_FLOCK = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS)
NO_LINK = (errno.EPERM, errno.EOPNOTSUPP, errno.ENOSYS)
CLAIM_ABANDONED_S = 30.0  # a claim is held for milliseconds: one this old was left by a stalled process
EMPTY_GRACE_S = 2.0  # where link is missing, a file is written just after it is created
RETRY_S = 0.01

#: ``(inode, content)`` of the lock file as one process read it: what a takeover must find unchanged.
Seen = tuple[int, bytes]


class RunFolderBusy(SuiteError):
    """Another process trains in this run folder (or, :class:`OutputLock`, writes this output folder)."""


class RunLock:
    """``with RunLock(folder):`` holds ``folder/.lock`` for the block; see the module docstring."""

    def __init__(self, folder: Path) -> None:
        self.path = Path(folder) / LOCK_NAME
        self.fd: int | None = None
        self.content: bytes | None = None  # what this process wrote, while it holds a content-only lock

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            content = holder_bytes()
            try:
                created = create_with(self.path, content)  # never an empty file: see the module docstring
            except FileNotFoundError:  # the folder was removed meanwhile (an output lock's, left empty)
                self.path.parent.mkdir(parents=True, exist_ok=True)
                continue
            try:
                fd = os.open(self.path, os.O_RDWR)
            except FileNotFoundError:
                continue  # released between the two calls
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = read_holder(self.path)
                os.close(fd)
                raise RunFolderBusy(self.refusal(holder)) from None
            except OSError as error:  # no flock on this file system
                os.close(fd)
                if error.errno not in NO_FLOCK:
                    raise
                self._acquire_by_content(content if created else None)
                return
            if _same_file(fd, self.path):  # not a file a releasing holder has just unlinked
                break
            os.close(fd)
        self.fd = fd
        _write_holder(fd)

    def refusal(self, holder: dict[str, Any]) -> str:
        """The line that refuses a second process, naming ``holder``."""
        return busy_message(self.path.parent, holder)

    def release(self) -> None:
        if self.fd is None:
            seen = _seen(self.path) if self.content is not None else None
            if seen is not None and seen[1] == self.content:  # a live holder's file is never replaced
                self.path.unlink(missing_ok=True)
            self.content = None
            return
        try:
            if _same_file(self.fd, self.path):
                self.path.unlink()  # while still holding it: a waiter that opened it retries
        finally:
            os.close(self.fd)  # releases the flock
            self.fd = None

    def _acquire_by_content(self, created: bytes | None) -> None:
        """Hold the file by its content alone. ``created``: the content :meth:`acquire` has just
        linked into place (this process holds it), or None when the file was there before."""
        content = created
        while content is None:
            content = holder_bytes()
            if create_with(self.path, content):
                break
            seen = _seen(self.path)
            if seen is None:  # released meanwhile: create it again
                content = None
                continue
            holder = _parse(seen[1])
            if holder and not _stale(holder):
                raise RunFolderBusy(
                    self.refusal(holder)
                    + f" (this file system has no flock: if that process is gone, remove {self.path})"
                )
            if not (self._takeable(seen) and self._take_over(seen, content)):
                content = None
                time.sleep(RETRY_S)
        self.content = content

    def _takeable(self, seen: Seen) -> bool:
        """Whether a stale file may be replaced now: an empty one only once it is older than a
        file that is still being written can be (where the file system has no hard links)."""
        try:
            return bool(seen[1]) or time.time() - self.path.stat().st_mtime > EMPTY_GRACE_S
        except FileNotFoundError:
            return False

    def _take_over(self, seen: Seen, content: bytes) -> bool:
        """Replace the stale file ``seen`` by ``content``, under a claim on that file; False when
        another process holds the claim or the file is no longer ``seen``."""
        for round_ in itertools.count():
            claim = claim_path(self.path, seen, round_)
            if create_with(claim, holder_bytes()):
                break
            if not _abandoned(claim):
                return False
        try:
            if _seen(self.path) != seen:
                return False
            atomic.write_bytes(self.path, content)
            for other in self.path.parent.glob(claim_path(self.path, seen, "*").name):
                other.unlink(missing_ok=True)  # a later claim finds the file changed and backs off
            return True
        finally:
            claim.unlink(missing_ok=True)


class OutputLock(RunLock):
    """``with OutputLock(folder, "python -m src.sandbox.seeds"):`` holds ``folder/.lock`` while
    ``command`` writes its outputs there: the run folder's lock (one holder, taken over once its
    holder is gone), with a refusal that names the command and its ``--out``."""

    def __init__(self, folder: Path, command: str, option: str = "--out") -> None:
        super().__init__(folder)
        self.command, self.option = command, option
        self.made = False  # whether acquiring made the folder: then an empty one is removed on release

    def acquire(self) -> None:
        self.made = not self.path.parent.exists()
        super().acquire()

    def release(self) -> None:
        super().release()
        if self.made:  # a command refused before it wrote anything leaves no folder behind
            with contextlib.suppress(OSError):
                self.path.parent.rmdir()

    def refusal(self, holder: dict[str, Any]) -> str:
        return output_busy_message(self.path.parent, holder, self.command, self.option)


def claim_path(path: Path, seen: Seen, round_: int | str) -> Path:
    """The claim on the lock file ``seen`` (its inode and content) in ``round_``: one name per
    file, so that the claims on a file that has since been replaced never stand in the way."""
    return path.with_name(f"{LOCK_NAME}.takeover-{seen[0]}-{zlib.crc32(seen[1]):08x}-{round_}")


def holder_info() -> dict[str, Any]:
    """Who this process is, as the lock file records it."""
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "slurm_job": os.environ.get("SLURM_JOB_ID"),
    }


def holder_bytes() -> bytes:
    """:func:`holder_info` as the file holds it, with a nonce that tells two acquisitions apart."""
    return json.dumps({**holder_info(), "nonce": uuid.uuid4().hex}).encode()


def read_holder(path: Path) -> dict[str, Any]:
    try:
        return _parse(Path(path).read_bytes())
    except OSError:
        return {}


def busy_message(folder: Path, holder: dict[str, Any]) -> str:
    who = f"process {holder.get('pid', '?')} on host {holder.get('host', '?')}"
    since = f" since {holder['started']}" if holder.get("started") else ""
    job = f", SLURM job {holder['slurm_job']}" if holder.get("slurm_job") else ""
    return (
        f"run folder {folder} is in use by {who}{since}{job}: two processes would train into one record. "
        "Wait for it to end or stop it; to train both, give this run another folder (another override "
        "or paths.output_dir)"
    )


def output_busy_message(folder: Path, holder: dict[str, Any], command: str, option: str = "--out") -> str:
    """The one line that refuses a second ``command`` into the output folder ``folder``."""
    who = f"process {holder.get('pid', '?')} on host {holder.get('host', '?')}"
    since = f" since {holder['started']}" if holder.get("started") else ""
    job = f", SLURM job {holder['slurm_job']}" if holder.get("slurm_job") else ""
    return (
        f"output folder {folder} is in use by {who}{since}{job} ({command}): two commands would write "
        f"into one folder and the first's files would be lost. Wait for it to end or stop it, or give "
        f"this one another {option}"
    )


def create_with(path: Path, content: bytes) -> bool:
    """Create ``path`` holding ``content``, atomically: False when it exists. A finished temporary
    file is linked to ``path``, so no reader ever sees it empty; where the file system has no hard
    links, ``O_EXCL`` creates it and writes it just after (readers wait :data:`EMPTY_GRACE_S`)."""
    temp = _temporary(path, content)
    try:
        os.link(temp, path)
        return True
    except FileExistsError:
        return False
    except OSError as error:
        if error.errno not in NO_LINK:
            raise
        return _create_exclusive(path, content)
    finally:
        temp.unlink(missing_ok=True)


def _temporary(path: Path, content: bytes) -> Path:
    """A new file holding ``content`` beside ``path``, named apart from every lock and claim (the
    claims' glob, ``.lock.takeover-…-*``, must never take another process's temporary file)."""
    temp = path.with_name(f"{LOCK_NAME}.tmp-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    temp.write_bytes(content)
    return temp


def _create_exclusive(path: Path, content: bytes) -> bool:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    try:
        os.write(fd, content)
    finally:
        os.close(fd)
    return True


def _write_holder(fd: int) -> None:
    data = json.dumps(holder_info()).encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)


def _parse(data: bytes) -> dict[str, Any]:
    try:
        parsed = json.loads(data or b"{}")
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _seen(path: Path) -> Seen | None:
    """The lock file's inode and content, read through one descriptor; None when it is absent."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return os.fstat(fd).st_ino, b"".join(chunks)
    finally:
        os.close(fd)


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.fstat(fd).st_ino == os.stat(path).st_ino
    except FileNotFoundError:
        return False


def _abandoned(claim: Path) -> bool:
    """A claim whose process is gone (on this host), or far older than a claim is ever held."""
    try:
        age = time.time() - claim.stat().st_mtime
    except FileNotFoundError:
        return False  # done with meanwhile: the caller starts over
    holder = read_holder(claim)
    return age > CLAIM_ABANDONED_S or (holder.get("host") == socket.gethostname() and _dead(holder))


def _stale(holder: dict[str, Any]) -> bool:
    """A content-only lock whose holder is gone: this host and a dead PID, or this SLURM job."""
    job = os.environ.get("SLURM_JOB_ID")
    if job and holder.get("slurm_job") == job:
        return True  # SLURM requeues a job only once its previous run has ended
    return holder.get("host") == socket.gethostname() and _dead(holder)


def _dead(holder: dict[str, Any]) -> bool:
    """No process on this host has the holder's PID (a missing or non-positive PID names none)."""
    try:
        pid = int(holder.get("pid", 0))
        if pid > 0:
            os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except (PermissionError, TypeError, ValueError, OverflowError):
        return False
    return pid <= 0
