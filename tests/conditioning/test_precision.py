"""Conditioning statistics mean the same on any device: under a bf16 autocast (the loop's for
``trainer.precision=bf16``, on CPU here as on a GPU) the monitor and the sandbox's probes give the
numbers they give in fp32, for the same weights and batch; the control shows that a bf16 forward
does move them, so the equality is not vacuous."""

from __future__ import annotations

import contextlib

import pytest
import torch
from conftest import tiny_model

import src.conditioning.monitor as monitor_module
from src import attention
from src.conditioning import ConditioningMonitor
from src.conditioning.precision import full_fp32
from src.models.sandbox import MultiHeadSandbox
from src.sandbox import spikes
from src.sandbox.snapshot import take_snapshot
from src.sandbox.spikes import norm_jacobian_max

BF16 = dict(device_type="cpu", dtype=torch.bfloat16)


@pytest.mark.parametrize("variant", ["standard", "spectral", "precond"])
def test_the_monitor_under_bf16_autocast_reads_what_it_reads_in_fp32(variant, images):
    model = tiny_model("vit")
    if variant != "standard":
        attention.apply(model, variant)
    monitor = ConditioningMonitor(model)
    fp32, weights = monitor(images), monitor.weights()
    with torch.autocast(**BF16):
        assert monitor(images) == fp32  # every key, exactly
        assert monitor.weights() == weights
    assert monitor(images.bfloat16()) == monitor(images.bfloat16().float())  # a bf16 batch, read as fp32


def test_the_control_a_bf16_forward_moves_the_kappas(images, monkeypatch):
    """Without the guard, the same call under autocast gives other κ(P) and κ(A): the test above
    would fail if the monitor ran in the caller's precision (here ×0.2 to ×0.6 and ×0.07 to ×0.1)."""
    model = attention.apply(tiny_model("vit"), "precond")
    monitor = ConditioningMonitor(model)
    fp32 = monitor(images)
    monkeypatch.setattr(monitor_module, "full_fp32", contextlib.nullcontext)
    with torch.autocast(**BF16):
        bf16 = monitor(images)
    for key in ("kappa/P/median", "kappa/A/median"):
        assert not bf16[key] == pytest.approx(fp32[key], rel=0.05), key


def test_full_fp32_turns_autocast_and_tf32_off_and_restores_them():
    before = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    try:
        torch.set_float32_matmul_precision("high")  # TF32, as the loop sets for fp32 runs on CUDA
        torch.backends.cudnn.allow_tf32 = True
        with torch.autocast(**BF16), full_fp32():
            assert not torch.is_autocast_enabled("cpu") and not torch.is_autocast_enabled("cuda")
            assert torch.get_float32_matmul_precision() == "highest" and not torch.backends.cudnn.allow_tf32
            assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32
        assert (torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32) == ("high", True)
    finally:
        torch.set_float32_matmul_precision(before[0])
        torch.backends.cudnn.allow_tf32 = before[1]


def test_the_sandbox_probes_under_bf16_autocast_read_what_they_read_in_fp32(monkeypatch):
    """The norms' curvature (logged from ``after_backward``) and the snapshots (drawn at each
    validation) of the modadd sandbox, inside the loop's bf16 autocast and out of it; the control:
    without the guard the curvature moves (by about 2% here)."""
    torch.manual_seed(0)
    model = MultiHeadSandbox(7, 12, depth=2)
    x = torch.randint(0, 7, (16, 12), generator=torch.Generator().manual_seed(1))
    y, sums = x[:, :2].sum(1) % 7, x[:, :2].sum(1)
    curvature, snapshot = norm_jacobian_max(model, x), take_snapshot(model, x, y, sums, 2, 0)
    with torch.autocast(**BF16):
        assert norm_jacobian_max(model, x) == curvature
        again = take_snapshot(model, x, y, sums, 2, 0)
    for name, cloud in snapshot.clouds.items():
        assert (again.clouds[name] == cloud).all(), name
    for name, probs in snapshot.attention.items():
        assert (again.attention[name] == probs).all(), name
    monkeypatch.setattr(spikes, "full_fp32", contextlib.nullcontext)
    with torch.autocast(**BF16):
        assert norm_jacobian_max(model, x) != pytest.approx(curvature, rel=1e-3)
