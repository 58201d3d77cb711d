"""The run record: the files every run leaves in its folder, and the one way to read them.

=================  ===========================================================================
``config.yaml``    the resolved config (written when the record starts, never by a rerun)
``identity.json``  the run's identity (:mod:`.identity`), the code that started it, its W&B id
``metrics.jsonl``  one JSON object per logged step, with ``step`` and ``split``
``summary.json``   what the run was and what it reached, written when a session ends
``failures.jsonl`` one line per session that failed: when, where, at which step, the error
``checkpoints/``   ``last.pt``, ``previous.pt`` and ``best.pt`` (:mod:`.checkpoint`)
``.hydra/``        Hydra's copy of the command (config, overrides, Hydra's own settings), written
                   by the session that trains here, never by one refused the folder
``superseded/<n>`` earlier records of this folder, moved aside by ``trainer.resume=restart``
=================  ===========================================================================

What holds, whatever happens to a session:

* a session that does not train never rewrites the record: its failure goes to
  ``failures.jsonl``; ``summary.json`` changes only when the session trained or there was none;
* a session that trains makes an earlier session's ``failed`` summary stale: it is removed at the
  session's first write (the failure stays in ``failures.jsonl``), so that a session killed after
  it is read as incomplete, not as the earlier failure;
* no run folder holds another's: a restart moves this folder's record aside, never a run folder
  inside it (the layout before overrides joined the seed's name nested them);
* a resumed session continues the rows at its checkpoint's step: the rows a killed session
  logged past it are dropped at the session's first write (not before, so a session that fails
  at once leaves them), and so is a torn last line (power loss, a full disk);
* values are plain JSON: a NaN or an infinity is written ``null``, and the row (or summary)
  says which values were not finite under ``nonfinite``;
* every file is written whole or not at all (a temporary file, then a rename); a write that
  fails says which file and how much room its disk has, and leaves no temporary file behind.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import math
import os
import shutil
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from src.errors import SuiteError

from . import atomic
from .bounded import LIMITS, ROW_LIMIT, RefusedFile, lines, read_bytes
from .identity import Identity, code_version

CHECKPOINT_NAMES = ("last.pt", "previous.pt")
KEPT_IN_PLACE = (".hydra", "superseded", ".lock")  # a restart moves everything else aside


class RecordError(SuiteError):
    """A record file that cannot be written, or read back."""


class RunRecord:
    """The record in ``run_dir``; ``enabled=False`` (DDP ranks but the first) writes nothing."""

    def __init__(self, run_dir: Path, enabled: bool = True) -> None:
        self.dir, self.enabled = Path(run_dir), enabled
        self.metrics_path = self.dir / "metrics.jsonl"
        self.summary_path = self.dir / "summary.json"
        self.failures_path = self.dir / "failures.jsonl"
        self.identity_path = self.dir / "identity.json"
        self.checkpoint = self.dir / "checkpoints" / "last.pt"
        self.touched = False  # this session wrote rows or a checkpoint
        self._cut: tuple[int | None] | None = None  # (step,): rows past it go at the next write
        self._writing = False  # this session has written rows or a checkpoint (settle() ran)

    # -- reading -----------------------------------------------------------------------------

    def has_trained(self) -> bool:
        """Whether a session has left results here: rows, a checkpoint, or a completed summary."""
        if self.metrics_path.exists() and self.metrics_path.stat().st_size > 0:
            return True
        folder = self.checkpoint.parent
        if any((folder / n).exists() or (folder / n).is_symlink() for n in CHECKPOINT_NAMES):
            return True
        return (self.summary() or {}).get("status") == "completed"

    def summary(self) -> dict[str, Any] | None:
        """``summary.json`` as written (None: there is none); a :class:`RecordError` where it is not
        JSON, and a :class:`RefusedFile` where it is not a regular file of at most its limit
        (:mod:`.bounded`)."""
        if not self.summary_path.exists():
            return None
        data = read_bytes(self.summary_path)
        try:
            return json.loads(data)
        except ValueError as error:
            raise RecordError(f"{self.summary_path} is not valid JSON ({error})") from error

    def recorded_identity(self) -> tuple[Identity | None, dict[str, Any]]:
        """The record's identity and the rest of ``identity.json`` (W&B id, code); a record
        written before identities existed has its ``config.yaml`` instead."""
        if self.identity_path.exists():
            data = read_bytes(self.identity_path)
            try:
                meta = json.loads(data)
                return Identity(meta["config"]), meta
            except (ValueError, KeyError, TypeError) as error:
                raise RecordError(f"{self.identity_path} is damaged ({error})") from error
        config = self.dir / "config.yaml"
        if config.exists():
            loaded = OmegaConf.load(io.BytesIO(read_bytes(config)))
            return Identity.of(OmegaConf.to_container(loaded, resolve=False)), {}
        return None, {}

    def last_logged_step(self) -> int | None:
        return max((r["step"] for r in read_metrics(self.dir, warn=False)), default=None)

    # -- writing -----------------------------------------------------------------------------

    def start(self, cfg: DictConfig, identity: Identity, wandb_id: str) -> None:
        """A new record: ``config.yaml`` and ``identity.json``; rows from nothing."""
        self._cut = (None,)
        if not self.enabled:
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        write_atomic(self.dir / "config.yaml", OmegaConf.to_yaml(cfg, resolve=True))
        self.write_identity(identity, wandb_id)

    def write_identity(self, identity: Identity, wandb_id: str) -> None:
        if self.enabled:
            meta = {
                "hash": identity.hash,
                "code": code_version(),
                "created": time.strftime("%Y-%m-%d %H:%M:%S"),
                "wandb_id": wandb_id,
                "config": identity.config,
            }
            write_atomic(self.identity_path, json.dumps(meta, indent=1) + "\n")

    def continue_after(self, step: int | None) -> None:
        """Continue the rows after ``step`` (None: from nothing); applied at the next write."""
        self._cut = (step,)

    def settle(self) -> None:
        """Before each write of rows or a checkpoint: at the first, drop an earlier session's stale
        ``failed`` summary (module docstring); apply a pending :meth:`continue_after`: keep the rows
        up to its step, whole lines only."""
        if not self.enabled:
            return
        if not self._writing:
            self._writing = True
            self._drop_failed_summary()
        if self._cut is None:
            return
        (step,) = self._cut
        self._cut = None
        if not self.metrics_path.exists():
            return
        rows = [] if step is None else [r for r in read_metrics(self.dir) if r["step"] <= step]
        write_atomic(self.metrics_path, "".join(json.dumps(r) + "\n" for r in rows))

    def log(self, step: int, split: str, metrics: dict[str, Any]) -> None:
        if not self.enabled:
            return
        self.settle()
        values, nonfinite = plain_json(metrics)
        row = {"step": step, "split": split, **values, **({"nonfinite": nonfinite} if nonfinite else {})}
        try:
            with open(self.metrics_path, "a") as f:
                f.write(json.dumps(row) + "\n")
        except OSError as error:
            raise RecordError(write_failure(self.metrics_path, error)) from error
        self.touched = True

    def write_summary(self, summary: dict[str, Any]) -> None:
        if self.enabled:
            values, nonfinite = plain_json(summary)
            if nonfinite:
                values["nonfinite"] = nonfinite
            write_atomic(self.summary_path, json.dumps(values, indent=2) + "\n")

    def _drop_failed_summary(self) -> None:
        """Remove ``summary.json`` where it says ``failed``: this session trains, so it is stale (the
        failure it describes is in ``failures.jsonl``)."""
        try:
            status = (self.summary() or {}).get("status")
        except (RecordError, RefusedFile, AttributeError):  # damaged, not an object: not ours to judge
            return
        if status == "failed":
            self.summary_path.unlink(missing_ok=True)

    def write_hydra(self, files: dict[str, str]) -> None:
        """Hydra's copy of the command into ``.hydra/`` (``config.yaml``, ``hydra.yaml``,
        ``overrides.yaml``: ``{name: text}``), each file whole or not at all."""
        if not self.enabled or not files:
            return
        folder = self.dir / ".hydra"
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            write_atomic(folder / name, text)

    def add_failure(self, entry: dict[str, Any]) -> bool:
        """Append one failure to ``failures.jsonl``; best effort (False when even that fails)."""
        if not self.enabled:
            return False
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            with open(self.failures_path, "a") as f:
                f.write(json.dumps(plain_json(entry)[0]) + "\n")
        except OSError:
            with contextlib.suppress(OSError):
                if self.failures_path.stat().st_size == 0:  # created, but nothing could be written
                    self.failures_path.unlink()
            return False
        return True

    def supersede(self) -> Path | None:
        """Move this folder's record to ``superseded/<n>/`` (n = 1, 2, …), its sessions' log
        (Hydra's ``run.log``) with it; returns that folder. This session's log starts afresh in
        place: the handlers writing it reopen there (:func:`move_log`)."""
        entries = sorted(self.dir.iterdir())
        logs = [p for p in entries if p.is_file() and p.suffix == ".log"]
        moving = [
            p
            for p in entries
            if p.name not in KEPT_IN_PLACE
            and p not in logs
            and not holds_record(p)  # another run's folder (the older, nested layout): not ours
        ]
        if not self.enabled or not moving:
            return None
        parent = self.dir / "superseded"
        taken = [int(p.name) for p in parent.glob("*") if p.name.isdigit()] if parent.exists() else []
        target = parent / str(max(taken, default=0) + 1)
        target.mkdir(parents=True)
        for path in moving:
            os.replace(path, target / path.name)
        for path in logs:
            move_log(path, target / path.name)
        return target


def move_log(path: Path, target: Path) -> None:
    """Move the log file ``path`` to ``target``; this process's logging handlers that write
    ``path`` (Hydra's job log) are flushed first and reopened at ``path`` after, so that what this
    process logs next starts a new file there instead of following the old one."""
    where = os.path.realpath(path)
    handlers = [h for h in file_handlers() if os.path.realpath(h.baseFilename) == where]
    for handler in handlers:
        handler.acquire()
    try:
        for handler in handlers:
            handler.flush()
        os.replace(path, target)
        for handler in handlers:
            if handler.stream is not None:  # opened already (not delay=True and still unused)
                handler.stream.close()
                handler.stream = handler._open()
    finally:
        for handler in handlers:
            handler.release()


def file_handlers() -> list[logging.FileHandler]:
    """Every :class:`logging.FileHandler` of this process's loggers (the root's and the named ones)."""
    loggers = [logging.getLogger(), *(v for v in logging.Logger.manager.loggerDict.values())]
    found = []
    for logger in loggers:
        for handler in getattr(logger, "handlers", []):
            if isinstance(handler, logging.FileHandler) and handler not in found:
                found.append(handler)
    return found


#: What marks a folder as a run's: any of the record's files.
RECORD_FILES = ("config.yaml", "identity.json", "metrics.jsonl", "summary.json", "checkpoints", ".hydra")


def holds_record(path: Path) -> bool:
    """Whether ``path`` is a folder with a run's record in it."""
    return path.is_dir() and any((path / name).exists() for name in RECORD_FILES)


def move_record(source: Path, target: Path, keep: tuple[str, ...] = (".lock",)) -> list[str]:
    """Move the record in folder ``source`` into folder ``target`` (an entry ``target`` already has,
    such as this session's own ``run.log``, arrives as ``<name>.moved``); ``keep`` stays behind.
    Returns the names moved. Each move is a rename on one file system: nothing is copied."""
    moved = []
    for path in sorted(source.iterdir()):
        if path.name in keep:
            continue
        destination = target / path.name
        if destination.exists():
            destination = target / f"{path.name}.moved"
        os.replace(path, destination)
        moved.append(path.name)
    return moved


def read_metrics(run_dir: Path, warn: bool = True, bounded: bool = False) -> list[dict[str, Any]]:
    """The rows of a run's ``metrics.jsonl`` (none if it has none), read line by line.

    A torn last line (a write cut short) is dropped, with one warning naming the file; a damaged
    line before the last one is a :class:`RecordError` naming the file and the line. A file that
    is not a regular one, or a line longer than :data:`.bounded.LINE_LIMIT`, is a
    :class:`RefusedFile`; ``bounded`` (the report: a folder from elsewhere) also refuses a file
    larger than its limit, more than :data:`.bounded.ROW_LIMIT` rows, or a link out of the run's
    folder (:mod:`.bounded`)."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    limit, within = (None, None) if not bounded else (LIMITS["metrics.jsonl"], Path(run_dir))
    rows: list[dict[str, Any]] = []
    torn: tuple[int, str, ValueError] | None = None  # a damaged line: an error unless it is the last
    for number, line in lines(path, limit, within):
        if not line.strip():
            continue
        if torn is not None:
            raise damaged_line(path, *torn)
        try:
            row = json.loads(line)
            if not isinstance(row, dict) or "step" not in row:
                raise ValueError("not a row with a step")
        except ValueError as error:
            torn = (number, line, error)
            continue
        rows.append(row)
        if bounded and len(rows) > ROW_LIMIT:
            raise RefusedFile(
                f"{path} holds more than {ROW_LIMIT:,} rows, more than the report reads of one run "
                "(src/engine/record/bounded.py): not a file the suite wrote; move it aside"
            )
    if torn is not None and warn:
        warnings.warn(f"{path}: dropped a torn last line ({torn[1][:60]!r}…)", stacklevel=2)
    return rows


def damaged_line(path: Path, number: int, line: str, error: ValueError) -> RecordError:
    """The error for a damaged line of ``metrics.jsonl`` that is not its last."""
    return RecordError(
        f"{path}:{number} is damaged ({error}: {line[:60]!r}); move the run aside "
        "(trainer.resume=restart) or repair that line"
    )


def write_atomic(path: Path, text: str) -> None:
    """Write ``path`` whole or not at all (:func:`atomic.write_text`); a :class:`RecordError`
    naming the file and its disk's free space if not."""
    try:
        atomic.write_text(path, text)
    except OSError as error:
        raise RecordError(write_failure(path, error)) from error


def write_failure(path: Path, error: OSError) -> str:
    """``cannot write <path> (<reason>; N MB free on its disk)``."""
    try:
        free = f"; {shutil.disk_usage(path.parent).free / 2**20:.0f} MB free on its disk"
    except OSError:
        free = ""
    return f"cannot write {path} ({error.strerror or error}{free})"


def check_writable_file(path: Path, option: str = "--out") -> None:
    """Refuse, before a command's work, a result file it could not write at the end: its folder is
    made where missing and a probe file written there and removed (nothing else is left), and
    ``path`` must not be a folder. A :class:`RecordError` naming ``option`` and why."""
    path = Path(path)
    if path.is_dir():
        raise RecordError(f"{option} {path} is a folder: give the file to write")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.write-check-")
        os.close(fd)
        os.unlink(probe)
    except OSError as error:
        raise RecordError(
            f"{option} {path}: cannot write there ({error.strerror or error}); give a path you can write"
        ) from error


def plain_json(value: Any, path: str = "") -> tuple[Any, dict[str, str]]:
    """``value`` as plain JSON (tensors and NumPy scalars as numbers, NaN and ±inf as None),
    and ``{dotted path: "nan" | "inf" | "-inf"}`` of the values that were not finite."""
    if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", 0) == 0:
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None, {path: str(value)}
    if isinstance(value, dict):
        out, bad = {}, {}
        for key, item in value.items():
            out[key], found = plain_json(item, f"{path}.{key}" if path else str(key))
            bad.update(found)
        return out, bad
    if isinstance(value, (list, tuple)):
        pairs = [plain_json(item, f"{path}.{i}") for i, item in enumerate(value)]
        return [p[0] for p in pairs], {k: v for p in pairs for k, v in p[1].items()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value, {}
    return str(value), {}
