"""The GPU check in one command: ``python -m launch.gpu_check`` (``make gpu-check``).

A GPU is lent to this project for minutes at a time, so what needs one is measured by one
prepared script that finishes in under 8 minutes on one GPU and writes one JSON
(``--out``, default ``gpu_check.json``):

- **throughput**: ViT-B/16 (timm's ``vit_base_patch16_224``, no pretrained weights) training
  steps in bf16 autocast (forward, cross-entropy, backward, AdamW), per variant at its defaults
  and for timm's own model untouched, under the same loop: seconds per step, samples per second
  and the ratio to ``standard`` (``samples_per_s["vit_base/<variant>"]`` is what
  ``python -m launch.plan --measured`` reads);
- **peak memory** of those steps (``torch.cuda.max_memory_allocated``; not measured on a CPU);
- **torch.compile** per variant: the graphs and graph breaks TorchDynamo finds
  (:func:`torch._dynamo.explain`, the reasons of the first breaks);
- **host syncs** in a variant's step (``torch.cuda.set_sync_debug_mode("warn")``, counted);
- **DDP** at world size 1 (nccl on a GPU, gloo on a CPU): a process group, one step through
  ``DistributedDataParallel``, the world size read back and the gradient checked against the
  same step without DDP;
- the cost of ``cond_tokens``' decomposition at ImageNet shapes (``(B, 197, 768)`` tokens, its
  SVD in fp32) and of the κ monitor (:class:`~src.conditioning.ConditioningMonitor`) on the model.

``--dry`` runs the same code at tiny shapes on whatever device is there (a CPU in the tests):
timm's ViT-B class narrowed to two blocks of width 64 and two heads, at 32 × 32 pixels, batch 2,
two steps. Each section is timed and a section that fails writes its error instead of stopping
the others.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import socket
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from src import attention

MODEL, BACKBONE = "vit_base_patch16_224", "vit_base"  # timm's name, the suite's backbone config
FULL = {"img": 224, "batch": 64, "warmup": 3, "steps": 10, "tokens": (64, 197, 768), "narrow": {}}
# the same code at tiny shapes: timm's ViT-B class, its depth, width and heads overridden
DRY = {
    "img": 32,
    "batch": 2,
    "warmup": 1,
    "steps": 2,
    "tokens": (2, 17, 64),
    "narrow": {"depth": 2, "embed_dim": 64, "num_heads": 2},
}


def build(variant: str | None, shape: dict, device: str) -> nn.Module:
    """timm's ViT-B/16 at ``shape``'s pixels (and, dry, narrowed) with ``variant`` applied at its
    defaults (None: timm's own)."""
    import timm

    torch.manual_seed(0)
    model = timm.create_model(
        MODEL, pretrained=False, num_classes=1000, img_size=shape["img"], **shape["narrow"]
    )
    if variant is not None:
        attention.apply(model, variant)
    return model.to(device).train()


def batch(size: int, img: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(size, 3, img, img, generator=generator)  # (B, 3, H, W)
    y = torch.randint(0, 1000, (size,), generator=generator)  # (B,)
    return x.to(device), y.to(device)


def train_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> Callable[[], torch.Tensor]:
    """One bf16-autocast training step (AdamW, fused on a GPU); returns the loss, unsynchronised."""
    fused = x.device.type == "cuda"
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=fused or None)

    def step() -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(x.device.type, dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x).float(), y)
        loss.backward()
        optimizer.step()
        return loss.detach()

    return step


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def throughput(shape: dict, device: str) -> dict[str, Any]:
    """Seconds per step (median), samples per second and peak memory, per variant and timm's own."""
    x, y = batch(shape["batch"], shape["img"], device)
    seconds, peaks = {}, {}
    for name in ["timm", *attention.VARIANTS]:
        model = build(None if name == "timm" else name, shape, device)
        step, times = train_step(model, x, y), []
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        for i in range(shape["warmup"] + shape["steps"]):
            synchronize(device)
            start = time.perf_counter()
            step()
            synchronize(device)
            if i >= shape["warmup"]:
                times.append(time.perf_counter() - start)
        seconds[name] = statistics.median(times)
        peaks[name] = torch.cuda.max_memory_allocated() / 2**20 if device == "cuda" else None
        del model, step
    key = {name: f"{BACKBONE}/{name}" if name != "timm" else f"{BACKBONE}/timm_own" for name in seconds}
    return {
        "seconds_per_step_at_batch": {key[n]: s for n, s in seconds.items()},
        "samples_per_s": {key[n]: shape["batch"] / s for n, s in seconds.items()},
        "ratio_to_standard": {n: s / seconds["standard"] for n, s in seconds.items()},
        "peak_memory_mib": {n: p for n, p in peaks.items()},
    }


def compile_breaks(shape: dict, device: str) -> dict[str, Any]:
    """Per variant: the graphs and graph breaks TorchDynamo finds in the forward pass."""
    import torch._dynamo

    x, _ = batch(shape["batch"], shape["img"], device)
    out = {}
    for name in attention.VARIANTS:
        torch._dynamo.reset()
        found = torch._dynamo.explain(build(name, shape, device))(x)
        reasons = [str(getattr(b, "reason", b)).splitlines()[0][:160] for b in found.break_reasons]
        out[name] = {
            "graphs": found.graph_count,
            "graph_breaks": found.graph_break_count,
            "reasons": reasons[:3],
        }
    torch._dynamo.reset()
    return out


def host_syncs(shape: dict, device: str) -> dict[str, Any]:
    """Per variant, the host syncs CUDA reports in one training step (a CPU has none to report)."""
    if device != "cuda":
        return {"note": "CUDA only; on a CPU tests/attention/test_cuda_path.py audits .item()/.cpu() instead"}
    x, y = batch(shape["batch"], shape["img"], device)
    out = {}
    for name in attention.VARIANTS:
        step = train_step(build(name, shape, device), x, y)
        step()  # the first step allocates AdamW's state
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                step()
            finally:
                torch.cuda.set_sync_debug_mode("default")
        out[name] = sum("synchroniz" in str(w.message) for w in caught)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ddp_world_of_one(device: str) -> dict[str, Any]:
    """One DDP step at world size 1: the world size read back, and the gradient DDP leaves equal
    to the same step's without it (a world of one averages over itself)."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    backend = "nccl" if device == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        plain = nn.Linear(16, 4).to(device)
        wrapped = DistributedDataParallel(nn.Linear(16, 4).to(device))
        wrapped.module.load_state_dict(plain.state_dict())
        x = torch.randn(8, 16, device=device)
        plain(x).square().mean().backward()
        wrapped(x).square().mean().backward()
        same = torch.equal(plain.weight.grad, wrapped.module.weight.grad)
        return {"backend": backend, "world_size": dist.get_world_size(), "gradient_as_without_ddp": same}
    finally:
        dist.destroy_process_group()


def decomposition_and_monitor(shape: dict, device: str) -> dict[str, Any]:
    """Milliseconds of ``cond_tokens``' correction on ImageNet-shaped tokens, and of one κ monitor
    call (weights and one forward on two samples) on the model."""
    from src.attention.cond_tokens import token_correction
    from src.conditioning import ConditioningMonitor

    tokens = torch.randn(*shape["tokens"], device=device)  # (B, N, D)

    def timed(fn: Callable[[], Any], repeats: int = 3) -> float:
        fn()
        synchronize(device)
        start = time.perf_counter()
        for _ in range(repeats):
            fn()
        synchronize(device)
        return 1000 * (time.perf_counter() - start) / repeats

    model = build("standard", shape, device)
    x, _ = batch(2, shape["img"], device)
    monitor = ConditioningMonitor(model)
    return {
        "cond_tokens_svd_ms": timed(lambda: token_correction(tokens, "svd")),
        "cond_tokens_polar_ms": timed(lambda: token_correction(tokens, "polar")),
        "tokens_shape": list(shape["tokens"]),
        "kappa_monitor_ms": timed(lambda: monitor(x)),
    }


SECTIONS: dict[str, Callable[[dict, str], dict[str, Any]]] = {
    "throughput": throughput,
    "compile": compile_breaks,
    "host_syncs": host_syncs,
    "ddp": lambda shape, device: ddp_world_of_one(device),
    "costs": decomposition_and_monitor,
}


def run(dry: bool, device: str) -> dict[str, Any]:
    """Every section, timed; a section that fails records its error and the others still run."""
    shape = DRY if dry else FULL
    result: dict[str, Any] = {
        "dry": dry,
        "device": device,
        "gpu": torch.cuda.get_device_name()
        if device == "cuda"
        else platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "model": MODEL,
        "img": shape["img"],
        "batch": shape["batch"],
        "dtype": "bf16 autocast",
        "section_s": {},
    }
    started = time.perf_counter()
    for name, section in SECTIONS.items():
        start = time.perf_counter()
        try:
            result[name] = section(shape, device)
        except Exception as error:  # noqa: BLE001 - one section's failure is a finding, not the end
            result[name] = {"error": f"{type(error).__name__}: {error}"[:500]}
        result["section_s"][name] = round(time.perf_counter() - start, 2)
    result["wall_s"] = round(time.perf_counter() - started, 2)
    if "samples_per_s" in result.get("throughput", {}):
        result["samples_per_s"] = result["throughput"]["samples_per_s"]  # what launch.plan reads
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m launch.gpu_check", description=__doc__.splitlines()[0])
    parser.add_argument("--dry", action="store_true", help="tiny shapes on any device (what the tests run)")
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda where there is one)")
    parser.add_argument("--out", type=Path, default=Path("gpu_check.json"), help="the JSON written")
    args = parser.parse_args(argv)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device not in ("cuda", "cpu") or (device == "cuda" and not torch.cuda.is_available()):
        print(f"error: --device {device}: give cpu, or cuda on a machine with a CUDA GPU")
        return 2
    if device == "cpu" and not args.dry:
        print("error: the full check is for a CUDA GPU (ViT-B at 224 would take hours on a CPU): add --dry")
        return 2
    os.environ.setdefault("TORCHDYNAMO_VERBOSE", "0")
    with contextlib.redirect_stdout(sys.stderr):  # timm/dynamo chatter off the result line
        result = run(args.dry, device)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    failed = [name for name in SECTIONS if "error" in result.get(name, {})]
    print(
        f"wrote {args.out} in {result['wall_s']:.0f} s" + (f"; failed: {', '.join(failed)}" if failed else "")
    )
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
