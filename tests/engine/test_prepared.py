"""One build sequence (:func:`src.engine.loop.prepared.prepared`): what it builds for a config is,
bit for bit, what the shared loop trains at step 0 and what the sandbox stacks for each seed; it
refuses a global batch of more than an epoch before it builds a model."""

from __future__ import annotations

import pytest
import torch
from conftest import compose
from torch import nn

import src.engine.loop.prepared as prepared_module
from src.engine import train
from src.engine.loop.batching import plan_batch
from src.engine.loop.prepared import prepared, seeded_task
from src.errors import ConfigError
from tasks.classification import Digits

ONE_STEP = ["trainer.max_steps=1", "trainer.val_every=0", "trainer.eval_batches=1", "trainer.device=cpu"]
SANDBOX = ["task=modadd", "task.train_size=64", "task.test_size=32"]


class Spy(Digits):
    """The embedded task, keeping the weights of the model its first training step calls."""

    seen: dict[str, torch.Tensor] = {}

    def train_loss(self, model: nn.Module, batch: tuple) -> torch.Tensor:
        if not Spy.seen:
            Spy.seen = {k: v.detach().clone() for k, v in model.state_dict().items()}
        return super().train_loss(model, batch)


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_prepared_builds_the_model_the_experiment_trains(tmp_path):
    """The weights of the experiment's first step are those ``prepared`` gives. cond_init sets
    attention weights at build time, so the variant's part is compared too; another seed gives
    other weights (the comparison can fail)."""
    overrides = [f"task._target_={__name__}.Spy", "attn=cond_init", *ONE_STEP]
    cfg = compose([*overrides, "seed=7"], tmp_path)
    Spy.seen = {}
    train(cfg, tmp_path / "run")
    task, (train_set, val_set), model = prepared(cfg)
    assert isinstance(task, Spy) and len(train_set) > len(val_set) > 0
    assert same(Spy.seen, model.state_dict())
    assert not same(Spy.seen, prepared(compose([*overrides, "seed=8"], tmp_path)).model.state_dict())


def test_evaluations_build_reads_the_split_and_builds_the_trained_architecture(tmp_path):
    """``split=``: the split alone, and a model of the training build's keys and shapes (its
    weights come from the checkpoint); from a seeded task, the same weights as training's too."""
    cfg = compose(["attn=cond_init", *ONE_STEP], tmp_path)
    trained = prepared(cfg)
    evaluated = prepared(cfg, seeded_task(cfg), split="val")
    assert len(evaluated.datasets) == 1 and len(evaluated.datasets[0]) == len(trained.datasets[1])
    assert same(trained.model.state_dict(), evaluated.model.state_dict())
    tested = prepared(cfg, seeded_task(cfg), split="test")
    assert len(tested.datasets) == 1 and len(tested.datasets[0]) == 359  # digits's test split
    assert same(trained.model.state_dict(), tested.model.state_dict())
    two_way = compose(["attn=cond_init", "task.test_fraction=0", *ONE_STEP], tmp_path)
    with pytest.raises(ConfigError, match="no 'test' split"):
        prepared(two_way, split="test")


def test_the_sandboxs_stacked_seeds_are_prepareds_per_seed(tmp_path):
    """Seed ``s`` of a stack: the weights and data ``prepared`` gives the config ``seed=s`` composes."""
    from src.sandbox.stacked import stack_seeds

    seeds = [0, 3]
    st = stack_seeds(compose(SANDBOX, tmp_path), seeds, tmp_path)
    stacked = {**st.trained, **st.fixed, **st.buffers}
    for i, seed in enumerate(seeds):
        _, (train_set, test_set), model = prepared(compose([*SANDBOX, f"seed={seed}"], tmp_path))
        assert same({k: v[i] for k, v in stacked.items()}, model.state_dict())
        assert torch.equal(st.x_train[i], train_set.tensors[0]) and torch.equal(
            st.y_test[i], test_set.tensors[1]
        )
    assert not all(torch.equal(v[0], v[1]) for v in st.trained.values())  # the seeds differ: it can fail


def test_a_global_batch_of_more_than_four_epochs_is_refused_before_the_model_is_built(tmp_path, monkeypatch):
    cfg = compose(ONE_STEP, tmp_path)
    built = []
    real = prepared_module.build_model
    monkeypatch.setattr(prepared_module, "build_model", lambda *a, **k: built.append(1) or real(*a, **k))
    with pytest.raises(ConfigError, match="more than 4 epochs"):
        prepared(cfg, batch=plan_batch(64, 10**9, 1))
    assert built == []
    prepared(cfg, batch=plan_batch(64, 1, 1))
    assert built == [1]
