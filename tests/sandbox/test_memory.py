"""P5's associative memory under gradient descent (src/sandbox/memory.py): the closed-form
Hessian, the descent lemma's bound, and the spike statistic's bookkeeping."""

from __future__ import annotations

import json

import pytest
import torch

from src.sandbox.memory import Memory, Trajectory, hessian, main, run, spike_statistic, train


@pytest.mark.parametrize("tokens", [3, 30])
def test_the_closed_form_hessian_is_autograds(tokens):
    memory = Memory.draw(seed=tokens, tokens=tokens)
    W = torch.randn(2, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) * 3
    expected = torch.autograd.functional.hessian(memory.loss, W).reshape(4, 4)
    assert torch.allclose(hessian(memory, W), expected, atol=1e-12)


def test_the_curvature_is_at_most_one_half_so_a_step_under_4_never_raises_the_loss():
    """Unit embeddings, two classes: λ_max ≤ Σ p_x ‖e_x‖² · ½ = ½ at every W; by the descent lemma
    gradient descent at η = 1 (< 2/½) never raises the loss, at any seed."""
    for tr in run(range(30), [1.0], steps=20):
        assert max(tr.sharpness) <= 0.5 + 1e-12
        assert tr.spikes() == [] and tr.loss[-1] < tr.loss[0]


def test_a_spike_is_a_rise_of_the_loss_and_the_statistic_counts_steps_by_their_curvature():
    tr = Trajectory(0, lr=10.0, loss=[1.0, 0.5, 0.9, 0.4, 0.45, 0.3], grad_norm=[1, 2, 3, 4, 5, 6])
    tr.sharpness = [0.1, 0.3, 0.1, 0.25, 0.05, 0.1]  # η·λ: 1, 3, 1, 2.5, 0.5, 1
    assert tr.spikes() == [1, 3]
    s = spike_statistic([tr])
    assert (s.spikes, s.spikes_sharp, s.control, s.control_sharp) == (2, 2, 3, 0)
    assert s.spike_grad == 3 and s.control_grad == 3  # medians of (2, 4) and (1, 3, 5)
    assert s.seed_differences == [1.0]  # this seed: 2 of 2 spikes sharp, 0 of 3 other steps


def test_gradient_descent_updates_w_by_the_gradient():
    """One step moves the loss by about −η‖∇‖² (first order; η small)."""
    memory = Memory.draw(seed=4)
    tr = train(memory, lr=1e-4, steps=1, seed=4)
    assert tr.loss[1] - tr.loss[0] == pytest.approx(-1e-4 * tr.grad_norm[0] ** 2, rel=1e-3)


def test_the_command_writes_its_record_and_refuses_to_overwrite_it(tmp_path, capsys):
    out = tmp_path / "memory"
    assert main(["--seeds", "0-3", "--lrs", "10,1", "--steps", "10", "--out", str(out)]) == 0
    record = json.loads((out / "memory.json").read_text())
    assert [s["lr"] for s in record["statistics"]] == [10.0, 1.0]
    assert len(record["trajectories"]) == 8 and (out / "memory.png").stat().st_size > 1000
    assert main(["--seeds", "0-3", "--out", str(out)]) == 2
    assert "exists" in capsys.readouterr().err
    assert main(["--lrs", "ten"]) == 2
