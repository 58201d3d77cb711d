"""P5's clustering head, measured: where the query looks, and whether its output sorts by the sum.

P5's finding: the head that solves sparse modular addition attends to the ``k`` positions that
matter and *groups* the sequences by what those tokens contribute, their partial sum
``x_1 + … + x_k``; the classifier then only has to read the group. Two numbers per attention
layer make that measurable on any sandbox snapshot (:class:`src.sandbox.snapshot.Snapshot`):

* **focus** (per head): the query's attention mass on the first ``k`` positions, mean over the
  batch, chance-corrected: ``(mass − k/L) / (1 − k/L)``, so 0 for a uniform head and 1 for a
  head that looks only at the first ``k`` tokens (negative: it looks away from them);
* **clustering** (per layer): the correlation ratio η² of the layer's pooled output grouped by
  the partial sum: the share of the output's variance (summed over its ``D`` coordinates) that
  lies between the groups' means. 1: the output is a function of the partial sum (the groups
  are points); near ``k/L``-ish values: the output mixes in the other tokens. [reading] η²
  rather than a silhouette: it is bounded, needs no distance, and is exact for collinear
  groups, which a 2-D sandbox produces.

The pooled output is the reference model's ``attention output`` cloud; for the multi-head
sandbox, the query token's state after the block (``block<i>[:, 0]``): heads are mixed there by
the block's projection, so its clustering is per layer, its focus per head. When the head
emerges over training: :func:`src.sandbox.stages.emergence`, the end of the first rise of the
clustering series, found by the threshold-free segmentation of that module.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from .snapshot import Snapshot, snapshot_path, snapshot_steps, take_snapshot


def correlation_ratio(points: np.ndarray, groups: np.ndarray) -> float:
    """η² of ``points (B, D)`` grouped by ``groups (B,)``: between-group over total sum of squares."""
    points = points.reshape(len(points), -1).astype(float)
    centred = points - points.mean(0)
    total = float((centred**2).sum())
    if total == 0.0:
        return 0.0
    between = 0.0
    for g in np.unique(groups):
        members = centred[groups == g]
        between += len(members) * float((members.mean(0) ** 2).sum())
    return between / total


def pooled_output(snapshot: Snapshot, layer: str) -> np.ndarray | None:
    """The ``(B, D)`` sequence representation an attention layer produces (see the module docstring)."""
    cloud = snapshot.clouds.get(layer)
    if cloud is not None:
        return cloud[:, 0] if cloud.ndim == 3 else cloud
    return snapshot.clouds.get("attention output")


def clustering_heads(snapshot: Snapshot) -> dict[str, float]:
    """``cluster/<layer>/focus/h<i>`` and ``cluster/<layer>/clustering`` for every attention layer."""
    seq_len, k = snapshot.tokens.shape[1], snapshot.k
    out: dict[str, float] = {}
    for layer, attention in snapshot.attention.items():  # (B, H, N), N = L or 1 + L (query token)
        offset = attention.shape[-1] - seq_len
        mass = attention[:, :, offset : offset + k].sum(-1).mean(0)  # (H,)
        chance = k / seq_len
        for h, m in enumerate(mass):
            out[f"cluster/{layer}/focus/h{h}"] = float((m - chance) / (1 - chance)) if k < seq_len else 1.0
        pooled = pooled_output(snapshot, layer)
        if pooled is not None:
            out[f"cluster/{layer}/clustering"] = correlation_ratio(pooled, snapshot.partial_sums)
    return out


def clustering_head(model: nn.Module, x: Tensor, k: int) -> dict[str, float]:
    """:func:`clustering_heads` of a sandbox model on the batch ``x (B, L)``: focus and clustering."""
    sums = x[:, :k].sum(dim=1)
    return clustering_heads(take_snapshot(model, x, torch.zeros_like(sums), sums, k, 0))


def clustering_series(sandbox_dir: Path) -> tuple[list[int], dict[str, list[float]]]:
    """Focus and clustering at every snapshot a run saved (``<run_dir>/sandbox``), read after the
    fact: ``(steps, {key: values})``. A resumed run, whose snapshots are those of an uninterrupted
    one, gives the same series."""
    steps = snapshot_steps(Path(sandbox_dir))
    series: dict[str, list[float]] = {}
    for i, step in enumerate(steps):
        for key, value in clustering_heads(Snapshot.load(snapshot_path(Path(sandbox_dir), step))).items():
            series.setdefault(key, [float("nan")] * i).append(value)
    return steps, series


def last_layer(found: dict[str, float]) -> tuple[float, float]:
    """The last attention layer's clustering and its heads' largest focus, from :func:`clustering_heads`."""
    layers = list(dict.fromkeys(key.split("/")[1] for key in found))
    last = next(layer for layer in reversed(layers) if f"cluster/{layer}/clustering" in found)
    heads = [v for key, v in found.items() if key.startswith(f"cluster/{last}/focus/")]
    return found[f"cluster/{last}/clustering"], max(heads)


def probe_seeds(
    model: nn.Module, state: dict[str, Tensor], x: Tensor, k: int
) -> tuple[list[float], list[float]]:
    """Each seed's clustering head, for seeds trained as one stacked model
    (:mod:`src.sandbox.seeds`): seed ``i``'s weights ``{name: state[name][i]}`` loaded into
    ``model`` (one seed's module, the same architecture), traced on its probe ``x[i] (B, L)``;
    per seed, :func:`last_layer`'s clustering and focus. ``model``'s own weights are overwritten."""
    clustering, focus = [], []
    kept = model.state_dict().keys()  # not the buffers a module keeps out of its state
    with torch.no_grad():
        for i in range(x.shape[0]):
            model.load_state_dict({name: state[name][i] for name in kept})
            c, f = last_layer(clustering_head(model, x[i], k))
            clustering.append(c)
            focus.append(f)
    return clustering, focus
