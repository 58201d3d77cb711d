"""The conditioning monitor: every κ the papers talk about, as a flat dict of named scalars.

A training loop calls it every ``k`` steps, with a batch of model inputs::

    monitor = ConditioningMonitor(model)
    logger.log(monitor(images), step=step)

What it measures, for every attention site of the model (see :mod:`src.attention.sites`):

* ``W_Q``, ``W_K``, ``W_V``: κ of each head's *effective* ``D×d`` weight, corrections
  included (``spectral``'s ``W + C`` is what the parametrized weight returns);
* ``X``: κ of the token matrix entering the attention module (after its pre-norm), per
  sample; for windowed attention (Swin, DaViT), per window;
* ``P``: κ of each head's attention probabilities, from the module's explicit path
  (sites that never materialise ``P``, DaViT's channel attention, report none);
* ``A``: κ of each head's output as it enters the output projection (after ``precond``'s
  ``C`` when that variant is applied); single-row outputs (class attention) are skipped;
* ``entropy/P``: each row's entropy of ``P`` over the log of the number of keys it may attend
  to (masked keys excluded; 1 uniform, 0 one-hot), to see
  whether a variant saturates the softmax (``spectral`` with a large ``lam`` does);
* ``tokens``: κ of each sample's embedded tokens entering the first layer (after
  ``cond_tokens``' correction when applied), where the model's token entry is known; for a
  causal decoder, whose per-sample embeddings repeat rows wherever a token repeats, κ of the
  (conditioned) embedding table instead, ``kappa/tokens/table``;
* ``bound`` (option): ``B(J)`` of each head on the first sample, token attention only,
  with ``P`` recomputed from ``X`` and the weights (no position bias or mask).

Keys: ``kappa/<q>/median`` and ``kappa/<q>/max`` over the whole model, and with
``per_layer`` ``kappa/<q>/<site name>`` (the median over that module's heads and samples);
``entropy/P/…`` and ``bound/…`` likewise. With ``nonzero_rtol`` every κ
is taken over the singular values above ``nonzero_rtol · σ_max``; the bound always uses
the non-zero rule for ``Λ(P)`` (docs/methods.md#condition-numbers, ``1e-7``).

Precision: everything is computed in fp32 (the singular values in float64), with autocast off and
TF32 off whatever the caller's context (:func:`~.precision.full_fp32`), and float16/bfloat16 inputs
made float32: a bf16 training run logs the κ an fp32 run would for the same weights and batch.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from typing import Any

import torch
from torch import Tensor, nn

from src.attention import AttentionConfigError, AttentionSite, find_sites, find_token_entry

from .jacobian import jacobian_bound
from .kappa import kappa, kappa_from_gram
from .precision import as_fp32, full_fp32


class ConditioningMonitor:
    """Collects the κ diagnostics of ``model`` (see the module docstring for the keys)."""

    def __init__(
        self,
        model: nn.Module,
        samples: int = 2,
        nonzero_rtol: float | None = None,
        per_layer: bool = True,
        bound: bool = False,
    ) -> None:
        self.model, self.samples, self.nonzero_rtol = model, samples, nonzero_rtol
        self.per_layer, self.bound = per_layer, bound
        self.sites = find_sites(model)
        try:
            self.entry = find_token_entry(model)
        except AttentionConfigError:
            self.entry = None

    @torch.no_grad()
    def weights(self) -> dict[str, float]:
        """κ of the effective per-head ``W_Q``, ``W_K``, ``W_V`` (no forward pass needed), in fp32."""
        values: dict[str, dict[str, Tensor]] = defaultdict(dict)
        with full_fp32():  # a parametrized weight (spectral's W + C) is computed here
            for site in self.sites:
                for key, w in site.head_weights().items():  # (H, D, d)
                    values[f"kappa/{key}"][site.name] = kappa_from_gram(w, self.nonzero_rtol)
            if self.entry is not None and self.entry.causal:
                values["kappa/tokens"]["table"] = self._table_kappa()
        return self._summarise(values)

    def _table_kappa(self) -> Tensor:
        """κ of the embedding table a causal entry draws tokens from, with whatever the entry's
        registered transforms (``cond_tokens``' correction) do to it (:meth:`TokenEntry.table`),
        from the eigenvalues of its ``D×D`` Gram (no ``V×D`` factorisation)."""
        return kappa_from_gram(self.entry.table(), self.nonzero_rtol)  # table (V, D)

    @torch.no_grad()
    def __call__(self, *args: Any, **kwargs: Any) -> dict[str, float]:
        """Weights and activations: one forward, in eval mode and fp32 (module docstring), on the
        first ``samples`` inputs."""
        args, kwargs = as_fp32(_first(args, self.samples)), as_fp32(_first(kwargs, self.samples))
        with full_fp32():
            captured = self._forward(*args, **kwargs)
        values: dict[str, dict[str, Tensor]] = defaultdict(dict)
        for site in self.sites:
            seen = captured[site.name]
            if "X" in seen:
                values["kappa/X"][site.name] = kappa(seen["X"], self.nonzero_rtol)
            if "P" in seen:
                values["kappa/P"][site.name] = kappa(seen["P"], self.nonzero_rtol)
                values["entropy/P"][site.name] = normalized_entropy(seen["P"])
            if "A" in seen:
                heads = seen["A"].unflatten(-1, (site.num_heads, -1)).transpose(-2, -3)  # (…, H, N, d)
                if heads.shape[-2] > 1:
                    values["kappa/A"][site.name] = kappa(heads, self.nonzero_rtol)
            if self.bound and site.kind == "token" and "X" in seen:
                values["bound"][site.name] = self._bound(site, seen["X"][0])
        if "tokens" in captured:
            values["kappa/tokens"]["entry"] = kappa(captured["tokens"]["tokens"], self.nonzero_rtol)
        return {**self.weights(), **self._summarise(values)}

    def _forward(self, *args: Any, **kwargs: Any) -> dict[str, dict[str, Tensor]]:
        """Run the model once with capture hooks; ``{site name: {"X"|"P"|"A": tensor}}``."""
        captured: dict[str, dict[str, Tensor]] = defaultdict(dict)

        def keep(name: str, key: str, t: Tensor) -> None:
            captured[name].setdefault(key, t.detach())

        handles = []
        for site in self.sites:
            handles.append(
                site.module.register_forward_pre_hook(lambda m, a, n=site.name: keep(n, "X", a[0]))
            )
            handles.append(
                site.head_output.register_forward_pre_hook(lambda m, a, n=site.name: keep(n, "A", a[0]))
            )
            if site.probs is not None and site.probs_at == "input":
                handles.append(
                    site.probs.register_forward_pre_hook(lambda m, a, n=site.name: keep(n, "P", a[0]))
                )
            elif site.probs is not None:
                handles.append(site.probs.register_forward_hook(lambda m, a, o, n=site.name: keep(n, "P", o)))
        if self.entry is not None and not self.entry.causal:
            handles.append(self.entry.observe(lambda tokens: keep("tokens", "tokens", tokens)))
        was_training = self.model.training
        try:
            self.model.eval()
            with contextlib.ExitStack() as stack:
                for site in self.sites:
                    stack.enter_context(site.explicit())
                self.model(*args, **kwargs)
        finally:
            self.model.train(was_training)
            for h in handles:
                h.remove()
        return captured

    def _bound(self, site: AttentionSite, x: Tensor) -> Tensor:
        """``B(J)`` of each head of ``site`` on one token matrix ``x (N, D)``; ``(H,)``."""
        w = site.head_weights()  # each (H, D, d)
        scale = getattr(site.module, "scale", site.head_dim**-0.5)
        return jacobian_bound(x.double(), *(w[k].double() for k in ("W_Q", "W_K", "W_V")), scale=scale)

    def _summarise(self, values: dict[str, dict[str, Tensor]]) -> dict[str, float]:
        """``{prefix: {site: values}}`` -> ``prefix/median``, ``prefix/max``, ``prefix/<site>``."""
        out: dict[str, float] = {}
        for prefix, per_site in values.items():
            flat = torch.cat([v.reshape(-1) for v in per_site.values()])
            out[f"{prefix}/median"] = flat.median().item()
            out[f"{prefix}/max"] = flat.max().item()
            if self.per_layer:
                for name, v in per_site.items():
                    out[f"{prefix}/{name}"] = v.reshape(-1).median().item()
        return out


def normalized_entropy(p: Tensor) -> Tensor:
    """Entropy of each row of ``p (…, n, m)`` over the log of its support (the keys with
    non-zero probability: a causal or padded row attends to fewer than ``m``); rows with a
    single key, whose entropy is 0 by necessity, are left out. When every row has a single
    key the softmax is saturated (``spectral`` at ``lam=10`` on W_Q and W_K does that): every
    row is one-hot, and the entropies are zeros.

    An approximate attention matrix (Nyström's ``P̃ = K₁ K₂⁺ K₃``) has rows that only sum to
    about 1 and may hold negative entries: its rows are read as distributions after clipping
    negatives to 0 and renormalising (exact for a softmax's ``P``). Flat ``(rows,)``."""
    p = p.double().flatten(0, -2).clamp_min(0)  # (rows, m)
    p = p / p.sum(-1, keepdim=True).clamp_min(1e-300)
    support = (p > 0).sum(-1)
    keep = support > 1
    if not keep.any():
        return torch.zeros(len(p), dtype=p.dtype, device=p.device)
    entropy = -(p * p.clamp_min(1e-300).log()).sum(-1)
    return entropy[keep] / support[keep].double().log()


def _first(obj: Any, n: int) -> Any:
    """The first ``n`` rows of every tensor in ``obj`` (tuples, lists and dicts are walked)."""
    if isinstance(obj, Tensor):
        return obj[:n] if obj.dim() > 0 else obj
    if isinstance(obj, dict):
        return {k: _first(v, n) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_first(v, n) for v in obj)
    return obj
