"""What ``cond_tokens``' and ``spectral``'s per-step corrections cost at every recipe's shape.

``python -m launch.tools.bench --skip block model memory overhead --shapes`` (``--shapes vit_base lm_gpt2``
for some) builds each recipe's model (``standard``, full size, random weights), and times:

- **standard's step**: forward and backward at ``--shape-batch`` samples (2; the LRA Nyströmformer's
  at 32, its recipes' smallest micro-batch), scaled linearly to
  the recipe's micro-batch (the compute of a step is linear in the batch; the optimizer's
  batch-independent update is left out, which makes the ratios below larger, not smaller);
- **cond_tokens' correction** of the tokens the model's token entry passes on (``where=block``),
  each method (``regularized``, the default; ``svd``; ``polar``), timed on the recipe's whole
  micro-batch (the entry's tokens at ``--shape-batch`` samples, repeated); on a causal decoder
  the vocabulary map ``M`` from the embedding table instead (``eigh`` for ``svd``, Newton–Schulz
  for the others), once per step whatever the batch;
- **spectral's svd-mode correction** of every head of ``W_Q``, ``W_K``, ``W_V`` (``targets=qkv``,
  the reading's; the default ``targets=q`` costs a third), each method (``newton_schulz``, the
  default; ``eigh``): once per forward, whatever the batch.

Each is reported as ``ratio = 1 + correction / standard's step`` at the recipe's micro-batch
(decomposition time over step time, not a timed step with the variant), and as matrix-product
GFLOP (``torch.utils.flop_counter``; a factorisation's own work is not counted, so ``svd`` and
``eigh`` show their products only): on a GPU the step runs in bf16 and the correction in IEEE
fp32 or fp64, so the GFLOP ratio times the card's bf16-to-fp32 (or fp64) throughput ratio
estimates the correction's share there, and a factorisation adds a per-matrix cuSOLVER call and
a host sync
(docs/benchmark.md, "Variant costs at the recipes' shapes").

The recipes (:data:`RECIPES`) name their configs; ``tests/launch/test_bench_shapes.py`` checks the
shapes and batches against them.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from src import attention
from src.attention.cond_tokens import token_correction, vocabulary_map
from src.attention.polar import exact_fp32

#: ``cond_tokens``' methods, by the form name ``launch.tools.bench`` gives them (FORMS).
TOKEN_METHODS = {"cond_tokens": "regularized", "cond_tokens_svd": "svd", "cond_tokens_polar": "polar"}
#: ``spectral``'s svd-mode methods, by form name.
SPECTRAL_METHODS = {"spectral_svd": "newton_schulz", "spectral_svd_eigh": "eigh"}


@dataclass(frozen=True)
class Recipe:
    """A recipe's model and shapes: ``build()`` the standard model, ``inputs(b)`` a batch of ``b``
    samples at ``length`` tokens, ``batch`` the recipe's micro-batch (``task.batch_size``);
    ``length_scale``: the recipe's tokens per sample over the measured ones (a causal LM is timed
    at a shorter sequence: its step is close to linear in the length, its correction independent
    of it). ``measure_batch``: the samples its step is timed at when not ``--shape-batch`` (a tiny
    model's step at 2 samples is mostly per-call overhead). ``configs``: the files the numbers
    come from."""

    build: Callable[[], nn.Module]
    inputs: Callable[[int], tuple[torch.Tensor, ...]]
    batch: int
    configs: tuple[str, ...]
    length_scale: float = 1.0
    measure_batch: int | None = None


def _timm(name: str) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        import timm

        return timm.create_model(name, num_classes=1000)

    return build


def _images(b: int) -> tuple[torch.Tensor, ...]:
    return (torch.randn(b, 3, 224, 224, generator=torch.Generator().manual_seed(0)),)


def _lra(n: int, dual: bool = False, **model: Any) -> tuple[Callable[[], nn.Module], Callable]:
    """An LRA classifier (the Nyströmformer of ``conf/backbone/nystromformer.yaml`` unless
    ``model`` says otherwise) on ``n`` tokens, every one valid (the padded length, the worst case)."""
    options = {
        "attention": "nystrom",
        "dim": 64,
        "depth": 2,
        "num_heads": 2,
        "head_dim": 32,
        "mlp_dim": 128,
        "num_landmarks": 64,
        "conv_kernel": 35,
        "inverse_iters": 6,
        "pool": "masked_mean",
        **model,
    }

    def build() -> nn.Module:
        from src.models.lra import LRAClassifier

        return LRAClassifier(vocab_size=260, num_classes=10, max_positions=n + 1, dual=dual, **options)

    def inputs(b: int) -> tuple[torch.Tensor, ...]:
        ids = torch.randint(1, 260, (b, n), generator=torch.Generator().manual_seed(0))
        mask = torch.ones(b, n, dtype=torch.bool)
        return (ids, mask, ids.flip(1), mask) if dual else (ids, mask)

    return build, inputs


def _gpt(dim: int, depth: int, heads: int, length: int) -> tuple[Callable[[], nn.Module], Callable]:
    def build() -> nn.Module:
        from src.models.gpt import GPT

        return GPT(50257, 1024, dim=dim, depth=depth, num_heads=heads, vocab_multiple=64)

    def inputs(b: int) -> tuple[torch.Tensor, ...]:
        return (torch.randint(0, 50257, (b, length), generator=torch.Generator().manual_seed(0)),)

    return build, inputs


def _bert() -> tuple[Callable[[], nn.Module], Callable]:
    def build() -> nn.Module:
        from src.models.crammed_bert import CrammedBERT

        return CrammedBERT(32768, max_len=128, dim=768, depth=16, num_heads=12, ffn_dim=3072, drop=0.0)

    def inputs(b: int) -> tuple[torch.Tensor, ...]:
        return (torch.randint(5, 32768, (b, 128), generator=torch.Generator().manual_seed(0)),)

    return build, inputs


#: conf/experiment/lra/transformer_listops.yaml's model (LRA's own softmax transformer, the widest)
_LISTOPS_TRANSFORMER = {"attention": "softmax", "dim": 512, "depth": 6, "num_heads": 8, "head_dim": 64}
_LISTOPS_TRANSFORMER |= {"mlp_dim": 2048, "pool": "cls"}
_LM_MEASURED = 256  # tokens a causal LM is timed at (its recipe: 1024)

#: Every recipe of the paper experiments with its own token shape (deit_base is vit_base's model;
#: the GLUE runs are mlm_crammed_bert's model at its shape; COCO's backbones are not here).
RECIPES: dict[str, Recipe] = {
    "vit_base": Recipe(_timm("vit_base_patch16_224"), _images, 128, ("task/imagenet", "backbone/vit_base")),
    "swin_base": Recipe(
        _timm("swin_base_patch4_window7_224"), _images, 128, ("task/imagenet", "backbone/swin_base")
    ),
    "xcit_medium": Recipe(
        _timm("xcit_medium_24_p16_224"), _images, 128, ("task/imagenet", "backbone/xcit_medium")
    ),
    "davit_base": Recipe(_timm("davit_base"), _images, 128, ("task/imagenet", "backbone/davit_base")),
    "lra_listops": Recipe(*_lra(2048), 32, ("task/lra_listops", "backbone/nystromformer"), measure_batch=32),
    "lra_text": Recipe(*_lra(4096), 32, ("task/lra_text", "backbone/nystromformer"), measure_batch=32),
    "lra_retrieval": Recipe(
        *_lra(4096, dual=True), 32, ("task/lra_retrieval", "backbone/nystromformer"), measure_batch=32
    ),
    "lra_image": Recipe(*_lra(1024), 256, ("task/lra_image", "backbone/nystromformer"), measure_batch=32),
    "lra_pathfinder": Recipe(
        *_lra(1024), 256, ("task/lra_pathfinder", "backbone/nystromformer"), measure_batch=32
    ),
    "lra_transformer_listops": Recipe(
        *_lra(
            2000, attention="softmax", dim=512, depth=6, num_heads=8, head_dim=64, mlp_dim=2048, pool="cls"
        ),
        32,
        ("experiment/lra/transformer_listops",),
    ),
    "lm_gpt2": Recipe(
        *_gpt(768, 12, 12, _LM_MEASURED),
        16,
        ("task/lm_wikitext103", "backbone/gpt2_small"),
        length_scale=1024 / _LM_MEASURED,
    ),
    "lm_gpt_472m": Recipe(
        *_gpt(1280, 24, 20, _LM_MEASURED),
        16,
        ("task/lm_wikitext103", "backbone/gpt_472m"),
        length_scale=1024 / _LM_MEASURED,
    ),
    "mlm_crammed_bert": Recipe(*_bert(), 128, ("task/mlm", "backbone/crammed_bert")),
}


def _timed(fn: Callable[[], Any], repeats: int) -> float:
    """Median seconds of ``fn`` over ``repeats`` calls after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _gflop(fn: Callable[[], Any]) -> float:
    """Matrix-product GFLOP of one call of ``fn`` (factorisations not counted)."""
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops() / 1e9


def _step(model: nn.Module, inputs: tuple[torch.Tensor, ...]) -> Callable[[], None]:
    def step() -> None:
        for p in model.parameters():
            p.grad = None
        out = model(*inputs)
        out = out[0] if isinstance(out, tuple) else out
        out.float().square().mean().backward()

    return step


def _entry_tokens(model: nn.Module, inputs: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
    """The ``(b, N, D)`` token matrices the model's token entry passes on in one forward (two for
    a two-tower LRA model)."""
    seen: list[torch.Tensor] = []
    handle = attention.find_token_entry(model).observe(lambda t: seen.append(t.detach().clone()))
    with torch.no_grad():
        model.eval()(*inputs)
    handle.remove()
    model.train()
    return seen


def _tiled(tokens: torch.Tensor, batch: int) -> torch.Tensor:
    """``tokens (b, N, D)`` repeated to ``(batch, N, D)``: the correction is timed on the recipe's
    whole micro-batch, as its batched products run (a small batch would overstate them)."""
    return tokens.repeat(-(-batch // len(tokens)), 1, 1)[:batch].contiguous()


def _spectral_weights(model: nn.Module, method: str) -> Callable[[], None]:
    """Computing every parametrized weight of ``model`` with spectral's svd mode on W_Q, W_K, W_V."""
    corrected = attention.apply(copy.deepcopy(model), "spectral", mode="svd", targets="qkv", method=method)
    linears = [m for m in corrected.modules() if hasattr(m, "parametrizations")]

    def compute() -> None:
        with torch.no_grad():
            for linear in linears:
                linear.weight  # noqa: B018  the parametrization runs here

    return compute


def measure(name: str, recipe: Recipe, b: int, repeats: int) -> dict[str, Any]:
    """One recipe's costs (module docstring), as a JSON-ready dict."""
    torch.manual_seed(0)
    model = recipe.build().train()
    inputs = recipe.inputs(b)
    step = _step(model, inputs)
    scale = recipe.batch / b * recipe.length_scale  # measured step -> the recipe's micro-batch
    step_s = _timed(step, repeats)
    out: dict[str, Any] = {
        "batch": recipe.batch,
        "measured_batch": b,
        "length_scale": recipe.length_scale,
        "step_ms": 1000 * step_s * scale,
        "step_gflop": _gflop(step) * scale,
        "forms": {},
    }
    entry = attention.find_token_entry(model)
    if entry.causal:
        table = entry.module.weight.detach()
        out["tokens"] = f"table {tuple(table.shape)[0]}×{tuple(table.shape)[1]}"
        for form, method in TOKEN_METHODS.items():
            how = "eigh" if method == "svd" else "newton_schulz"
            fn = lambda how=how: vocabulary_map(table, method=how)  # noqa: E731
            out["forms"][form] = {"method": method, "per": "step", **_cost(fn, repeats)}
    else:
        tokens = [_tiled(t, recipe.batch) for t in _entry_tokens(model, inputs)]  # the recipe's batch
        out["tokens"] = " + ".join(f"{t.shape[1]}×{t.shape[2]}" for t in tokens)
        for form, method in TOKEN_METHODS.items():

            def fn(method: str = method) -> None:
                with exact_fp32("cpu"):
                    for t in tokens:
                        token_correction(t, method)

            out["forms"][form] = {"method": method, "per": "sample", **_cost(fn, repeats)}
    for form, method in SPECTRAL_METHODS.items():
        fn = _spectral_weights(model, method)
        out["forms"][form] = {"method": method, "per": "step", **_cost(fn, repeats)}
    for cost in out["forms"].values():
        cost["ratio"] = 1 + cost["ms"] / out["step_ms"]
        cost["gflop_ratio"] = cost["gflop"] / out["step_gflop"]
    return out


def _cost(fn: Callable[[], Any], repeats: int) -> dict[str, float]:
    """``fn``'s time (ms) and GFLOP: ``fn`` does a step's whole work (``per``: ``sample`` when that
    work grows with the micro-batch, ``step`` when it does not)."""
    return {"ms": 1000 * _timed(fn, repeats), "gflop": _gflop(fn)}


def shape_costs(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """``{recipe: measure(...)}`` for the recipes ``args.shapes`` names (all when it names none)."""
    names = args.shapes or list(RECIPES)
    out = {}
    for n in names:
        print(f"shapes: {n} ({RECIPES[n].batch} a micro-batch)", file=sys.stderr, flush=True)
        out[n] = measure(n, RECIPES[n], RECIPES[n].measure_batch or args.shape_batch, args.shape_repeats)
    return out


def table(results: dict[str, dict[str, Any]], limit: float = 1.10) -> list[str]:
    """The shapes section of ``launch.tools.bench``'s printout: one row per recipe and form."""
    lines = [
        "\nvariant corrections at the recipes' shapes: time (and matrix-product GFLOP) against standard's "
        "step at the recipe's micro-batch; ratio = 1 + correction / step (decomposition time / step time)",
        f"{'recipe':<24} {'tokens':<18} {'batch':>5} {'step ms':>10} {'form':<18} {'method':<13} "
        f"{'ms':>9} {'ratio':>7} {'GFLOP ratio':>11} {'≤' + format(limit, '.2f'):>6}",
    ]
    for name, r in results.items():
        for i, (form, c) in enumerate(r["forms"].items()):
            default = form in ("cond_tokens", "spectral_svd")
            verdict = ("ok" if c["ratio"] <= limit else "MISS") if default else ""
            head = (
                f"{name:<24} {r['tokens']:<18} {r['batch']:>5} {r['step_ms']:>10.0f}" if i == 0 else " " * 60
            )
            lines.append(
                f"{head} {form:<18} {c['method']:<13} {c['ms']:>9.1f} {c['ratio']:>7.3f} "
                f"{c['gflop_ratio']:>11.4f} {verdict:>6}"
            )
    return lines
