"""A run's identity: what its numbers depend on, so that a record never mixes two configurations.

The identity is the resolved config minus the keys below and its null values (so that an option
added later, off by default, leaves earlier records' identity as it was), with ``paths.data_dir``
made absolute, hashed (:attr:`Identity.hash`). A rerun resumes a record only when the hashes
agree; otherwise it refuses, listing each differing key with both values
(:class:`IdentityMismatch`). Beside the identity, never in it, is the code version
(:func:`code_version`): a rerun after a ``git pull`` (a SLURM requeue after an update is normal)
warns once and goes on, and ``summary.json`` records each session's code.

Left out of the identity, because they provably do not bear on what the run computes:

========================  ====================================================================
``logger``                where the numbers are also sent (W&B)
``paths.output_dir``      where the record lives (the folder is named by the overrides anyway)
``sweep_name``            the multirun folder's name
``trainer.progress``      the progress display
``trainer.resume``        what a rerun does with an existing record
``trainer.checkpoint_every``  how often the state is saved: resuming from any checkpoint is
                          bit-identical to not stopping
``trainer.checkpoints``   whether checkpoints are written at all (``debug=fdr``: none); the
                          steps computed are the same
``trainer.num_workers``   data loading processes: each sample is drawn from (seed, epoch, index),
                          whichever process loads it
``trainer.nonfinite*``    the policy for a NaN/Inf loss; a run that skipped batches counts them in
                          ``summary.json`` (``skipped_batches``)
``trainer.collapse_entropy``  when the collapse guard warns (a message, nothing else)
``trainer.test_after``    which checkpoint is evaluated on the test split once training has
                          ended (``eval-test.json``, summary's ``test``); training is unchanged
``trainer.val_at_start``  a validation of the initial weights (a row at step 0); it restores the
                          random state after it, so the steps computed are the same
========================  ====================================================================

Left out although they change the *bits* (not the meaning) of the result, so that a requeue on
another node or with another thread count resumes: ``trainer.threads`` (the order of float
reductions), ``trainer.device`` (CPU or GPU kernels), ``trainer.compile`` (fused kernels),
``trainer.flush_denormal`` (values below 1.2e-38 flushed to zero), ``resources`` (the SLURM job's
size: its number of processes keeps the global batch, :mod:`.batching`, but sums in another order).
A run resumed across one of them is still one run, but no longer bit-identical to an uninterrupted
one.

``paths.data_dir`` changes the *meaning* (another data set under the same folder name): it joins
the identity, as an absolute path, although it stays out of the folder's name. So does
``task.data_dir`` (``task=imagefolder``'s folder, whose name alone is in the run folder's path).

The data a run generates or tokenises (token caches, tokenizers and vocabularies trained here, the
generated ListOps, ``glue_tiny``, COCO shapes) joins it too, by content: ``data`` (:data:`DATA`, a
key no config has) maps each artefact the run read (its marker's path below the data folder) to the
content hash of its manifest (:mod:`src.engine.generated`), so two runs of one config on different
files (a token cache made from another copy of the corpus, a ListOps file cut short and used as the
user's own) have different identities: neither resumes the other's record, and the report never
pools them. A run that reads no generated data has no ``data`` key, and its identity is what it was
before data joined it; a record made on generated data before (no ``data``) is another identity
than a run on the same data now, and says so (:meth:`Identity.check_same`).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from src.errors import ConfigError
from src.resolvers import CHANGES_BITS, NO_BEARING  # one list: also out of the run folder's name

ROOT = Path(__file__).resolve().parents[3]

EXCLUDED = NO_BEARING + CHANGES_BITS
#: Classes that moved: a record made before the move names the old path in its ``_target_``; the
#: identity compares the new one, so that the record still resumes and groups with new runs.
MOVED_TARGETS = {
    "tasks.lra.schedule.RsqrtLRScheduler": "src.engine.loop.schedule.RsqrtLRScheduler",
    "src.engine.schedule.RsqrtLRScheduler": "src.engine.loop.schedule.RsqrtLRScheduler",
    "src.engine.schedule.TriangleLRScheduler": "src.engine.loop.schedule.TriangleLRScheduler",
}
#: The identity's key for the content hashes of the generated data a run read (not a config key).
DATA = "data"
ABSENT = type("Absent", (), {"__repr__": lambda self: "null"})()  # a key one side lacks (or sets null)


class IdentityMismatch(ConfigError):
    """A rerun whose configuration differs from the record it would resume."""


@dataclass(frozen=True)
class Identity:
    """The identity of a run: ``config`` (the resolved config minus :data:`EXCLUDED`) and its hash."""

    config: dict[str, Any]

    def __post_init__(self) -> None:
        object.__setattr__(self, "config", _moved(self.config))

    @property
    def hash(self) -> str:
        text = json.dumps(self.config, sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    @classmethod
    def of(cls, cfg: DictConfig | dict[str, Any], data: Mapping[str, str] | None = None) -> Identity:
        """The identity of a composed (or saved, resolved) config; ``data``: the content hash of
        each generated artefact the run read (:func:`src.engine.generated.reading`), if any."""
        plain = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else cfg
        config = json.loads(json.dumps(plain, default=str))  # a deep, JSON-shaped copy
        config.pop("hydra", None)
        config.pop(DATA, None)  # never the config's: only what was read
        if data:
            config[DATA] = {str(k): str(v) for k, v in sorted(data.items())}
        for key in EXCLUDED:
            _drop(config, key.split("."))
        for group in ("paths", "task"):  # task.data_dir: task=imagefolder's own folder
            data_dir = (config.get(group) or {}).get("data_dir")
            if data_dir is not None:
                config[group]["data_dir"] = os.path.abspath(str(data_dir))
        return cls(_without_nulls(config))

    def without(self, *keys: str) -> Identity:
        """The identity with ``keys`` (dotted) left out, e.g. ``seed`` to group a run's seeds."""
        config = json.loads(json.dumps(self.config))
        for key in keys:
            _drop(config, key.split("."))
        return Identity(config)

    def differences(self, other: Identity) -> dict[str, tuple[Any, Any]]:
        """``{dotted key: (self's value, other's value)}`` for every key that differs
        (:data:`ABSENT` where one side lacks the key or sets it null)."""
        mine, theirs = flatten(self.config), flatten(other.config)
        pairs = {k: (mine.get(k, ABSENT), theirs.get(k, ABSENT)) for k in sorted(set(mine) | set(theirs))}
        return {k: pair for k, pair in pairs.items() if pair[0] != pair[1]}

    def check_same(self, recorded: Identity, where: Path | str, shown: int = 8) -> None:
        """Raise :class:`IdentityMismatch` unless ``recorded`` (the record's) equals this one."""
        if recorded.hash == self.hash:
            return
        diffs = recorded.differences(self)
        listed = "; ".join(f"{k}: {_show(a)} → {_show(b)}" for k, (a, b) in list(diffs.items())[:shown])
        more = f"; and {len(diffs) - shown} more" if len(diffs) > shown else ""
        if any(k.startswith(f"{DATA}.") for k in diffs):  # the content of the data read, not a config key
            more += (
                " (data.*: the content hash of the generated data each run read; a record without it "
                "was made before runs recorded it)"
                if DATA not in recorded.config
                else " (data.*: the files the run read are not those the record was made on)"
            )
        raise IdentityMismatch(
            f"run folder {where} holds a record of another configuration (record → now: {listed}{more}). "
            f"Rerun with trainer.resume=restart to move that record to {Path(where) / 'superseded'}/<n>/ "
            "and start over, or give this run its own folder (another override or paths.output_dir)"
        )


def _moved(tree: Any) -> Any:
    """``tree`` with each moved class's old ``_target_`` replaced by its new one."""
    if isinstance(tree, dict):
        return {k: MOVED_TARGETS.get(v, v) if k == "_target_" else _moved(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_moved(v) for v in tree]
    return tree


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (lists are values)."""
    if not isinstance(tree, dict) or not tree:
        return {prefix: tree} if prefix else {}
    out: dict[str, Any] = {}
    for key, value in tree.items():
        out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def _without_nulls(tree: Any) -> Any:
    """``tree`` without its null values: an option added later with a null default (off) leaves
    the identity of the records written before it unchanged."""
    if isinstance(tree, dict):
        return {k: _without_nulls(v) for k, v in tree.items() if v is not None}
    return tree


def _drop(tree: dict[str, Any], path: list[str]) -> None:
    node = tree
    for part in path[:-1]:
        node = node.get(part)
        if not isinstance(node, dict):
            return
    node.pop(path[-1], None)


def _show(value: Any) -> str:
    return "null" if value is ABSENT else json.dumps(value, default=str)


@functools.lru_cache(maxsize=1)
def source_digest() -> str:
    """A digest of the suite's Python source (``src/``, ``tasks/``): edited code changes it,
    committed or not."""
    digest = hashlib.sha256()
    for folder in ("src", "tasks"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


CODE_FOLDERS = ("src", "tasks", "launch", "conf")
"""Where an untracked file is code that runs (a new module, a new config): elsewhere (``.venv``
as a link, notes, data) an untracked file does not make the code ``-dirty``."""


def revision_of(root: Path) -> str | None:
    """The commit checked out at ``root``, with ``-dirty`` when the code differs from it: a
    tracked file changed (staged or not, anywhere), or an untracked file under
    :data:`CODE_FOLDERS`. Ignored files never count. ``None`` outside a git checkout."""
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5
        )
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=all"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=5,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if rev.returncode != 0:
        return None
    return rev.stdout.strip() + ("-dirty" if _changes_code(status.stdout) else "")


def _changes_code(porcelain: str) -> bool:
    for line in porcelain.splitlines():
        if not line.startswith("??"):
            return True
        path = line[3:].strip().strip('"')
        if path.split("/", 1)[0] in CODE_FOLDERS:
            return True
    return False


@functools.lru_cache(maxsize=1)
def git_revision() -> str | None:
    """The suite's git commit (with ``-dirty`` for changed code, see :func:`revision_of`), if
    known: read once, as the code this process runs is the code it imported."""
    return revision_of(ROOT)


def code_version() -> dict[str, str | None]:
    """``{"git": <commit, -dirty when edited>, "source": <digest of the source>}``."""
    return {"git": git_revision(), "source": source_digest()}
