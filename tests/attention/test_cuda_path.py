"""What each variant's step does on a GPU, shown without one: no host sync in a training step, no
decomposition in bf16 under autocast, and buffers that follow the model to another device.

On a CUDA device a ``.item()``, ``.tolist()``, ``.cpu()``, ``.numpy()`` or a Python
``bool``/``float``/``int`` of a tensor waits for the GPU; here each is made to raise
(:func:`syncs.forbidden`, the instrument the loop's own test counts with) while one forward and
backward of every variant runs on a narrow timm ViT (the GPU check, ``launch/tools/gpu_check.py``, counts
CUDA's own reports of them, and those inside torch's own kernels, such as a CUDA factorisation's error
check, which only a GPU shows). Decompositions square or invert singular values, which bf16's 8 bits of
mantissa cannot carry: every ``torch.linalg`` factorisation a variant calls under CPU bf16
autocast is recorded with its input's dtype. The Newton–Schulz corrections (the defaults of
``cond_tokens`` and of ``spectral``'s svd mode) factorise nothing but need fp32's 23 bits: every
matrix product they run under bf16 autocast, with TF32 allowed, is recorded with its dtype and
the float32 matmul precision.
"""

from __future__ import annotations

import pytest
import timm
import torch
from syncs import forbidden
from torch.utils._python_dispatch import TorchDispatchMode

from launch.tools.bench import FORMS
from src import attention
from src.attention.cond_tokens import TokenConditioner
from src.attention.spectral import AddSpectralShift

FACTORISATIONS = ("svd", "svdvals", "eigh", "eigvalsh", "qr", "cholesky", "inv", "solve")
#: the forms (launch.tools.bench's: each variant at its defaults, and the options that change the work)
#: that factorise a matrix: in the forward pass (spectral's svd mode with method=eigh, cond_tokens
#: with method=svd) or at init. The defaults of spectral's svd mode and cond_tokens do not: their
#: Newton–Schulz products run in fp32 (``test_a_correction_multiplies_in_ieee_fp32_under_autocast``).
FACTORISING = {"spectral_svd_eigh", "cond_tokens_svd", "cond_init", "mimetic"}
#: the forms whose correction multiplies matrices at every forward pass (Newton–Schulz)
NEWTON_SCHULZ = {"spectral_svd", "cond_tokens", "cond_tokens_polar"}


def narrow_vit() -> torch.nn.Module:
    torch.manual_seed(0)
    return timm.create_model(
        "vit_base_patch16_224", img_size=32, depth=2, embed_dim=64, num_heads=2, num_classes=10
    )


@pytest.mark.parametrize("form", list(FORMS))
def test_a_training_step_makes_no_host_sync(form, monkeypatch):
    model = narrow_vit()
    attention.apply(model, FORMS[form][0], **FORMS[form][1])
    x, y = torch.randn(2, 3, 32, 32), torch.tensor([1, 3])
    model(x)  # the first call may build lazily (shapes, caches): not the steady step
    with forbidden(monkeypatch):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_the_audit_catches_a_host_sync(monkeypatch):
    """The audit is live: a step that reads a tensor's value raises."""
    with forbidden(monkeypatch), pytest.raises(AssertionError, match="host sync"):
        torch.ones(2).sum().item()


@pytest.mark.parametrize("form", list(FORMS))
def test_no_factorisation_runs_in_bf16_under_autocast(form, monkeypatch):
    seen: list[tuple[str, torch.dtype]] = []
    for name in FACTORISATIONS:
        original = getattr(torch.linalg, name)

        def record(a, *args, _name=name, _original=original, **kwargs):
            seen.append((_name, a.dtype))
            return _original(a, *args, **kwargs)

        monkeypatch.setattr(torch.linalg, name, record)
    model = narrow_vit()
    attention.apply(model, FORMS[form][0], **FORMS[form][1])  # initialisations factorise here
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(torch.randn(2, 3, 32, 32))
    out.float().sum().backward()
    assert all(dtype in (torch.float32, torch.float64) for _, dtype in seen), seen
    assert bool(seen) == (form in FACTORISING), seen  # the audit saw the factorisations there are


@pytest.mark.parametrize("form", list(FORMS))
def test_a_variants_buffers_follow_the_model(form):
    """``.to(dtype)`` moves every parameter and buffer a variant adds: nothing stays behind as a
    plain attribute the way a tensor made outside ``register_buffer`` would (on a GPU, on the CPU)."""
    model = narrow_vit()
    attention.apply(model, FORMS[form][0], **FORMS[form][1])
    model.to(torch.float64)
    stray = [
        f"{owner}.{key}"
        for owner, module in model.named_modules()
        for key, value in vars(module).items()
        if isinstance(value, torch.Tensor)
        and not isinstance(value, torch.nn.Parameter)
        and value.dtype != torch.float64
        and value.is_floating_point()
    ]
    assert not stray, stray
    assert all(
        t.dtype == torch.float64 for t in [*model.parameters(), *model.buffers()] if t.is_floating_point()
    )


class MatmulAudit(TorchDispatchMode):
    """Records ``(input dtype, float32 matmul precision)`` of every matrix product run while
    ``active`` (after autocast has cast the inputs: this mode sits below autocast)."""

    PRODUCTS = ("mm", "bmm", "addmm", "baddbmm")

    def __init__(self) -> None:
        super().__init__()
        self.active, self.seen = False, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.active and func.overloadpacket.__name__ in self.PRODUCTS:
            self.seen.append((args[0].dtype, torch.get_float32_matmul_precision()))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("form", sorted(NEWTON_SCHULZ))
def test_a_correction_multiplies_in_ieee_fp32_under_autocast(form):
    """Newton–Schulz needs fp32's 23 bits: under a bf16 run's autocast, and with TF32 allowed
    (``high``, as a GPU run sets it), every product of the correction runs on fp32 (or fp64)
    inputs at ``highest`` precision, and the run's setting is back afterwards."""
    model = narrow_vit()
    attention.apply(model, FORMS[form][0], **FORMS[form][1])
    audit = MatmulAudit()

    def on(*_):
        audit.active = True

    def off(*_):
        audit.active = False

    for module in model.modules():
        if isinstance(module, (TokenConditioner, AddSpectralShift)):
            module.register_forward_pre_hook(on)
            module.register_forward_hook(off)
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        with audit, torch.autocast("cpu", dtype=torch.bfloat16):
            model(torch.randn(2, 3, 32, 32))
        assert torch.get_float32_matmul_precision() == "high"
    finally:
        torch.set_float32_matmul_precision(previous)
    assert len(audit.seen) >= 10, audit.seen  # the audit saw the iteration's products
    assert all(d in (torch.float32, torch.float64) and p == "highest" for d, p in audit.seen), audit.seen


def test_the_matmul_audit_sees_autocasts_bf16():
    """The audit is live: a product under CPU bf16 autocast is recorded with bf16 inputs."""
    audit = MatmulAudit()
    audit.active = True
    with audit, torch.autocast("cpu", dtype=torch.bfloat16):
        torch.randn(2, 4, 4) @ torch.randn(2, 4, 4)
    assert audit.seen and audit.seen[0][0] == torch.bfloat16
