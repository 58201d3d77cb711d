"""What each attention variant costs per step, and how much sooner it converges.

``python -m launch.tools.bench`` (``make bench``) measures in one process, interleaving the
variants so that machine noise hits them alike, and prints a table and writes JSON:

1. forward+backward time of one attention block and of a whole model (ViT-S/16 at 224 on
   a CPU; ``--model vit_base_patch16_224 --device cuda --dtype bf16`` on a GPU), per variant,
   as the median over repeats of the paired ratio to ``standard`` (same repeat), with the
   interquartile range;
2. peak memory of a training step per variant: on CPU from the allocator's events
   (``torch.profiler`` with ``profile_memory``, above the memory held before the step), on
   GPU ``torch.cuda.max_memory_allocated``;
3. the runner's overhead: the suite's loop (``src.engine``) against a bare PyTorch loop on
   the same model, data, optimizer and schedule, as a ratio of time per step;
4. time to quality (``--quality``): for embedded tasks, the steps each variant needs to reach
   ``standard``'s final validation loss (median over seeds), as a ratio to ``standard``'s steps;
5. the corrections at the recipes' shapes (``--shapes``): ``cond_tokens``' (each method) and
   ``spectral``'s svd mode (each method) on every recipe's model, against ``standard``'s step at the
   recipe's micro-batch (:mod:`launch.tools.bench_shapes`).

On a CPU the bench flushes denormal floats to zero (``--no-flush-denormal`` keeps them): x86
cores compute with denormals many times slower, and a variant that saturates the softmax
(``spectral`` at ``lam=10``) fills the attention's backward with them. Measured on 2 cores,
ViT-S: ``spectral`` at 1.05× ``standard`` with denormals, 1.00× without them, and 0.99× at
``lam=1`` either way: a cost of the numbers, not of the variant's extra work. NVIDIA GPUs
compute with denormals at full speed, so the switch only acts on a CPU. Training flushes them
too (``trainer.flush_denormal``, default on; ``src/engine/loop/numerics.py``).

This module times steps (1, 2) and is the command; the two measurements that train through the
suite (3, 4) are :mod:`launch.tools.bench_training`'s, the recipes' shapes (5)
:mod:`launch.tools.bench_shapes`'.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from src import attention
from src.command import command_parser, run_command
from src.engine.record.files import check_writable_file, write_atomic

from . import bench_shapes
from .bench_training import runner_overhead, time_to_quality

#: Other forms worth timing beside each variant at its defaults: the options that change the work
#: (``spectral_svd`` at its default method, Newton–Schulz; ``*_eigh``/``*_svd`` the factorisations).
EXTRA_FORMS: dict[str, tuple[str, dict[str, Any]]] = {
    "spectral_svd": ("spectral", {"mode": "svd"}),
    "spectral_svd_eigh": ("spectral", {"mode": "svd", "method": "eigh"}),
    "cond_tokens_svd": ("cond_tokens", {"method": "svd"}),
    "cond_tokens_polar": ("cond_tokens", {"method": "polar"}),
}
#: The forms benchmarked: every registered variant at its defaults (``attention.VARIANTS``, so a
#: new variant joins the table without an edit here), then the extra forms of those registered.
FORMS: dict[str, tuple[str, dict[str, Any]]] = {
    **{name: (name, {}) for name in attention.VARIANTS},
    **{form: spec for form, spec in EXTRA_FORMS.items() if spec[0] in attention.VARIANTS},
}
TARGETS = {
    "spectral": 1.01,
    "cond_init": 1.01,
    "mimetic": 1.01,
    "precond": 1.05,
    "cond_tokens": 1.10,
    "cond_tokens_polar": 1.10,
    "spectral_svd": 1.10,
}


class OneBlock(nn.Module):
    """One timm ViT block on token input ``(B, N, D)``, with the block as its token entry."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        from timm.models.vision_transformer import Block

        self.block = Block(dim, heads, qkv_bias=True)

    def token_entry(self) -> attention.TokenEntry:
        return attention.TokenEntry(self.block)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x)


def build(kind: str, form: str, args: argparse.Namespace) -> tuple[nn.Module, torch.Tensor]:
    """The model (or block) with ``form`` applied, and an input batch, on the device."""
    import timm

    torch.manual_seed(0)
    if kind == "model":
        model = timm.create_model(args.model, num_classes=1000, img_size=args.img)
        x = torch.randn(args.batch, 3, args.img, args.img)
    else:
        width = timm.create_model(args.model, num_classes=0).embed_dim
        model = OneBlock(width, max(1, width // 64))
        x = torch.randn(args.batch, (args.img // 16) ** 2 + 1, width)
    variant, options = FORMS[form]
    attention.apply(model, variant, **options)
    return model.to(args.device).train(), x.to(args.device)


def step_fn(model: nn.Module, x: torch.Tensor, args: argparse.Namespace) -> Callable[[], None]:
    """One forward+backward, synchronised on GPU."""
    autocast = torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=args.dtype == "bf16")

    def step() -> None:
        for p in model.parameters():
            p.grad = None
        with autocast:
            out = model(x)
        out.float().square().mean().backward()
        if x.device.type == "cuda":
            torch.cuda.synchronize()

    return step


def time_forms(kind: str, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Median paired ratio to ``standard`` (and its IQR) over ``repeats`` interleaved rounds."""
    steps = {f: step_fn(*build(kind, f, args), args) for f in args.forms}
    times: dict[str, list[float]] = {f: [] for f in args.forms}
    for r in range(args.warmup + args.repeats):
        order = args.forms[r % len(args.forms) :] + args.forms[: r % len(args.forms)]  # rotate the order
        for f in order:
            start = time.perf_counter()
            steps[f]()
            if r >= args.warmup:
                times[f].append(time.perf_counter() - start)
    out = {}
    for f in args.forms:
        ratios = sorted(t / s for t, s in zip(times[f], times["standard"], strict=True))
        q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
        out[f] = {
            "ms": 1000 * statistics.median(times[f]),
            "ratio": statistics.median(ratios),
            "ratio_q1": q[0],
            "ratio_q3": q[2],
        }
    return out


def peak_memory(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Peak memory of one training step per form, above what was held before it (MB)."""
    out = {}
    for f in args.forms:
        model, x = build("model", f, args)
        step = step_fn(model, x, args)
        step()  # warm up, allocate gradients once
        for p in model.parameters():
            p.grad = None
        if x.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
            step()
            peak = torch.cuda.max_memory_allocated() - before
        else:
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
                step()
            live = peak = 0
            for event in sorted(prof.events(), key=lambda e: e.time_range.start):
                live += event.self_cpu_memory_usage
                peak = max(peak, live)
        out[f] = {"peak_mb": peak / 2**20}
        del model, x, step
    base = out["standard"]["peak_mb"]
    for f in out:
        out[f]["ratio"] = out[f]["peak_mb"] / base
    return out


def table(results: dict[str, Any]) -> str:
    lines = []
    for kind in ("block", "model"):
        if kind in results:
            lines += [
                f"\n{kind}: forward+backward, ratio to standard (median [IQR] of paired repeats)",
                f"{'variant':<18} {'ms':>9} {'ratio':>7} {'IQR':>15} {'target':>10}",
            ]
            for f, r in results[kind].items():  # the targets are on a whole model's step
                target = f"≤{TARGETS[f]:.2f}" if kind == "model" and f in TARGETS else ""
                if target:
                    target += " ok" if r["ratio"] <= TARGETS[f] else " MISS"
                lines.append(
                    f"{f:<18} {r['ms']:>9.2f} {r['ratio']:>7.3f} "
                    f"{r['ratio_q1']:>7.3f}–{r['ratio_q3']:<7.3f} {target:>10}"
                )
    if "memory" in results:
        lines += [
            "\npeak memory of a training step (MB above what it held before)",
            f"{'variant':<18} {'MB':>9} {'ratio':>7}",
        ]
        lines += [f"{f:<18} {r['peak_mb']:>9.1f} {r['ratio']:>7.3f}" for f, r in results["memory"].items()]
    if "overhead" in results:
        o = results["overhead"]
        lines.append(
            f"\nrunner overhead: suite {o['suite_ms']:.2f} ms/step, bare {o['bare_ms']:.2f} ms/step, "
            f"ratio {o['ratio']:.3f} (target ≤1.03)"
        )
    if "quality" in results:
        lines += [
            "\ntime to quality: steps to standard's final val loss (median over seeds)",
            f"{'task':<20} {'variant':<12} {'steps':>8} {'reached':>8} {'ratio':>7}",
        ]
        for q in results["quality"]:
            steps = "—" if q["steps"] is None else f"{q['steps']:g}"
            ratio = "—" if q["ratio"] is None else f"{q['ratio']:.2f}"
            lines.append(
                f"{q['task']:<20} {q['variant']:<12} {steps:>8} {q['reached']}/{q['seeds']:<6} {ratio:>7}"
            )
    if "shapes" in results:
        lines += bench_shapes.table(results["shapes"])
    return "\n".join(lines)


def machine(args: argparse.Namespace) -> dict[str, Any]:
    import platform

    info = {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpu": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "flush_denormal": bool(args.flush_denormal and args.device == "cpu"),
    }
    if args.device == "cuda":
        info["gpu"] = torch.cuda.get_device_name()
    return info


def main(argv: list[str] | None = None) -> int:
    """Measure, print the table and write the JSON; one ``error:`` line and 2 for an ``--out`` that
    cannot be written (checked before the benchmark's minutes)."""
    return run_command(command_line(), bench, argv)


def command_line() -> argparse.ArgumentParser:
    """The command line: what to time, at which sizes, and where the JSON goes."""
    p = command_parser(__spec__.name, __doc__)
    p.add_argument("--model", default="vit_small_patch16_224", help="a timm ViT (ViT-S on CPU, ViT-B on GPU)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--img", type=int, default=224)
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--forms", nargs="+", default=list(FORMS), choices=list(FORMS))
    p.add_argument("--skip", nargs="*", default=[], choices=["block", "model", "memory", "overhead"])
    p.add_argument("--overhead-steps", type=int, default=200)
    p.add_argument(
        "--quality",
        nargs="*",
        default=[],
        metavar="TASK",
        help="embedded tasks for time to quality, e.g. digits lra_listops_small lm_char modadd",
    )
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--quality-steps", type=int, help="shorter runs than the tasks' own budgets")
    p.add_argument("--quality-dir", type=Path, default=Path("outputs/bench/quality"))
    p.add_argument(
        "--shapes",
        nargs="*",
        choices=list(bench_shapes.RECIPES),
        metavar="RECIPE",
        help=f"the corrections at these recipes' shapes (none named: all): {', '.join(bench_shapes.RECIPES)}",
    )
    p.add_argument(
        "--shape-batch",
        type=int,
        default=2,
        help="samples a --shapes step is timed at (the LRA Nyströmformer's: 32)",
    )
    p.add_argument("--shape-repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=Path("outputs/bench/bench.json"))
    p.add_argument(
        "--flush-denormal",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="on a CPU, flush denormal floats to zero (see the module docstring)",
    )
    return p


def bench(args: argparse.Namespace) -> None:
    """The command's work: every measurement asked for, the table, the JSON."""
    check_writable_file(args.out)  # before the benchmark's minutes, not a traceback after them
    if args.device == "cpu":
        torch.set_flush_denormal(args.flush_denormal)
    if "standard" not in args.forms:
        args.forms = ["standard", *args.forms]
    results = measure(args)
    print(f"machine: {results['machine']}")
    print(table(results))
    write_atomic(args.out, json.dumps(results, indent=2) + "\n")  # a full disk: the table above is the result
    print(f"\nwrote {args.out}", file=sys.stderr)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """The measurements ``args`` asks for, in order: block, model, memory, overhead, quality, shapes."""
    results: dict[str, Any] = {"machine": machine(args), "args": {k: str(v) for k, v in vars(args).items()}}
    for kind in ("block", "model"):
        if kind not in args.skip:
            results[kind] = time_forms(kind, args)
    if "memory" not in args.skip:
        results["memory"] = peak_memory(args)
    if "overhead" not in args.skip:
        results["overhead"] = runner_overhead(args)
    if args.quality:
        results["quality"] = time_to_quality(args)
    if args.shapes is not None:
        results["shapes"] = bench_shapes.shape_costs(args)
    return results


if __name__ == "__main__":
    raise SystemExit(main())
