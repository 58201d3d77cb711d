"""One function builds a run's model (:func:`src.engine.loop.model.build_model`): the model the
shared loop trains is, bit for bit, the model it gives for the same config and seed, and a run
builds its attention variant once (the check and the model use the same object)."""

from __future__ import annotations

from pathlib import Path

import torch
from conftest import compose
from hydra.utils import instantiate
from torch import nn

from src.attention import config as attention_config
from src.engine import train
from src.engine.loop.model import build_model
from src.engine.loop.seeding import seed_everything
from tasks.classification import Digits

ONE_STEP = ["trainer.max_steps=1", "trainer.val_every=0", "trainer.eval_batches=1", "trainer.device=cpu"]


class Spy(Digits):
    """The embedded task, keeping the weights the loop hands to the task's first hook."""

    seen: dict[str, torch.Tensor] = {}
    applied: tuple = ()

    def prepare_model(self, model: nn.Module) -> None:
        Spy.seen = {k: v.detach().clone() for k, v in model.state_dict().items()}
        Spy.applied = model.attention_variants


def built(cfg) -> dict[str, torch.Tensor]:
    """The weights :func:`build_model` gives for ``cfg``, after what the pipeline does before it:
    the task built, the seed set, the data read."""
    task = instantiate(cfg.task)
    seed_everything(cfg.seed)
    task.datasets(Path(cfg.paths.data_dir))
    return build_model(cfg, task).state_dict()


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_the_loop_trains_the_model_build_model_gives_bit_for_bit(tmp_path):
    """cond_init sets the attention weights at build time, so the variant's part is compared too;
    another seed gives other weights (the comparison can fail)."""
    cfg = compose([f"task._target_={__name__}.Spy", "attn=cond_init", "seed=7", *ONE_STEP], tmp_path)
    train(cfg, tmp_path / "run")
    assert [v.name for v in Spy.applied] == ["cond_init"]
    assert same(Spy.seen, built(cfg))
    other = compose([f"task._target_={__name__}.Spy", "attn=cond_init", "seed=8", *ONE_STEP], tmp_path)
    assert not same(Spy.seen, built(other))


def test_a_run_builds_its_variant_once(tmp_path, monkeypatch):
    """train() builds the variant as it checks ``attn``; the loop applies that object, and builds
    none of its own (it built a second one before)."""
    calls = []
    real = attention_config.build

    def counted(*args, **options):
        variant = real(*args, **options)
        calls.append(variant)
        return variant

    monkeypatch.setattr(attention_config, "build", counted)
    cfg = compose([f"task._target_={__name__}.Spy", "attn=spectral", *ONE_STEP], tmp_path)
    train(cfg, tmp_path / "run")
    assert len(calls) == 1 and Spy.applied == (calls[0],)
