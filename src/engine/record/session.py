"""One session's turn at a run folder: the lock, the identity check, and what to do with the
record found there.

``trainer.resume`` decides, when the folder already holds a record that trained:

* ``auto`` (default): continue it when its identity (:mod:`.identity`) is this run's; refuse,
  listing the differing keys, when it is not; a completed record is reported complete and left
  as it is;
* ``never``: refuse;
* ``restart``: move the record to ``superseded/<n>/`` (never delete it) and start a new one.

A record that never trained (a session that failed before its first step) is simply started
again. A fresh record whose session is refused before its first step (bad input found once the
folder was opened: a missing data file) is withdrawn (:meth:`Session.withdraw`): the files that
session wrote are removed, nothing that was there before, so that no report lists a run that never
ran. The session also carries what the checkpoints must: the identity's hash and the list of
sessions whose steps they hold, each with its code version. A checkpoint of another identity is
refused; one written by other code is resumed with one warning, and ``summary.json`` lists the
code of every session.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from src.errors import ConfigError, SuiteError
from src.resolvers import legacy_folder, named_before

from ..distributed import Dist
from .files import RunRecord, holds_record, move_record
from .identity import DATA, Identity, code_version
from .lock import LOCK_NAME, RunLock
from .tracking import new_run_id

log = logging.getLogger(__name__)

RESUME_MODES = ("auto", "never", "restart")
#: What a session writes to start a fresh record, before its first step (:meth:`Session.withdraw`).
HYDRA_FILES = ("config.yaml", "hydra.yaml", "overrides.yaml")  # src/run.py: hydra_files
STARTED = ("config.yaml", "identity.json", *(f".hydra/{n}" for n in HYDRA_FILES), ".hydra")


class RecordExists(ConfigError):
    """``trainer.resume=never`` and the folder holds a record."""


class CheckpointMismatch(SuiteError):
    """A checkpoint written for another identity than this run's."""


@dataclass
class Opening:
    """What the main process found in the folder, shared with every process."""

    kind: str  # fresh | resume | complete
    wandb_id: str
    logged_through: int | None = None  # the last step the record (and its W&B run) holds
    summary: dict[str, Any] | None = None  # a complete record's
    superseded: str | None = None  # where a restart moved the earlier record


def this_session() -> dict[str, Any]:
    """This session as the record lists it (``to_step`` is added when it is written): the code,
    the host and the torch build (``2.14.1+cpu``) that trained its steps, so that a results file
    can say what produced each number."""
    import torch

    return {
        "from_step": 0,
        "code": code_version(),
        "host": socket.gethostname(),
        "torch": str(torch.__version__),  # a plain str: TorchVersion is no global the safe loader allows
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


@dataclass
class Session:
    """This process's session at ``record``: see the module docstring."""

    record: RunRecord
    identity: Identity
    opening: Opening
    earlier: list[dict[str, Any]] = field(default_factory=list)  # sessions the resumed state holds
    current: dict[str, Any] = field(default_factory=this_session)
    config: dict[str, Any] | None = None  # the resolved config, carried by each checkpoint
    found: frozenset[str] = frozenset()  # what the folder held before this session opened it
    withdrawn: bool = False

    @property
    def kind(self) -> str:
        return self.opening.kind

    def withdraw(self) -> list[str]:
        """Remove what this session wrote to start a fresh record (:data:`STARTED`: config,
        identity, Hydra's copy of the command), where it trained no step; whatever the folder
        held before it opened (:attr:`found`), an earlier record moved to ``superseded/``
        included, stays. Returns the names removed (none for a record that was not fresh, or
        that this session trained)."""
        record = self.record
        if not record.enabled or self.kind != "fresh" or record.touched:
            return []
        removed = []
        for name in STARTED:
            path = record.dir / name
            if name in self.found or not (path.exists() or path.is_symlink()):
                continue
            if path.is_dir() and not path.is_symlink():
                with contextlib.suppress(OSError):  # emptied above; anything else in it stays
                    path.rmdir()
                    removed.append(name)
            else:
                path.unlink()
                removed.append(name)
        self.withdrawn = True
        return removed

    def sessions(self, step: int) -> list[dict[str, Any]]:
        """Every session whose steps the state at ``step`` holds, this one last."""
        return [*self.earlier, {**self.current, "to_step": step}]

    def checkpoint_meta(self, step: int) -> dict[str, Any]:
        """What a checkpoint carries of the record: the identity's hash, the sessions, and the
        resolved config (its data folder absolute), so that ``python -m src.eval FILE`` can rebuild
        the model of a checkpoint copied out of its run folder (after the same checks as a record's)."""
        meta = {"identity": self.identity.hash, "sessions": self.sessions(step)}
        if DATA in self.identity.config:  # what the config alone cannot give back: the data's content
            meta[DATA] = self.identity.config[DATA]
        return meta if self.config is None else {**meta, "config": self.config}

    def adopt(self, meta: dict[str, Any] | None, path: Path, step: int) -> None:
        """Continue from a checkpoint at ``step`` with ``meta`` (:meth:`checkpoint_meta`, None for a
        checkpoint older than identities): refuse another identity, warn once on other code."""
        self.current["from_step"] = step
        if not meta:
            return
        if meta.get("identity") not in (None, self.identity.hash):
            raise CheckpointMismatch(
                f"checkpoint {path} was written for another configuration (identity {meta['identity']}, "
                f"this run's {self.identity.hash}): rerun with trainer.resume=restart to move that record "
                "aside and start over, or give this run its own folder"
            )
        self.earlier = list(meta.get("sessions") or [])
        before = (self.earlier[-1].get("code") or {}) if self.earlier else {}
        now = self.current["code"]
        if before.get("source") and before.get("source") != now["source"]:
            warnings.warn(
                f"the code changed since checkpoint {path} was written (git {before.get('git')} → "
                f"{now['git']}); resuming anyway: summary.json lists the code of each session",
                stacklevel=2,
            )


class RunSession:
    """``with RunSession(record, cfg, dist) as session:`` holds the folder's lock (main process)
    and opens the record as ``trainer.resume`` says; every process gets the same decision. ``data``:
    the content hashes of the generated data the run reads, which join its identity."""

    def __init__(
        self,
        record: RunRecord,
        cfg: DictConfig,
        dist: Dist,
        hydra_files: dict[str, str] | None = None,
        data: Mapping[str, str] | None = None,
    ) -> None:
        self.record, self.cfg, self.dist, self.hydra_files = record, cfg, dist, hydra_files
        self.identity = Identity.of(cfg, data)  # data: the generated data's content hashes, read already
        self.lock = RunLock(record.dir) if dist.main else None

    def __enter__(self) -> Session:
        found: Opening | Exception | None
        locked = False
        self.before: frozenset[str] = frozenset()
        try:
            if self.lock is not None:
                self.lock.acquire()
                locked = True
            found = None
            if self.dist.main:
                self.before = entries(self.record.dir)
                found = open_record(self.record, self.cfg, self.identity, self.hydra_files)
        except Exception as error:  # every process must learn of it, or the others would wait
            found = error
        found = self.dist.share(found)
        if isinstance(found, Exception):
            if locked:
                self.lock.release()
            raise found
        self.session = Session(
            self.record, self.identity, found, config=carried_config(self.cfg), found=self.before
        )
        return self.session

    def __exit__(self, *exc: object) -> None:
        if self.lock is not None:
            self.lock.release()
            if getattr(self, "session", None) is not None and self.session.withdrawn and not self.before:
                with contextlib.suppress(OSError):  # the folder this session made, left empty
                    self.record.dir.rmdir()


def entries(folder: Path) -> frozenset[str]:
    """The names in ``folder`` (none where it does not exist), but the lock's, and those in its
    ``.hydra/`` as ``.hydra/<name>``."""
    if not folder.is_dir():
        return frozenset()
    names = {p.name for p in folder.iterdir() if p.name != LOCK_NAME}
    if (folder / ".hydra").is_dir():
        names |= {f".hydra/{p.name}" for p in (folder / ".hydra").iterdir()}
    return frozenset(names)


def carried_config(cfg: DictConfig) -> dict[str, Any]:
    """``cfg`` resolved, as the record's ``config.yaml`` holds it, with its data folder absolute
    (as the identity has it): what each checkpoint carries (:meth:`Session.checkpoint_meta`)."""
    config = OmegaConf.to_container(cfg, resolve=True)
    config.pop("hydra", None)
    paths = config.get("paths") or {}
    if paths.get("data_dir") is not None:
        paths["data_dir"] = os.path.abspath(str(paths["data_dir"]))
    return config


def open_record(
    record: RunRecord, cfg: DictConfig, identity: Identity, hydra_files: dict[str, str] | None = None
) -> Opening:
    """The main process's decision (see the module docstring); writes a new record's first files,
    and, where this session will train, Hydra's copy of its command (``hydra_files``, ``.hydra/``)."""
    adopt_legacy(record)
    adopt_renamed(record, identity)
    mode = cfg.trainer.get("resume", "auto")
    if record.has_trained():
        if mode == "never":
            raise RecordExists(
                f"run folder {record.dir} already holds a record (trainer.resume=never): "
                "trainer.resume=auto continues it, trainer.resume=restart moves it to superseded/ "
                "and starts over"
            )
        if mode == "auto":
            opening = continued(record, identity)
            if opening.kind != "complete":
                record.write_hydra(hydra_files or {})
            return opening
        moved = record.supersede()
        log.info("moved the earlier record of %s to %s", record.dir, moved)
        opening = Opening("fresh", new_run_id(), superseded=str(moved))
    else:
        opening = Opening("fresh", new_run_id())
    record.start(cfg, identity, opening.wandb_id)
    record.write_hydra(hydra_files or {})
    return opening


def adopt_legacy(record: RunRecord) -> None:
    """A run with overrides whose record is still where the older layout put it, inside the folder
    of the run without overrides (``…/seed=0/trainer.max_steps=20``, :func:`legacy_folder`): move
    that record here, under its folder's lock too (an older process may still train there), so
    that the same command resumes it. Nothing is copied or deleted; the emptied folder is removed."""
    legacy = legacy_folder(record.dir)
    if legacy is None or not record.enabled or record.has_trained() or not holds_record(legacy):
        return
    # the parent too, where no run without overrides is
    move_in(legacy, record, "where the layout before overrides joined the seed's name kept it", legacy.parent)


def move_in(earlier: Path, record: RunRecord, why: str, *also_empty: Path) -> None:
    """Move the record in ``earlier`` to ``record``'s folder under ``earlier``'s lock (an older
    process may still train there), remove the emptied folders, and log it, saying ``why`` it was
    there. Nothing is copied or deleted."""
    with RunLock(earlier):
        moved = move_record(earlier, record.dir)
    for emptied in (earlier, *also_empty):
        with contextlib.suppress(OSError):
            emptied.rmdir()
    log.warning(
        "moved the record of this run from %s, %s, to %s (%d entries)", earlier, why, record.dir, len(moved)
    )


def recorded_hash(folder: Path) -> str | None:
    """The identity hash of the record in ``folder`` (None: none, or a damaged one, left alone)."""
    try:
        recorded, _ = RunRecord(folder).recorded_identity()
    except SuiteError:
        return None
    return None if recorded is None else recorded.hash


def adopt_renamed(record: RunRecord, identity: Identity) -> None:
    """A run recorded under a longer name, when options now out of the name were still in it
    (:func:`src.resolvers.named_before`: ``seed=0,logger.log_checkpoints=true``): move that record
    here, under its lock, where it has this run's identity, so the same command resumes it. Two
    such records: neither is moved, and the log names them."""
    if not record.enabled or record.has_trained():
        return
    same = [f for f in named_before(record.dir) if holds_record(f) and recorded_hash(f) == identity.hash]
    if len(same) > 1:
        log.warning(
            "%d records of this run under earlier names (%s): none moved here; move the one to continue "
            "to %s by hand",
            len(same),
            ", ".join(f.name for f in same),
            record.dir,
        )
        return
    for earlier in same:
        move_in(earlier, record, "named when options that change nothing trained were still in the name")


def continued(record: RunRecord, identity: Identity) -> Opening:
    """The opening of a record this run continues (or finds complete), once its identity agrees."""
    recorded, meta = record.recorded_identity()
    if recorded is not None:
        identity.check_same(recorded, record.dir)
    wandb_id = meta.get("wandb_id") or new_run_id()
    if not meta:  # a record from before identities: give it one (its config.yaml agreed)
        record.write_identity(identity, wandb_id)
    summary = record.summary()
    if summary is not None and summary.get("status") == "completed":
        return Opening("complete", wandb_id, summary=summary)
    return Opening("resume", wandb_id, logged_through=record.last_logged_step())
