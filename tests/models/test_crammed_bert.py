"""Crammed BERT: equal to a forward written out from its weights, blind to masked padding on
both attention paths, tied and bias-free, every variant applies, the full size is Cramming's
120M, MLM checkpoints load into a classifier (and wrong ones fail clearly); the triangle schedule."""

from __future__ import annotations

import contextlib
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import CONF
from hydra.utils import instantiate
from omegaconf import OmegaConf

from src import attention
from src.conditioning import ConditioningMonitor
from src.engine.loop.optim import build_scheduler
from src.engine.loop.schedule import TriangleLRScheduler
from src.engine.record import checkpoint
from src.errors import ConfigError
from src.models.crammed_bert import CrammedBERT

VOCAB, LENGTH, DIM, DEPTH = 40, 12, 32, 2


def tiny(seed: int = 0, **kw) -> CrammedBERT:
    torch.manual_seed(seed)
    options = {"dim": DIM, "depth": DEPTH, "num_heads": 4, "ffn_dim": 64, "head_dim": 16, **kw}
    return CrammedBERT(VOCAB, LENGTH + 8, **options)


def batch(lengths: list[int], width: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Ids ``(B, width)`` with real tokens in ``1..V-1`` up to each length, pad id 0 after."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]  # (B, N)
    return torch.randint(1, VOCAB, (len(lengths), width), generator=g) * mask, mask


def explicit_attention(model: torch.nn.Module) -> contextlib.ExitStack:
    stack = contextlib.ExitStack()
    for site in attention.find_sites(model):
        stack.enter_context(site.explicit())
    return stack


def perturb_norms(model: torch.nn.Module) -> None:
    """Non-trivial LayerNorm weights and biases, so a reference that drops one of them fails."""
    with torch.no_grad():
        for name, value in model.named_parameters():
            if "norm" in name:
                value.normal_(1.0 if name.endswith("weight") else 0.0, 0.2)


def reference_encode(model: CrammedBERT, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Cramming's encoder written out from the weights: explicit LayerNorm, sinusoids, masked
    softmax and GELU-GLU (``x, gate`` = first and second half of ``dense_in``)."""
    p = dict(model.named_parameters())

    def norm(x, name):
        mean, var = x.mean(-1, keepdim=True), x.var(-1, unbiased=False, keepdim=True)
        return (x - mean) / torch.sqrt(var + 1e-12) * p[f"{name}.weight"] + p[f"{name}.bias"]

    n, dim = ids.shape[1], DIM
    pos = torch.arange(n, dtype=torch.float64)[:, None]  # (N, 1)
    angle = pos / 10000 ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)  # (N, D/2)
    table = torch.stack([angle.sin(), angle.cos()], dim=-1).flatten(1).float()  # (N, D) sin, cos interleaved
    x = norm(p["word_embedding.weight"][ids] + p["pos_scale"] * table, "embed_norm")
    for i, block in enumerate(model.blocks):
        heads, d = block.attn.num_heads, dim // block.attn.num_heads
        qkv = norm(x, f"blocks.{i}.norm1") @ p[f"blocks.{i}.attn.qkv.weight"].T
        q, k, v = (t.unflatten(-1, (heads, d)).transpose(1, 2) for t in qkv.split(dim, -1))  # (B, H, N, d)
        scores = (q @ k.transpose(-1, -2) / math.sqrt(d)).masked_fill(~mask[:, None, None, :], -math.inf)
        heads_out = (scores.softmax(-1) @ v).transpose(1, 2).flatten(2)  # (B, N, D)
        x = x + heads_out @ p[f"blocks.{i}.attn.proj.weight"].T
        u = norm(x, f"blocks.{i}.norm2") @ p[f"blocks.{i}.ffn.dense_in.weight"].T  # (B, N, F)
        value, gate = u[..., : u.shape[-1] // 2], u[..., u.shape[-1] // 2 :]
        x = x + (F.gelu(gate) * value) @ p[f"blocks.{i}.ffn.dense_out.weight"].T
    return norm(x, "final_norm")


@pytest.mark.parametrize("explicit", [False, True])
def test_encoder_equals_a_reference_written_from_the_weights(explicit):
    model = tiny().eval()
    perturb_norms(model)
    with torch.no_grad():
        model.pos_scale.fill_(0.7)  # positions weigh in: a wrong table would show
    ids, mask = batch([LENGTH, 7, 2], LENGTH)
    with torch.no_grad(), explicit_attention(model) if explicit else contextlib.nullcontext():
        out = model.encode(ids, mask)
    torch.testing.assert_close(out, reference_encode(model, ids, mask), rtol=1e-5, atol=1e-5)


def test_real_tokens_ignore_appended_padding_in_eval():
    model = tiny(num_labels=3).eval()
    perturb_norms(model)
    ids, mask = batch([LENGTH, 7, 1], LENGTH)
    wide = torch.cat([ids, torch.zeros(3, 8, dtype=ids.dtype)], dim=1)
    wide_mask = torch.cat([mask, torch.zeros(3, 8, dtype=torch.bool)], dim=1)
    with torch.no_grad():
        narrow_out, wide_out = model.encode(ids, mask), model.encode(wide, wide_mask)
        torch.testing.assert_close(wide_out[:, :LENGTH], narrow_out, rtol=0, atol=1e-5)
        torch.testing.assert_close(model(wide, wide_mask), model(ids, mask), rtol=0, atol=1e-5)
        unmasked = model.encode(wide)  # the same padding attended to: the test can see padding
    assert (unmasked[:, :LENGTH] - narrow_out).abs().max() > 1e-3


def test_fused_and_explicit_paths_agree_and_padded_keys_get_no_probability():
    model = tiny().eval()
    perturb_norms(model)
    ids, mask = batch([LENGTH, 5, 3], LENGTH, seed=1)
    sites = attention.find_sites(model)
    assert all(site.module.fused_attn for site in sites)  # the default path is SDPA's
    probs = []
    sites[0].probs.register_forward_pre_hook(lambda m, a: probs.append(a[0]))
    with torch.no_grad():
        fused = model(ids, mask)
        with explicit_attention(model):
            explicit = model(ids, mask)
    torch.testing.assert_close(fused, explicit, rtol=1e-5, atol=1e-5)
    (p,) = probs  # (B, H, N, N): only the explicit path materialises P
    assert p[~mask[:, None, None, :].expand_as(p)].abs().max() == 0
    torch.testing.assert_close(p.sum(-1), torch.ones(p.shape[:-1]))


def test_the_decoder_is_the_word_embedding_and_no_encoder_linear_has_a_bias():
    model = tiny(num_labels=2)
    assert model.decoder.weight is model.word_embedding.weight and model.decoder.bias is None
    encoder = [(n, m) for n, m in model.named_modules() if not n.startswith(("pooler", "head"))]
    linears = [(n, m) for n, m in encoder if isinstance(m, torch.nn.Linear)]
    assert len(linears) == 4 * DEPTH + 1  # qkv, proj, dense_in, dense_out per block; the decoder
    assert all(m.bias is None for _, m in linears), [n for n, m in linears if m.bias is not None]
    assert model.pooler[0].bias is not None and model.head.bias is not None
    hidden = torch.randn(5, DIM)
    torch.testing.assert_close(model.mlm_logits(hidden), hidden @ model.word_embedding.weight.T)
    distinct = {p.data_ptr() for p in model.parameters()}
    assert len(distinct) == len(list(model.parameters()))  # the tied table is counted once


def test_initialisation_follows_cramming():
    model = tiny(dim=64, depth=4, num_heads=4, ffn_dim=256)
    weights = torch.cat([m.weight.flatten() for m in model.modules() if isinstance(m, torch.nn.Linear)])
    assert weights.std().item() == pytest.approx(0.02, rel=0.03)
    assert model.word_embedding.weight[0].abs().max() == 0  # the padding row
    assert model.pos_scale.item() == pytest.approx(1 / math.sqrt(64))


FORMS = {"spectral": {"lam": 1.0}}  # lam=10 saturates this tiny model's softmax; the form is what counts


@pytest.mark.parametrize("variant", list(attention.VARIANTS))
def test_every_variant_applies_trains_and_is_read_by_the_monitor(variant):
    cfg = OmegaConf.merge(OmegaConf.load(CONF / "attn" / f"{variant}.yaml"), FORMS.get(variant, {}))
    untouched = tiny().train()
    model = attention.apply(tiny().train(), attention.variant_from_config(cfg))
    ids, mask = batch([LENGTH, 9, 4], LENGTH, seed=2)
    torch.manual_seed(0)
    out = model(ids, mask)
    torch.manual_seed(0)
    assert out.shape == (3, LENGTH, VOCAB) and torch.isfinite(out).all()
    assert torch.allclose(out, untouched(ids, mask)) == (variant == "standard")
    out.square().mean().backward()
    sites = attention.find_sites(model)
    assert [s.name for s in sites] == [f"blocks.{i}.attn" for i in range(DEPTH)]
    for site in sites:
        for proj in site.projections().values():
            linear = proj.linear
            grad = (linear.parametrizations.weight.original if variant == "spectral" else linear.weight).grad
            assert grad is not None and torch.isfinite(grad).all() and grad[proj.rows].abs().sum() > 0
    stats = ConditioningMonitor(model.eval())(ids, mask)
    assert {"kappa/P/median", "kappa/X/median", "kappa/tokens/median"} <= set(stats)


@pytest.mark.parametrize("where", ["embed", "block"])
def test_the_token_entries_see_the_whole_padded_sequence(where):
    """``block``: the first block's first argument; ``embed``: the word embeddings, padding rows included."""
    model, seen = tiny().eval(), []
    model.token_entry(where).observe(seen.append)
    ids, mask = batch([LENGTH, 5], LENGTH)
    with torch.no_grad():
        model(ids, mask)
    (tokens,) = seen
    assert tokens.shape == (2, LENGTH, DIM)
    if where == "embed":
        torch.testing.assert_close(tokens, model.word_embedding(ids))
    else:
        expected = model.embed_norm(model.word_embedding(ids) + model.pos_scale * model.positions[:LENGTH])
        torch.testing.assert_close(tokens, expected)
    conditioned = attention.apply(tiny().eval(), "cond_tokens", where=where)
    with torch.no_grad():
        assert not torch.allclose(conditioned(ids, mask), model(ids, mask))


def backbone_model(name: str, **kw) -> CrammedBERT:
    cfg = OmegaConf.load(CONF / "backbone" / f"{name}.yaml")
    assert cfg.kind == "text" and "vocab_size" not in cfg.model and "num_labels" not in cfg.model
    return instantiate(cfg.model, **kw)


def test_the_full_size_is_crammings_sixteen_layers_and_about_120m_parameters():
    with torch.device("meta"):
        model = backbone_model("crammed_bert", vocab_size=32768, max_len=128)
    total = model.num_params(embeddings=True)
    assert len(model.blocks) == 16 and model.blocks[0].attn.num_heads == 12
    assert model.word_embedding.weight.shape == (32768, 768)
    assert 100e6 <= total <= 130e6, f"{total:,} parameters"
    assert model.blocks[0].ffn.dense_out.in_features == 1536 and model.final_norm.eps == 1e-12


def test_the_micro_size_is_small_and_runs():
    model = backbone_model("crammed_bert_micro", vocab_size=VOCAB, max_len=LENGTH, num_labels=2).eval()
    assert model.num_params(embeddings=True) < 200_000, model.num_params(embeddings=True)
    ids, mask = batch([LENGTH, 3], LENGTH)
    assert model(ids, mask).shape == (2, 2)


def save_mlm(path: Path, model: CrammedBERT, step: int = 7) -> Path:
    checkpoint.save({"model": model.state_dict(), "step": step}, path)
    return path


@pytest.mark.parametrize("variant", ["standard", "spectral"])
def test_an_mlm_checkpoint_loads_into_a_classifier(variant, tmp_path):
    mlm = attention.apply(tiny(seed=1), variant)
    path = save_mlm(tmp_path / "checkpoints" / "last.pt", mlm)
    classifier = attention.apply(tiny(seed=2, num_labels=3, pretrained=str(path)), variant)
    head_before = classifier.head.weight.clone()
    assert not torch.equal(classifier.blocks[0].attn.qkv.weight, mlm.blocks[0].attn.qkv.weight)
    assert classifier.load_pretrained() == {"path": str(path), "step": 7}
    shared = mlm.state_dict()
    encoder = {k: v for k, v in classifier.state_dict().items() if not k.startswith(("pooler.", "head."))}
    assert encoder.keys() == shared.keys() and all(torch.equal(v, shared[k]) for k, v in encoder.items())
    assert torch.equal(classifier.head.weight, head_before)  # the head keeps its own initialisation
    ids, mask = batch([LENGTH, 6], LENGTH)
    with torch.no_grad():
        torch.testing.assert_close(classifier.eval().encode(ids, mask), mlm.eval().encode(ids, mask))


def test_a_plain_state_dict_loads_without_a_step_and_its_head_is_ignored(tmp_path):
    """A classifier's weights (another head: 3 labels) load into a regressor; the head stays its own."""
    path = tmp_path / "weights.pt"
    torch.save(tiny(seed=1, num_labels=3).state_dict(), path)
    regressor = tiny(num_labels=1)
    head = regressor.head.weight.clone()
    assert regressor.load_pretrained(path) == {"path": str(path), "step": None}
    assert torch.equal(regressor.head.weight, head) and regressor.head.weight.shape == (1, 16)


REFUSED = [({"dim": 48}, "standard", "other shapes"), ({"depth": 3}, "standard", "unexpected")]


@pytest.mark.parametrize("other, applied, says", [*REFUSED, ({}, "spectral", "missing")])
def test_a_checkpoint_of_another_size_or_variant_is_refused_naming_the_file(other, applied, says, tmp_path):
    path = save_mlm(tmp_path / "last.pt", attention.apply(tiny(**other), applied))
    classifier = tiny(num_labels=3)
    with pytest.raises(ConfigError) as error:
        classifier.load_pretrained(path)
    message = str(error.value)
    assert str(path) in message and says in message and "same attention variant" in message


def test_a_missing_checkpoint_says_which_file_and_what_it_must_be(tmp_path):
    path = tmp_path / "nowhere" / "last.pt"  # as a typo'd run folder would give
    with pytest.raises(ConfigError, match="checkpoints/last.pt") as error:
        tiny(num_labels=2, pretrained=str(path)).load_pretrained()
    assert str(path) in str(error.value) and "task=mlm" in str(error.value)


def optimizer(lr: float = 1e-3) -> torch.optim.Optimizer:
    return torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=lr)


def test_the_triangle_starts_at_a_quarter_peaks_at_three_quarters_and_ends_at_zero():
    total, lr = 400, 1e-3
    sched = TriangleLRScheduler(opt := optimizer(lr), t_initial=total)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.25 * lr)  # set at construction
    rates = []
    for t in range(total + 1):
        sched.step_update(t)
        rates.append(opt.param_groups[0]["lr"] / lr)
    peak = rates.index(max(rates))
    assert rates[0] == pytest.approx(0.25) and rates[-1] == pytest.approx(0.0, abs=1e-12)
    assert peak == 300 and rates[peak] == pytest.approx(1.0)
    rise, fall = torch.tensor(rates[: peak + 1]).diff(), torch.tensor(rates[peak:]).diff()
    torch.testing.assert_close(rise, torch.full_like(rise, 0.75 / 300), rtol=1e-4, atol=0)  # linear
    torch.testing.assert_close(fall, torch.full_like(fall, -1 / 100), rtol=1e-4, atol=0)
    assert sched.factor(total + 50) == 0.0  # never negative past the end


def test_build_scheduler_makes_the_triangle_from_its_config():
    cfg = OmegaConf.load(CONF / "sched" / "triangle.yaml")
    sched = build_scheduler(cfg, opt := optimizer(2e-3), total_steps=80, steps_per_epoch=10)
    assert isinstance(sched, TriangleLRScheduler) and sched.t_initial == 80
    sched.step_update(60)
    assert opt.param_groups[0]["lr"] == pytest.approx(2e-3)
    with pytest.raises(Exception, match="warmup_t=10") as error:  # Hydra wraps what targets raise
        build_scheduler(OmegaConf.merge(cfg, {"warmup_steps": 10}), optimizer(), 80, 10)
    assert isinstance(error.value.__cause__, ConfigError)  # what src.run prints, without a traceback
