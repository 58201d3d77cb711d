"""The GPU check's kernel section: which SDPA kernel each model's attention runs.

**Attention.** Every attention call of a training step (forward and backward, bf16 autocast)
is recorded at the dispatcher (:class:`Dispatched`): ``F.scaled_dot_product_attention`` shows
there as the kernel it chose (flash, memory-efficient, cuDNN, or on a CPU its flash form), or,
where no fused kernel takes the inputs, as its math fallback's matmuls and softmax. The calls
are the model's attention modules' forwards (counted by hooks), so a call that fell back, or
a module computing its scores explicitly, leaves fewer fused kernels than calls. The models:
ViT-B (no mask: flash expected), GPT-2 small (``is_causal``: flash), Crammed BERT on GLUE and
the LRA transformer (boolean key-padding masks: memory-efficient or cuDNN, flash takes no mask).
On a CPU (``--dry``) the attention dropout is set to 0: the CPU's one fused kernel (its flash
form) takes no dropout and falls back to math with it, where CUDA's kernels take it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

#: the aten forward operations of SDPA's fused kernels (CUDA's three, and the CPU's flash form)
FUSED_SDPA = {
    "aten._scaled_dot_product_flash_attention": "flash",
    "aten._scaled_dot_product_efficient_attention": "memory-efficient",
    "aten._scaled_dot_product_cudnn_attention": "cudnn",
    "aten._scaled_dot_product_flash_attention_for_cpu": "flash (CPU)",
    "aten._scaled_dot_product_fused_attention_overrideable": "fused (other device)",
}


class Dispatched(TorchDispatchMode):
    """The aten operations dispatched inside it, by name."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        self.names.append(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))


def attention_models(dry: bool) -> list[tuple[str, list[str], str, str]]:
    """(name, the overrides composing it, the inputs it takes, the kernel expected), full size or
    the micro backbones with ``dry``."""
    vit, gpt, bert = (
        ("vit_micro", "gpt_micro", "crammed_bert_micro")
        if dry
        else ("vit_base", "gpt2_small", "crammed_bert")
    )
    padded = "memory-efficient or cudnn"
    return [
        ("vit", ["task=imagenet", f"backbone={vit}"], "image", "flash"),
        ("gpt", ["task=lm_tinystories", f"backbone={gpt}"], "causal", "flash"),
        ("bert", ["task=glue_sst2", f"backbone={bert}"], "padded", padded),
        ("lra", ["task=lra_text", "backbone=lra_transformer"], "padded", padded),
    ]


def attention_step(overrides: list[str], inputs: str, device: str, batch: int) -> dict[str, Any]:
    """One bf16-autocast forward and backward of the composed model on ``device``: its attention
    calls, the fused SDPA kernels among them, and which."""
    from launch.tools.flops import model_and_inputs
    from src.configs import compose

    cfg = compose([*overrides, "attn=standard"])
    torch.manual_seed(0)
    model, one, _ = model_and_inputs(cfg, device="cpu")
    model = model.to(device).train()
    x = tuple(t.to(device).expand(batch, *t.shape[1:]).clone() for t in one)
    if inputs == "padded":  # the last quarter of every sequence is padding: masked keys
        for mask in x[1::2] if len(x) > 1 else ():
            mask[:, mask.shape[1] * 3 // 4 :] = False
        if len(x) == 1:
            pad = torch.ones_like(x[0], dtype=torch.bool)
            pad[:, pad.shape[1] * 3 // 4 :] = False
            x = (x[0], pad)
    if device == "cpu":  # the CPU's fused kernel (flash) takes no dropout, CUDA's do: off here
        for module in model.modules():
            if getattr(module, "fused_attn", False) and isinstance(
                getattr(module, "attn_drop", None), nn.Dropout
            ):
                module.attn_drop.p = 0.0
    calls = [0]
    hooks = [
        m.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
        for m in model.modules()
        if getattr(m, "fused_attn", False) and isinstance(m, nn.Module)
    ]
    try:
        with Dispatched() as seen, torch.autocast(device, dtype=torch.bfloat16):
            out = model(*x)
            out = out[0] if isinstance(out, tuple | list) else out
            out.float().sum().backward()
    finally:
        for hook in hooks:
            hook.remove()
    kernels = [FUSED_SDPA[n] for n in seen.names if n in FUSED_SDPA]
    return {"calls": calls[0], "fused": len(kernels), "kernels": sorted(set(kernels))}
