"""Checkpoints: everything a run needs to continue bit for bit, written atomically.

``last.pt`` holds the model, optimizer, scheduler and EMA states, the step, the data
stream's position, every RNG state and the loop's running state. It is written to a
temporary file and renamed, so a kill never leaves half a checkpoint, and the one it
replaces is kept as ``previous.pt``: if ``last.pt`` is truncated or corrupt (a full disk, a
copy gone wrong), :func:`load_latest` says so and resumes from ``previous.pt``. Checkpoints
load with ``weights_only=True`` (RNG states are stored as tensors and plain Python values).
"""

from __future__ import annotations

import os
import random
import shutil
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from src.errors import SuiteError

PREVIOUS = "previous.pt"


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


def save(state: dict[str, Any], path: Path) -> None:
    """Write ``state`` to ``path`` atomically (a temporary file, flushed, then renamed), keeping
    the checkpoint it replaces as ``previous.pt`` beside it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
    except (OSError, RuntimeError) as error:  # a full disk, a quota, a vanished mount (torch's zip
        tmp.unlink(missing_ok=True)  # writer reports a short write as a RuntimeError)
        kept = f"{path} is kept" if path.exists() else "no earlier checkpoint exists"
        free = shutil.disk_usage(path.parent).free / 2**20
        reason = str(error).splitlines()[0]
        message = f"cannot write checkpoint {tmp} ({reason}; {free:.0f} MB free on its disk); {kept}"
        raise CheckpointError(message) from error
    if path.exists():
        os.replace(path, path.with_name(PREVIOUS))
    os.replace(tmp, path)


def load(path: Path, device: torch.device | str = "cpu") -> dict[str, Any]:
    return torch.load(path, map_location=device, weights_only=True)


def load_latest(path: Path, device: torch.device | str = "cpu") -> dict[str, Any] | None:
    """The newest readable checkpoint: ``path`` (``last.pt``), else ``previous.pt`` beside it,
    with a warning that names the unreadable file; None when the run has none yet."""
    candidates = [p for p in (path, path.with_name(PREVIOUS)) if p.exists()]
    failures = []
    for candidate in candidates:
        try:
            state = load(candidate, device)
        except Exception as error:  # noqa: BLE001  truncated, corrupt, or not a checkpoint
            failures.append(f"{candidate} ({type(error).__name__}: {str(error).splitlines()[0][:200]})")
            continue
        if failures:
            warnings.warn(
                f"unreadable checkpoint {failures[0]}; resuming from {candidate} "
                f"(step {state['loop']['step']})",
                stacklevel=2,
            )
        return state
    if failures:
        raise CheckpointError(
            f"no readable checkpoint: {'; '.join(failures)}. Delete the folder's checkpoints/ to start over"
        )
    return None
