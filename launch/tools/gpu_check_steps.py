"""The GPU check's model steps: the bare ViT-B training step per variant, GPU-against-CPU parity,
the host cost of a kernel launch, and the informational sections (compile, host syncs, DDP, the
cost of ``cond_tokens``' decomposition and of the κ monitor).

Every model is the suite's own: composed from ``conf/`` as ``python -m src.run task=imagenet
backbone=… attn=…`` composes it (each variant at its config's defaults) and built by
:func:`src.engine.loop.model.build_model`, the function the loop builds with.
"""

from __future__ import annotations

import copy
import socket
import statistics
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from src import attention


def compose_model(shape: dict, variant: str | None, device: str, **model: Any) -> tuple[nn.Module, Any]:
    """The run's model for ``task=imagenet backbone=<shape's> attn=<variant>`` on ``device`` (None:
    standard's config, no variant applied: timm's own model), and the composed config.
    ``model``: fields of ``backbone.model`` replaced (a depth, a drop-path rate)."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from src.configs import compose
    from src.engine.loop.model import build_model

    cfg = compose(["task=imagenet", f"backbone={shape['backbone']}", f"attn={variant or 'standard'}",
                   *shape["overrides"]])  # fmt: skip
    for key, value in model.items():
        OmegaConf.update(cfg, f"backbone.model.{key}", value, force_add=True)
    torch.manual_seed(0)
    task = instantiate(cfg.task, _convert_="all")
    built = build_model(cfg, task) if variant is not None else task.build_model(cfg.backbone)
    return built.to(device).train(), cfg


def batch(size: int, img: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(size, 3, img, img, generator=generator)  # (B, 3, H, W)
    y = torch.randint(0, 1000, (size,), generator=generator)  # (B,)
    return x.to(device), y.to(device)


def train_step(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, bf16: bool = True
) -> Callable[[], torch.Tensor]:
    """One training step (AdamW, fused on a GPU; bf16 autocast unless ``bf16`` is false);
    returns the loss, unsynchronised."""
    fused = x.device.type == "cuda"
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=fused or None)

    def step() -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=bf16):
            loss = F.cross_entropy(model(x).float(), y)
        loss.backward()
        optimizer.step()
        return loss.detach()

    return step


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def timed_steps(
    step: Callable[[], torch.Tensor], warmup: int, steps: int, device: str
) -> tuple[float, float]:
    """Median seconds of ``steps`` steps after ``warmup``, and the last loss."""
    times, loss = [], torch.tensor(float("nan"))
    for i in range(warmup + steps):
        synchronize(device)
        start = time.perf_counter()
        loss = step()
        synchronize(device)
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return statistics.median(times), float(loss)


def variant_steps(shape: dict, device: str, names: list[str] | None = None) -> dict[str, Any]:
    """The bare training step of the suite's ViT-B at the recipe's micro-batch and precision, per
    variant at its defaults and for timm's model untouched: seconds, images/s, the ratio to
    ``standard``, the last loss and the peak memory (a GPU's; None on a CPU; ``"OOM"``).
    ``names``: these only (``timm``: the model untouched)."""
    out: dict[str, Any] = {"seconds": {}, "loss": {}, "peak_mib": {}, "errors": {}}
    cfg = None
    for name in names or [*attention.VARIANTS, "timm"]:
        model = None
        try:
            model, cfg = compose_model(shape, None if name == "timm" else name, device)
            x, y = batch(int(cfg.task.batch_size), int(cfg.task.img_size), device)
            if device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            bf16 = cfg.trainer.precision == "bf16"
            seconds, loss = timed_steps(
                train_step(model, x, y, bf16), shape["warmup"], shape["steps"], device
            )
            out["seconds"][name], out["loss"][name] = seconds, loss
            out["peak_mib"][name] = torch.cuda.max_memory_allocated() / 2**20 if device == "cuda" else None
        except torch.OutOfMemoryError as error:
            out["peak_mib"][name], out["errors"][name] = "OOM", str(error).splitlines()[0][:200]
        except Exception as error:  # noqa: BLE001  the variant's failure is a finding; the others still run
            out["errors"][name] = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
        finally:
            del model
            if device == "cuda":
                torch.cuda.empty_cache()
    if cfg is not None:
        out.update(
            batch=int(cfg.task.batch_size), img=int(cfg.task.img_size), precision=str(cfg.trainer.precision)
        )
    return out


def parity(shape: dict, device: str) -> dict[str, dict[str, float]]:
    """Per variant: the relative difference of the loss and of the whole gradient (‖Δg‖ / ‖g‖)
    between the model on ``device`` in fp32 (TF32 off), and under bf16 autocast, and the same
    model on the CPU in fp32. The model: the suite's ViT-B at ``shape['parity']``'s depth, no drop
    path (a step then draws no random numbers), batch ``shape['parity']['batch']``."""
    spec = shape["parity"]
    out: dict[str, dict[str, float]] = {}
    matmul, cudnn = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    torch.set_float32_matmul_precision("highest")
    torch.backends.cudnn.allow_tf32 = False
    try:
        for name in attention.VARIANTS:
            cpu, cfg = compose_model(shape, name, "cpu", depth=spec["depth"], drop_path_rate=0.0)
            x, y = batch(spec["batch"], int(cfg.task.img_size), "cpu")
            there = copy.deepcopy(cpu).to(device)
            ref_loss, ref_grad = loss_and_gradient(cpu, x, y, False)
            row = {}
            for label, bf16 in (("fp32", False), ("bf16", True)):
                loss, grad = loss_and_gradient(there, x.to(device), y.to(device), bf16)
                row[f"{label}_loss"] = abs(loss - ref_loss) / max(abs(ref_loss), 1e-12)
                row[f"{label}_grad"] = ((grad - ref_grad).norm() / ref_grad.norm().clamp_min(1e-30)).item()
            out[name] = row
    finally:
        torch.set_float32_matmul_precision(matmul)
        torch.backends.cudnn.allow_tf32 = cudnn
    return out


def loss_and_gradient(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, bf16: bool
) -> tuple[float, torch.Tensor]:
    """The loss of one forward and every parameter's gradient, flattened into one fp64 CPU vector."""
    model.zero_grad(set_to_none=True)
    with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=bf16):
        loss = F.cross_entropy(model(x).float(), y)
    loss.backward()
    grads = [p.grad.detach().double().flatten().cpu() for p in model.parameters() if p.grad is not None]
    return loss.item(), torch.cat(grads)


def launch_cost(shape: dict, device: str) -> dict[str, Any]:
    """Host seconds per kernel launch: the bare step (forward, backward, AdamW) of a micro ViT at
    batch 1, whose kernels are too small to take any time, over its counted launches
    (:func:`launch.tools.flops.count_step`, forward and backward). What ``launch.plan --measured`` prices
    each launch at."""
    from launch.tools.flops import count_step, forward_backward

    micro = {**shape, "backbone": "vit_micro", "overrides": ["task.img_size=32"]}
    with torch.device("meta"):
        meta, _ = compose_model(micro, "standard", "meta")
    x = torch.zeros(1, 3, 32, 32, device="meta")
    _, kernels = count_step(lambda: forward_backward(meta, (x,)))
    model, _ = compose_model(micro, "standard", device)
    xs, ys = batch(1, 32, device)
    seconds, _ = timed_steps(train_step(model, xs, ys, bf16=False), 5, 30, device)
    return {"seconds_per_op": seconds / kernels, "step_s": seconds, "kernels": kernels}


# -- informational sections -----------------------------------------------------------------------


def compile_breaks(shape: dict, device: str) -> dict[str, Any]:
    """Per variant: the graphs and graph breaks TorchDynamo finds in the forward pass (batch 2)."""
    import torch._dynamo

    out = {}
    for name in attention.VARIANTS:
        torch._dynamo.reset()
        model, cfg = compose_model(shape, name, device)
        x, _ = batch(2, int(cfg.task.img_size), device)
        found = torch._dynamo.explain(model)(x)
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
    out = {}
    for name in attention.VARIANTS:
        model, cfg = compose_model(shape, name, device)
        x, y = batch(8, int(cfg.task.img_size), device)
        step = train_step(model, x, y)
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


def ddp_world_of_one(shape: dict, device: str) -> dict[str, Any]:
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
    """Milliseconds of ``cond_tokens``' correction on ImageNet-shaped tokens (the recipe's
    micro-batch × 197 × 768), and of one κ monitor call (weights and one forward on two samples)."""
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

    model, cfg = compose_model(shape, "standard", device)
    x, _ = batch(2, int(cfg.task.img_size), device)
    monitor = ConditioningMonitor(model)
    return {
        "cond_tokens_regularized_ms": timed(lambda: token_correction(tokens, "regularized")),  # the default
        "cond_tokens_svd_ms": timed(lambda: token_correction(tokens, "svd")),
        "cond_tokens_polar_ms": timed(lambda: token_correction(tokens, "polar")),
        "tokens_shape": list(shape["tokens"]),
        "kappa_monitor_ms": timed(lambda: monitor(x)),
    }
