"""One training process per run folder: an exclusive lock on ``<run>/.lock``.

The lock is the kernel's (``flock``), so it vanishes with its process however that process
ends: a folder whose holder was killed (SIGKILL, a SLURM requeue, a node's reboot) is taken
over at once, and a PID reused by another program never looks like a holder. The file holds
the holder's host, PID, start time and SLURM job, so that a second process names it when it
refuses. Where the file system has no ``flock`` (some network mounts), the file alone decides:
it is taken over when its holder ran on this host and is gone, or belonged to this same SLURM
job (a requeue); otherwise the second process refuses and says which file to remove.

Only the main process of a run takes the lock (DDP ranks write nothing to the record).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from src.errors import SuiteError

LOCK_NAME = ".lock"


class RunFolderBusy(SuiteError):
    """Another process trains in this run folder."""


class RunLock:
    """``with RunLock(folder):`` holds ``folder/.lock`` for the block; see the module docstring."""

    def __init__(self, folder: Path) -> None:
        self.path = Path(folder) / LOCK_NAME
        self.fd: int | None = None

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = read_holder(self.path)
                os.close(fd)
                raise RunFolderBusy(busy_message(self.path.parent, holder)) from None
            except OSError as error:  # no flock on this file system
                os.close(fd)
                if error.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                    raise
                self._acquire_by_content()
                return
            if _same_file(fd, self.path):  # not a file a releasing holder has just unlinked
                break
            os.close(fd)
        self.fd = fd
        _write_holder(fd)

    def release(self) -> None:
        if self.fd is None:
            if self.path.exists() and read_holder(self.path).get("pid") == os.getpid():
                self.path.unlink(missing_ok=True)  # the content-only lock
            return
        try:
            if _same_file(self.fd, self.path):
                self.path.unlink()  # while still holding it: a waiter that opened it retries
        finally:
            os.close(self.fd)  # releases the flock
            self.fd = None

    def _acquire_by_content(self) -> None:
        holder = read_holder(self.path)
        if holder and not _stale(holder):
            raise RunFolderBusy(
                busy_message(self.path.parent, holder)
                + f" (this file system has no flock: if that process is gone, remove {self.path})"
            )
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            _write_holder(fd)
        finally:
            os.close(fd)


def holder_info() -> dict[str, Any]:
    """Who this process is, as the lock file records it."""
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "slurm_job": os.environ.get("SLURM_JOB_ID"),
    }


def read_holder(path: Path) -> dict[str, Any]:
    try:
        return json.loads(Path(path).read_text() or "{}")
    except (OSError, ValueError):
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


def _write_holder(fd: int) -> None:
    data = json.dumps(holder_info()).encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.fstat(fd).st_ino == os.stat(path).st_ino
    except FileNotFoundError:
        return False


def _stale(holder: dict[str, Any]) -> bool:
    """A content-only lock whose holder is gone: this host and a dead PID, or this SLURM job."""
    job = os.environ.get("SLURM_JOB_ID")
    if job and holder.get("slurm_job") == job:
        return True  # SLURM requeues a job only once its previous run has ended
    if holder.get("host") != socket.gethostname():
        return False
    try:
        os.kill(int(holder.get("pid", 0)), 0)
    except ProcessLookupError:
        return True
    except (PermissionError, ValueError):
        return False
    return False
