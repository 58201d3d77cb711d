"""BERT's masking (Devlin et al., 2019, section 3.1), as pure functions of the ids and a generator.

Each token that is not special is selected with probability ``prob``; the model is trained to
predict the selected tokens from an input in which 80% of them are replaced by ``[MASK]``, 10% by
a random token and 10% left unchanged (so that the model cannot learn that only ``[MASK]``
positions matter). Special tokens (``[PAD]``, ``[UNK]``, ``[CLS]``, ``[SEP]``, ``[MASK]``) are never
selected, and random tokens are drawn from the ordinary (non-special) ids only.

Randomness comes from an explicit ``torch.Generator``, never the global RNGs, and the number of
draws depends on the batch's shape alone: the same generator state gives the same masks, and a
generator restored from a checkpoint continues the stream exactly. The draws are made on the
generator's device and moved to the ids' device, so the masks do not depend on where the ids are.
:func:`indexed_mask_tokens` seeds one generator per sample from its index: evaluation masks that
are the same in every validation of every run.

Sparse prediction (Cramming's): :func:`masked_logits` runs the decoder on the masked positions only,
without a host sync. Picking them with the boolean mask (``states[mask]``) gives a tensor whose
shape depends on the values: on a GPU the host waits for the mask, once per micro-batch. Cramming
gathers a fixed number of positions instead (``argsort`` of the mask, the last
``round(sparse_prediction · B·N)``), which is exact because its data masks a fixed share of every
batch. Here the number masked varies (each token is drawn), so the number of positions gathered is
a bound known on the host: the draws are made on the CPU generator, and the tokens drawn under
``prob`` (:func:`selection_bound`) include every masked one (specials drawn too are never masked).
:func:`masked_positions` lists the masked positions first, in the order ``x[mask]`` lists them,
then unmasked ones up to the bound, marked invalid; the loss ignores those. The loss is the same.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

MASK_SHARE = 0.8  # of the selected tokens, replaced by [MASK]
RANDOM_SHARE = 0.1  # replaced by a random ordinary token; the remaining 0.1 stay as they are
EVAL_SEED = 0x5EED_0000_0000  # evaluation sample i masks with a generator seeded EVAL_SEED + i


def ordinary_ids(vocab_size: int, special_ids: Sequence[int], device: torch.device | str = "cpu") -> Tensor:
    """The ids that are not special, ascending: ``(vocab_size - #specials,)``."""
    ids = torch.arange(vocab_size, device=device)
    return ids[~torch.isin(ids, torch.as_tensor(list(special_ids), device=device))]


def draw(
    shape: torch.Size, vocab_size: int, special_ids: Sequence[int], generator: torch.Generator
) -> tuple[Tensor, Tensor, Tensor]:
    """The random numbers masking a batch of ``shape`` uses, on the generator's device: a uniform
    for selection, a uniform for the kind of replacement and a random ordinary id, each of ``shape``."""
    device = generator.device
    select = torch.rand(shape, generator=generator, device=device)  # (B, N)
    kind = torch.rand(shape, generator=generator, device=device)  # (B, N)
    ordinary = ordinary_ids(vocab_size, special_ids, device)
    pick = torch.randint(len(ordinary), shape, generator=generator, device=device)  # (B, N)
    return select, kind, ordinary[pick]


def apply(
    ids: Tensor, draws: tuple[Tensor, Tensor, Tensor], prob: float, special_ids: Sequence[int], mask_id: int
) -> tuple[Tensor, Tensor]:
    """``(inputs, targets_mask)`` of ``ids`` under ``draws`` (see :func:`draw`), on the ids' device."""
    select, kind, random_ids = (t.to(ids.device, non_blocking=True) for t in draws)
    special = torch.isin(ids, torch.as_tensor(list(special_ids), device=ids.device))  # (B, N)
    selected = (select < prob) & ~special  # (B, N)
    masked = selected & (kind < MASK_SHARE)
    randomised = selected & (kind >= MASK_SHARE) & (kind < MASK_SHARE + RANDOM_SHARE)
    inputs = torch.where(masked, torch.full_like(ids, mask_id), ids)
    inputs = torch.where(randomised, random_ids.to(ids.dtype), inputs)
    return inputs, selected


def selection_bound(select: Tensor, prob: float) -> int:
    """How many positions :func:`apply` can select at most from the uniforms ``select`` (see
    :func:`draw`): those under ``prob``, specials included. Read where the draws are: on the CPU
    generator's host tensors it waits for no GPU; on any other device it is every position."""
    if select.device.type != "cpu":
        return select.numel()
    return int((select < prob).sum())


def masked_positions(mask: Tensor, bound: int) -> tuple[Tensor, Tensor]:
    """``(positions (K,), valid (K,))`` with ``K = min(bound, B·N)``: the flat indices of the masked
    entries of ``mask (B, N)``, in the row-major order ``x[mask]`` gives, then unmasked ones
    (``valid`` false); with ``bound`` at least the number masked, every masked one is there. Shapes
    fixed by ``bound``, known on the host: no sync."""
    flat = mask.flatten()  # (B·N,)
    order = torch.argsort((~flat).to(torch.uint8), stable=True)[: min(bound, flat.numel())]  # masked first
    return order, flat[order]


def mask_tokens(
    ids: Tensor,
    prob: float,
    vocab_size: int,
    special_ids: Sequence[int],
    mask_id: int,
    generator: torch.Generator,
) -> tuple[Tensor, Tensor]:
    """BERT's 80/10/10 masking of ``ids`` ``(B, N)`` int64: ``(inputs (B, N), targets_mask (B, N)
    bool)``, where ``targets_mask`` marks the selected positions, whose targets are ``ids`` there.
    Advances ``generator`` by an amount fixed by the shape."""
    return apply(ids, draw(ids.shape, vocab_size, special_ids, generator), prob, special_ids, mask_id)


def indexed_mask_tokens(
    ids: Tensor,
    indices: Sequence[int] | Tensor,
    prob: float,
    vocab_size: int,
    special_ids: Sequence[int],
    mask_id: int,
) -> tuple[Tensor, Tensor]:
    """:func:`mask_tokens` of ``ids`` ``(B, N)`` with row ``b`` masked by a CPU generator seeded
    ``EVAL_SEED + indices[b]``: each sample's mask is a function of its index alone (not of the
    batch it is in, the run's seed or anything drawn before)."""
    return apply(ids, indexed_draws(ids.shape, indices, vocab_size, special_ids), prob, special_ids, mask_id)


def indexed_draws(
    shape: torch.Size, indices: Sequence[int] | Tensor, vocab_size: int, special_ids: Sequence[int]
) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`draw`'s numbers for a batch of ``shape (B, N)``, row ``b`` from a CPU generator seeded
    ``EVAL_SEED + indices[b]`` (the indices read on the host)."""
    rows = [
        draw(shape[1:], vocab_size, special_ids, torch.Generator().manual_seed(EVAL_SEED + int(i)))
        for i in torch.as_tensor(indices).tolist()
    ]
    return tuple(torch.stack(parts) for parts in zip(*rows, strict=True))  # 3 × (B, N)


def unwrap(model: nn.Module) -> nn.Module:
    """The bare model inside DDP and ``torch.compile`` wrappers."""
    while True:
        if isinstance(model, DistributedDataParallel):
            model = model.module
        elif isinstance(getattr(model, "_orig_mod", None), nn.Module):  # torch.compile's OptimizedModule
            model = model._orig_mod
        else:
            return model


def masked_logits(model: nn.Module, inputs: Tensor, positions: Tensor) -> Tensor:
    """Logits ``(K, V)`` at the flat ``positions (K,)`` of ``inputs (B, N)`` (:func:`masked_positions`).
    The bare model predicts sparsely (the decoder sees those states only); a DDP or compiled
    wrapper goes through ``forward`` (every position's logits, then those: the same values, more
    work), since calling the wrapped model's methods would bypass DDP's gradient synchronisation.
    The model has CrammedBERT's ``encode`` and ``mlm_logits``, and its ``forward`` returns
    ``(B, N, V)`` logits."""
    if unwrap(model) is model:
        hidden = model.encode(inputs, None).flatten(0, 1)[positions]  # (B, N, D) -> (K, D)
        return model.mlm_logits(hidden)  # (K, V)
    return model(inputs).flatten(0, 1)[positions]  # (B, N, V) -> (K, V)
