"""Loss-spike detection: the detector, the numbers logged beside a spike, and a spike planted in a run."""

from __future__ import annotations

import json

import torch
from conftest import compose

from src.engine import train
from src.engine.loop import shared_loop
from src.engine.record.files import read_metrics
from src.models.sandbox import ClusteringHead
from src.sandbox.page import spike_events
from src.sandbox.spikes import SpikeDetector, grad_norms, module_of, norm_jacobian_max


def test_a_jump_over_the_running_median_is_flagged_once_the_window_is_full():
    losses = [1.0 - 0.001 * i for i in range(60)]
    losses[40] = 5.0  # a jump
    losses[45] = 2.5  # under 3x the median
    detector = SpikeDetector(factor=3.0, window=20)
    flagged = [i for i, v in enumerate(losses) if detector.update(v) is not None]
    assert flagged == [40]
    early = SpikeDetector(factor=3.0, window=20)
    assert [i for i, v in enumerate([1.0] * 5 + [9.0]) if early.update(v)] == []  # history too short


def test_the_floor_ignores_noise_on_a_loss_near_zero_and_the_state_round_trips():
    noisy = [1e-5, 3e-5, 1e-5, 2e-5] * 10 + [5e-4]
    assert all(SpikeDetector(window=10, floor=0.01).update(v) is None for v in noisy)
    assert SpikeDetector(window=10).update(0.0) is None
    a = SpikeDetector(window=10)
    for v in noisy[:30]:
        a.update(v)
    b = SpikeDetector(window=10)
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    assert [a.update(v) for v in noisy[30:]] == [b.update(v) for v in noisy[30:]]


def test_module_gradient_norms_add_up_to_the_total_the_clipper_sees():
    torch.manual_seed(0)
    model = ClusteringHead(2, 12)
    x = torch.randint(0, 2, (32, 12))
    torch.nn.functional.cross_entropy(model(x), x[:, :5].sum(1) % 2).backward()
    norms = grad_norms(model)
    assert set(norms) == {"token_emb", "pos_emb", "attn.query", "attn.value", "mlp.fc1", "mlp.fc2", "total"}
    total = torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf"))
    assert abs(norms["total"] - total.item()) < 1e-5 * total.item()
    assert (
        abs(sum(v**2 for k, v in norms.items() if k != "total") - norms["total"] ** 2) < 1e-9 + 1e-6 * total
    )
    assert module_of("blocks.0.attn.qkv.parametrizations.weight.original") == "blocks.0.attn.qkv"
    jac = norm_jacobian_max(model, x)
    normed_input = model.token_emb(x) + model.pos_emb  # what norm1 sees
    expected = 1 / (normed_input.pow(2).mean(-1).sqrt() + 1e-5)
    assert set(jac) == {"norm1", "norm2"} and abs(jac["norm1"] - expected.max().item()) < 1e-4


def test_spike_steps_closer_than_the_gap_make_one_event():
    rows = [
        {"step": s, "spike/loss": v, "spike/median": 0.5, "spike/ratio": v / 0.5, "norm_jacobian/norm1": j}
        for s, v, j in [(10, 2.0, 3.0), (11, 4.0, 1.0), (25, 1.0, 0.5), (90, 2.0, 2.0)]
    ]
    events = spike_events(rows + [{"step": 12, "train/loss": 0.1}], gap=50)
    assert [(e["first"], e["last"], e["loss"], e["norm_jacobian"]) for e in events] == [
        (10, 25, 4.0, 3.0),
        (90, 90, 2.0, 2.0),
    ]
    assert len(spike_events(rows, gap=1)) == 4


class PlantedSpike:
    """A scheduler wrapper: the optimizer step number ``at`` runs at ``factor`` × the learning rate."""

    def __init__(self, inner, optimizer, at: int, factor: float) -> None:
        self.inner, self.optimizer, self.at, self.factor = inner, optimizer, at, factor

    def step_update(self, num_updates: int) -> None:
        self.inner.step_update(num_updates)  # sets the rate of step num_updates + 1
        if num_updates + 1 == self.at:
            for group in self.optimizer.param_groups:
                group["lr"] *= self.factor

    def state_dict(self):
        return self.inner.state_dict()

    def load_state_dict(self, state) -> None:
        self.inner.load_state_dict(state)


def plant_spike(monkeypatch, at: int, factor: float) -> None:
    build = shared_loop.build_scheduler

    def planted(cfg, opt, *rest):
        return PlantedSpike(build(cfg, opt, *rest), opt, at, factor)

    monkeypatch.setattr(shared_loop, "build_scheduler", planted)


def spike_steps(run_dir) -> list[int]:
    rows = read_metrics(run_dir)
    return [r["step"] for r in rows if "spike/loss" in r]


def test_a_step_with_a_multiplied_learning_rate_is_found_as_a_spike(tmp_path, monkeypatch):
    overrides = ["task=modadd", "trainer.max_steps=80", "trainer.val_every=0", "trainer.monitor_every=0"]
    overrides += [
        "task.sandbox.frames=false",
        "task.sandbox.spike_window=30",
        "trainer.checkpoint_every=1000",
    ]
    control = train(compose(overrides, tmp_path), tmp_path / "control")
    plant_spike(monkeypatch, at=60, factor=1e4)
    planted = train(compose(overrides, tmp_path), tmp_path / "planted")
    assert control["steps"] == planted["steps"] == 80
    found = spike_steps(tmp_path / "planted")
    assert 61 in found  # the loss after the multiplied step jumps
    assert not [s for s in found if s <= 60]  # nothing before it
    assert 61 not in spike_steps(tmp_path / "control")
    row = next(row for row in read_metrics(tmp_path / "planted") if "spike/loss" in row and row["step"] == 61)
    assert row["spike/ratio"] > 3 and row["spike/grad_norm/total"] > 0 and "norm_jacobian/norm1" in row
