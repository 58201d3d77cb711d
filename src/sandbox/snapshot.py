"""A snapshot: every layer of a sandbox model on a fixed probe batch, at one step, on disk.

Saved as ``<run_dir>/sandbox/snapshots/step_<step>.npz`` (numpy arrays, no pickle), so
frames, pages and comparisons can be redrawn from a finished run without its model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from torch import Tensor, nn

from src.conditioning.precision import full_fp32
from src.engine.record import atomic


@dataclass
class Snapshot:
    """Arrays of one step: the probe batch, its layers' clouds and the query's attention.

    Attributes:
        step: optimizer steps taken when it was drawn.
        tokens: ``(B, L)`` probe sequences; ``targets``, ``partial_sums``: ``(B,)``.
        clouds: in layer order, ``(B, N, D)`` token clouds or ``(B, D)`` sequence clouds.
        attention: ``(B, H, N)`` attention of the query over the positions, per layer.
        readout: ``(V, D)`` tied output embedding; ``query``: ``(D,)`` or ``None``.
        k: the number of positions that matter (the first ``k`` of the sequence).
    """

    step: int
    tokens: np.ndarray
    targets: np.ndarray
    partial_sums: np.ndarray
    k: int
    clouds: dict[str, np.ndarray] = field(default_factory=dict)
    attention: dict[str, np.ndarray] = field(default_factory=dict)
    readout: np.ndarray | None = None
    query: np.ndarray | None = None

    def save(self, path: Path) -> None:
        arrays = {
            "step": np.array(self.step),
            "k": np.array(self.k),
            "tokens": self.tokens,
            "targets": self.targets,
            "partial_sums": self.partial_sums,
            **{f"cloud/{n}": a for n, a in self.clouds.items()},
            **{f"attention/{n}": a for n, a in self.attention.items()},
        }
        if self.readout is not None:
            arrays["readout"] = self.readout
        if self.query is not None:
            arrays["query"] = self.query
        path.parent.mkdir(parents=True, exist_ok=True)
        order = np.array(list(self.clouds) + ["|"] + list(self.attention))
        with atomic.writing(path) as handle:  # its temporary hidden from snapshot_steps until complete
            np.savez_compressed(handle, **arrays, order=order)

    @classmethod
    def load(cls, path: Path) -> Snapshot:
        with np.load(path, allow_pickle=False) as data:
            order = [str(n) for n in data["order"]]
            split = order.index("|")
            return cls(
                step=int(data["step"]),
                k=int(data["k"]),
                tokens=data["tokens"],
                targets=data["targets"],
                partial_sums=data["partial_sums"],
                clouds={n: data[f"cloud/{n}"] for n in order[:split]},
                attention={n: data[f"attention/{n}"] for n in order[split + 1 :]},
                readout=data["readout"] if "readout" in data else None,
                query=data["query"] if "query" in data else None,
            )


def take_snapshot(model: nn.Module, x: Tensor, y: Tensor, sums: Tensor, k: int, step: int) -> Snapshot:
    """Trace ``model`` (a sandbox model: it has ``trace(x)``) on the probe batch ``x``, in fp32 with
    autocast off whatever the caller's (:func:`src.conditioning.precision.full_fp32`)."""
    was_training = model.training
    model.eval()
    try:
        with full_fp32():
            trace = model.trace(x)
    finally:
        model.train(was_training)

    def array(t: Tensor | None) -> np.ndarray | None:
        return None if t is None else t.detach().float().cpu().numpy()

    return Snapshot(
        step=step,
        tokens=x.cpu().numpy(),
        targets=y.cpu().numpy(),
        partial_sums=sums.cpu().numpy(),
        k=k,
        clouds={n: array(t) for n, t in trace.clouds.items()},
        attention={n: array(t) for n, t in trace.attention.items()},
        readout=array(trace.readout),
        query=array(trace.query),
    )


def snapshot_path(sandbox_dir: Path, step: int) -> Path:
    return sandbox_dir / "snapshots" / f"step_{step:07d}.npz"


def snapshot_steps(sandbox_dir: Path, up_to: int | None = None) -> list[int]:
    """The steps with a saved snapshot, in order (those ``≤ up_to`` when given)."""
    steps = sorted(int(p.stem.split("_")[1]) for p in (sandbox_dir / "snapshots").glob("step_*.npz"))
    return [s for s in steps if up_to is None or s <= up_to]
