"""Sparse modular addition generates its data: nothing to write. Small sets, no frames
(the sandbox's frames, page and GIF are tested in tests/sandbox/)."""

from __future__ import annotations

from pathlib import Path

OVERRIDES = {
    "modadd": [
        "task.train_size=64",
        "task.test_size=64",
        "task.batch_size=16",
        "task.eval_batch_size=64",
        "task.sandbox.frames=false",
    ]
}


def prepare(data_dir: Path) -> None:
    return None
