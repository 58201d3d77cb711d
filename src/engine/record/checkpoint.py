"""Checkpoints: everything a run needs to continue bit for bit, written atomically.

``last.pt`` holds the model, optimizer, scheduler and EMA states, the step, the data
stream's position, every RNG state and the loop's running state. It is written to a
temporary file and renamed, so a kill never leaves half a checkpoint, and the one it
replaces is kept as ``previous.pt``: if ``last.pt`` is truncated or corrupt (a full disk, a
copy gone wrong), :func:`load_latest` says so, moves it aside to ``last.pt.corrupt`` (never into
the rotation) and resumes from ``previous.pt``. Checkpoints load with ``weights_only=True`` (RNG
states are stored as tensors and plain Python values).

``best.pt`` (:data:`BEST`) holds what evaluation needs of the best validation so far: the model
(and EMA) weights, its step, the main metric's name and value, and the record's meta. It is
written the same atomic way, but never rotated into ``previous.pt``; an unreadable one is moved to
``best.pt.corrupt`` by :func:`load_best`, and its reader falls back to ``last.pt``. A file that
loads but is not a checkpoint of this suite (another program's ``{'state_dict': …}``) counts as
unreadable (:func:`load_checked`).
"""

from __future__ import annotations

import os
import random
import re
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from src.errors import SuiteError

from . import atomic

PREVIOUS = "previous.pt"
BEST = "best.pt"


class CheckpointError(SuiteError):
    """A checkpoint cannot be written, or no checkpoint of a run folder can be read."""


def rng_state() -> dict[str, Any]:
    """Python's, NumPy's, torch's and (where present) CUDA's RNG states, as safe types."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": {
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": pos,
            "has_gauss": has_gauss,
            "gauss": gauss,
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    n = state["numpy"]
    np.random.set_state(
        ("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"])
    )
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save(state: dict[str, Any], path: Path, keep_previous: bool = True) -> None:
    """Write ``state`` to ``path`` whole (:func:`atomic.writing`), keeping the checkpoint it
    replaces as ``previous.pt`` beside it, set aside only once the new one is on disk (unless
    ``keep_previous`` is false: ``best.pt`` replaces its predecessor and leaves ``last.pt``'s
    rotation alone)."""
    path.parent.mkdir(parents=True, exist_ok=True)

    def rotate() -> None:
        if keep_previous and path.exists():
            os.replace(path, path.with_name(PREVIOUS))

    try:
        with atomic.writing(path, before_replace=rotate) as f:
            torch.save(state, f)
    except (OSError, RuntimeError) as error:  # a full disk, a quota, a vanished mount (torch's zip
        kept = f"{path} is kept" if path.exists() else "no earlier checkpoint exists"  # writer: a
        free = shutil.disk_usage(path.parent).free / 2**20  # short write is a RuntimeError)
        reason = str(error).splitlines()[0]
        message = f"cannot write checkpoint {path} ({reason}; {free:.0f} MB free on its disk); {kept}"
        raise CheckpointError(message) from error


def load(path: Path, device: torch.device | str = "cpu") -> dict[str, Any]:
    return torch.load(path, map_location=device, weights_only=True)


def load_latest(
    path: Path,
    device: torch.device | str = "cpu",
    set_aside: bool = True,
    note: Callable[[str], None] | None = None,
) -> tuple[dict[str, Any], Path] | None:
    """The newest readable checkpoint and its path: ``path`` (``last.pt``), else ``previous.pt``
    beside it; None when the run has none yet.

    An unreadable ``last.pt`` (truncated, corrupt, refused by the safe loader, or a file that is
    not a training state of the suite, e.g. another library's ``{'state_dict': …}``) is moved to
    ``last.pt.corrupt`` (``set_aside``, the main process) with one ``note`` (default: a warning),
    so that the next save cannot rotate it into ``previous.pt`` over the good one. When neither
    can be read, both stay where they are and :class:`CheckpointError` says why for each."""
    candidates = [p for p in (path, path.with_name(PREVIOUS)) if p.exists()]
    failures: list[tuple[Path, str]] = []
    for candidate in candidates:
        try:
            state = load_checked(candidate, device, TRAINING_KEYS)
        except Exception as error:  # noqa: BLE001  truncated, corrupt, or not a checkpoint
            failures.append((candidate, unreadable_reason(error)))
            continue
        if failures:
            bad, reason = failures[0]
            aside = set_aside_path(bad) if set_aside else None
            if aside is not None:
                os.replace(bad, aside)
            say(
                note,
                f"unreadable checkpoint {bad} ({reason})"
                + (f", moved to {aside.name}" if aside is not None else "")
                + f"; resuming from {candidate} (step {state['loop']['step']})",
            )
        return state, candidate
    if failures:
        listed = "; ".join(f"{p.name}: {reason}" for p, reason in failures)
        raise CheckpointError(
            f"no readable checkpoint in {path.parent} ({listed}). The record is left as it is: "
            "trainer.resume=restart moves it to superseded/ and starts over"
        )
    return None


def load_best(
    path: Path,
    device: torch.device | str = "cpu",
    set_aside: bool = True,
    note: Callable[[str], None] | None = None,
) -> dict[str, Any] | None:
    """``best.pt`` as saved (None when there is none); an unreadable one (truncated, corrupt, not
    the suite's) is moved to ``best.pt.corrupt`` (``set_aside``) with one ``note`` and gives None,
    so that its reader falls back to ``last.pt``."""
    if not path.exists():
        return None
    try:
        return load_checked(path, device, BEST_KEYS)
    except Exception as error:  # noqa: BLE001  truncated, corrupt, or not a checkpoint
        aside = set_aside_path(path) if set_aside else None
        if aside is not None:
            os.replace(path, aside)
        moved = f", moved to {aside.name}" if aside is not None else ""
        say(note, f"unreadable checkpoint {path} ({unreadable_reason(error)}){moved}")
        return None


#: What a checkpoint of the suite holds: ``last.pt`` and ``previous.pt`` (the training state), and
#: ``best.pt`` (the best validation's weights).
TRAINING_KEYS = ("model", "loop")
BEST_KEYS = ("model", "step")


def load_checked(path: Path, device: torch.device | str, keys: tuple[str, ...]) -> dict[str, Any]:
    """:func:`load`, and a :class:`CheckpointError` unless the file holds a mapping with ``keys``
    (a file another program wrote loads, but is not a checkpoint of this suite)."""
    state = load(path, device)
    missing = [k for k in keys if not isinstance(state, dict) or k not in state]
    if missing or ("loop" in keys and not isinstance(state["loop"], dict)):
        found = ", ".join(map(repr, list(state)[:4])) if isinstance(state, dict) else type(state).__name__
        raise CheckpointError(
            f"not a checkpoint of this suite: no {' or '.join(map(repr, missing or ['loop']))} entry "
            f"(it holds {found or 'nothing'})"
        )
    problem = field_problem(state)
    if problem:
        raise CheckpointError(f"not a checkpoint of this suite: {problem}")
    return state


def field_problem(state: dict[str, Any]) -> str | None:
    """What is wrong with the fields a reader takes from a checkpoint as they are, or None: its step
    (``loop.step`` of a training state, ``step`` of ``best.pt``) a whole number of at least 0, its
    ``record`` (:meth:`~.session.Session.checkpoint_meta`) an object whose ``identity`` is a hash.
    A file whose step is ``"abc"`` would have its step written into an evaluation's result, one
    whose record is a string would fail later with an AttributeError."""
    loop = state.get("loop")
    step = loop.get("step") if isinstance(loop, dict) else state.get("step")
    if ("step" in state or isinstance(loop, dict)) and (
        not isinstance(step, int) or isinstance(step, bool) or step < 0
    ):
        where = "loop.step" if isinstance(loop, dict) else "step"
        return f"its {where} is {repr(step)[:40]}, not a step"
    record = state.get("record")
    if record is not None and not isinstance(record, dict):
        return f"its 'record' is a {type(record).__name__}, not the record's meta (an object)"
    identity = (record or {}).get("identity")
    if identity is not None and not isinstance(identity, str):
        return f"its record's identity is a {type(identity).__name__}, not a hash"
    return None


def say(note: Callable[[str], None] | None, line: str) -> None:
    """``note(line)``, or a warning where no ``note`` is given."""
    if note is None:
        warnings.warn(line, stacklevel=3)
    else:
        note(line)


def set_aside_path(path: Path) -> Path:
    """``last.pt.corrupt``, or ``last.pt.corrupt.<n>`` when that is taken."""
    aside, n = path.with_name(path.name + ".corrupt"), 1
    while aside.exists():
        aside, n = path.with_name(f"{path.name}.corrupt.{n}"), n + 1
    return aside


def unreadable_reason(error: Exception) -> str:
    """Why a checkpoint could not be read, in one line (torch's own texts run to a paragraph)."""
    text = str(error)
    if "Weights only load failed" in text:
        boilerplate = ("Weights only load failed", "Please file an issue", "Check the documentation")
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        detail = " ".join(line for line in lines if not line.startswith(boilerplate))
        return f"refused by torch's safe loader: {detail.removeprefix('WeightsUnpickler error:').strip()}"
    if isinstance(error, CheckpointError):
        return text
    first = text.strip().splitlines()[0] if text.strip() else ""
    first = first.split(". This is an internal")[0]  # the zip reader's advice follows
    return f"{type(error).__name__}: {first}".rstrip(": ")


def mismatch_summary(error: RuntimeError) -> str:
    """torch's ``load_state_dict`` error in a line: how many weights are missing, unexpected or
    of another shape, with the first of each."""
    text, parts = str(error), []
    for label, heading in (("missing", "Missing key(s)"), ("unexpected", "Unexpected key(s)")):
        listed = re.search(re.escape(heading) + r" in state_dict: (.*)", text)
        if listed and (keys := re.findall(r'"([^"]+)"', listed.group(1))):
            parts.append(f"{len(keys)} {label} weights, e.g. {keys[0]}")
    if shapes := re.findall(r"size mismatch for ([^:]+):", text):
        parts.append(f"{len(shapes)} of another shape, e.g. {shapes[0]}")
    return "; ".join(parts) or text.strip().splitlines()[0]
