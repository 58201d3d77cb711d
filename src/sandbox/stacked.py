"""Seeds of the sandbox as one stacked model, for :mod:`src.sandbox.seeds`: each seed's model and
data built as its own run builds them, their weights stacked along a leading seed axis, the
functions that run every seed at once under :func:`torch.vmap`, and a set's final weights on disk
(safetensors: tensors only, nothing in the file runs)."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from omegaconf import DictConfig, OmegaConf
from torch import Tensor, nn

from src.engine.record import atomic
from src.errors import ConfigError

from .curves import Curves


def seed_config(cfg: DictConfig, seed: int, data_dir: Path) -> DictConfig:
    """``cfg`` as ``seed=<seed> paths.data_dir=<data_dir>`` composes it (``task.data_seed``
    follows ``${seed}``)."""
    out = copy.deepcopy(cfg)
    OmegaConf.set_struct(out, False)
    out.seed = seed
    out.paths.data_dir = str(data_dir)
    return out


def build_seed(cfg: DictConfig, seed: int, data_dir: Path) -> tuple[nn.Module, tuple, tuple]:
    """Seed ``seed``'s model, training set and test set, built as its own run builds them
    (:func:`src.engine.loop.prepared.prepared`)."""
    from src.engine.loop.prepared import prepared

    _, (train, test), model = prepared(seed_config(cfg, seed, data_dir))
    return model, tuple(train.tensors), tuple(test.tensors)


@dataclass
class Stacked:
    """Every seed's model as one functional model: parameters and data with a leading seed axis."""

    base: nn.Module  # one seed's model on the meta device: the function every seed runs
    live: nn.Module  # one seed's model with weights: each seed's are loaded into it to probe it
    trained: dict[str, Tensor]  # (S, …) each
    fixed: dict[str, Tensor]  # parameters that do not train (S, …)
    buffers: dict[str, Tensor]
    x_train: Tensor  # (S, N, L)
    y_train: Tensor  # (S, N)
    x_test: Tensor  # (S, M, L)
    y_test: Tensor  # (S, M)


def stack_seeds(cfg: DictConfig, seeds: Sequence[int], data_dir: Path) -> Stacked:
    """Each seed's model and data built as its own run builds them, stacked along the seed axis."""
    from torch.func import stack_module_state

    built = [build_seed(cfg, s, data_dir) for s in seeds]
    models = [m.train() for m, _, _ in built]
    for model in models:  # SDPA has no batching rule on CPU (vmap would loop over seeds): the
        for module in model.modules():  # explicit softmax path, the same arithmetic
            if hasattr(module, "fused_attn"):
                module.fused_attn = False
    params, buffers = stack_module_state(models)  # each (S, …)
    frozen = {k for k, p in models[0].named_parameters() if not p.requires_grad}
    return Stacked(
        copy.deepcopy(models[0]).to("meta"),
        copy.deepcopy(models[0]),
        {k: v for k, v in params.items() if k not in frozen},
        {k: v for k, v in params.items() if k in frozen},
        buffers,
        *(torch.stack([b[part][i] for b in built]) for part, i in ((1, 0), (1, 1), (2, 0), (2, 1))),
    )


def stacked_functions(base: nn.Module, compile: bool) -> tuple[Callable, Callable]:
    """The stacked step's loss (the sum of the seeds' mean cross-entropies: each seed's gradient
    is its own) and the seeds' test accuracy and loss, each seed through ``base`` under vmap."""
    from torch.func import functional_call

    def seed_loss(p, b, x, y):  # one seed's mean cross-entropy
        return F.cross_entropy(functional_call(base, (p, b), (x,)), y)

    def seed_eval(p, b, x, y):  # one seed's test accuracy and loss
        out = functional_call(base, (p, b), (x,))
        return (out.argmax(-1) == y).float().mean(), F.cross_entropy(out, y)

    every_seed = torch.vmap(seed_loss)

    def total_loss(p, b, x, y):  # (S, B, L), (S, B) -> the sum of the seeds' losses
        return every_seed(p, b, x, y).sum()

    # trainer.compile: the stacked step through torch.compile (about 2.5× faster on the
    # multi-head sandbox after ~20 s of compiling; the same arithmetic up to float rounding)
    return (torch.compile(total_loss) if compile else total_loss), torch.vmap(seed_eval)


def start_from(st: Stacked, init: dict[str, Tensor]) -> None:
    """Overwrite the stacked weights with ``init``'s, refusing in one line any name or shape that
    differs (another architecture, other seeds)."""
    every = {**st.trained, **st.fixed, **st.buffers}
    own = {k: every[k] for k in st.live.state_dict()}  # what a checkpoint keeps
    missing = sorted(set(own) - set(init))
    extra = sorted(set(init) - set(own))
    shapes = sorted(k for k in set(own) & set(init) if own[k].shape != init[k].shape)
    if missing or extra or shapes:
        found = (("missing there", missing), ("not here", extra), ("other shapes", shapes))
        parts = [f"{what}: {', '.join(names[:4])}" for what, names in found if names]
        raise ConfigError(
            "--init-from: those weights are not this sandbox's with these seeds ("
            + "; ".join(parts)
            + "): fine-tune a set trained with the same backbone, backbone.model.num_embeddings and seeds"
        )
    with torch.no_grad():
        for name, value in own.items():
            value.copy_(init[name])


WEIGHTS = "weights.safetensors"  # a set's final stacked weights: tensors only, nothing that runs


def save_weights(state: dict[str, Tensor], seeds: list[int], path: Path) -> None:
    """The stacked weights ``(S, …)`` of ``seeds`` to a safetensors file (the seeds in its metadata)."""
    from safetensors.torch import save

    atomic.write_bytes(
        path, save({k: v.contiguous() for k, v in state.items()}, metadata={"seeds": json.dumps(seeds)})
    )


def load_weights(folder: Path, seeds: list[int]) -> tuple[dict[str, Tensor], list[float] | None]:
    """A set's final weights for ``seeds`` (the same seeds, in the same order) and, where its
    ``curves.json`` is there, each seed's final test accuracy in that set."""
    from safetensors import safe_open

    path = Path(folder) / WEIGHTS
    if not path.is_file():
        raise ConfigError(
            f"--init-from {folder}: no {WEIGHTS} (python -m src.sandbox.seeds --out {folder} writes it)"
        )
    with safe_open(str(path), framework="pt") as f:
        kept = json.loads((f.metadata() or {}).get("seeds", "null"))
        state = {k: f.get_tensor(k) for k in f.keys()}
    if kept != seeds:
        raise ConfigError(
            f"--init-from {folder}: trained seeds {kept}, not --seeds {seeds}: give the same seeds"
        )
    curves = Path(folder) / "curves.json"
    final = [acc[-1] for acc in Curves.load(curves).acc] if curves.is_file() else None
    return state, final


def save_progress(path: Path, progress: dict) -> None:
    """A seed set's progress (weights, optimizer, curves so far) to ``path``, whole or not at all."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic.writing(path) as handle:
        torch.save(progress, handle)


class DamagedProgress(Exception):
    """A seed set's progress file that cannot be read as one (truncated, corrupt, not a progress)."""


#: What a seed set's progress holds (:func:`src.sandbox.seeds.progress_key` and its weights).
PROGRESS_KEYS = ("seeds", "epochs", "overrides", "epoch", "accs", "losses", "seconds", "holder", "optimizer")


def load_progress(path: Path, seeds: list[int], epochs: int, overrides: list[str]) -> dict:
    """The progress :func:`save_progress` wrote, if it is this set's (its seeds, epochs and
    overrides); read with ``weights_only`` (tensors and plain values: nothing in it runs). A file
    that cannot be read as a progress is :class:`DamagedProgress` (its caller sets it aside)."""
    from src.engine.record.checkpoint import unreadable_reason

    try:
        progress = torch.load(path, weights_only=True)
    except Exception as error:  # noqa: BLE001  truncated, corrupt, refused by the safe loader
        raise DamagedProgress(unreadable_reason(error)) from error
    missing = [k for k in PROGRESS_KEYS if not isinstance(progress, dict) or k not in progress]
    if missing:
        raise DamagedProgress(f"not a seed set's progress: no {', '.join(missing[:3])}")
    kept = (progress.get("seeds"), progress.get("epochs"), progress.get("overrides"))
    if kept != (seeds, epochs, overrides):
        raise ConfigError(
            f"{path} is the progress of another set ({len(kept[0] or [])} seeds × {kept[1]} epochs, "
            f"{' '.join(kept[2] or []) or 'no overrides'}): give another --out, or remove it to start afresh"
        )
    return progress
