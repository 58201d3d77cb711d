"""Loading mmengine's own checkpoints under torch's ``weights_only`` default.

mmengine 0.10 calls ``torch.load`` without ``weights_only``; since torch 2.6 that means
``weights_only=True``, which refuses what an mmengine checkpoint carries besides tensors: its
message hub's history buffers, NumPy arrays and scalars, ``Counter`` (the step schedule's
milestones). These data types are allowed while a run trains, and only they. No function that
reaches other objects (``getattr``, ``eval``) is among them: the history buffers are saved as
:class:`.record.PlainHistoryBuffer`, without the statistics methods mmengine pickles through
``getattr``, so a crafted checkpoint cannot call anything.
"""

from __future__ import annotations

import codecs
import collections
import contextlib
from collections.abc import Iterator

import numpy as np
import torch


def mmengine_globals() -> list:
    """The non-tensor globals an mmengine checkpoint refers to."""
    from .record import PlainHistoryBuffer

    multiarray = (np._core if hasattr(np, "_core") else np.core).multiarray
    return [
        PlainHistoryBuffer,
        collections.Counter,
        codecs.encode,
        np.ndarray,
        np.dtype,
        multiarray._reconstruct,
        multiarray.scalar,
        *{type(np.dtype(t)) for t in ("float64", "float32", "int64", "int32", "bool")},
    ]


@contextlib.contextmanager
def mmengine_checkpoints_load() -> Iterator[None]:
    with torch.serialization.safe_globals(mmengine_globals()):
        yield
