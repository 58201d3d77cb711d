"""P5's loss spikes in the regime its code shows them: an associative memory under gradient descent.

    python -m src.sandbox.memory --seeds 0-199 --lrs 10,1 --out DIR

P5's code draws its spikes (facebookresearch/pal, ``projects/gradient_descent``: the spike and
sharpness experiments) not on the transformer but on the model its analysis reduces a layer to:
an associative memory whose score for class ``y`` given token ``x`` is ``e_xᵀ W u_y`` (``E``:
``n`` token embeddings in ``d = 2``, unit norm; ``U``: the class embeddings, here ``I``; ``W``:
``d × d``, the only parameter), trained by full-batch gradient descent on the token-weighted
cross-entropy at a large step (η = 10 against 1), 35 steps, tokens drawn with Zipf weights
``p_x ∝ 1/(x + 1)``, the class the token's parity (P5's setting; the draws of ``E`` and of the
start ``W₀ ~ N(0, 1/d)`` are the seed's).

The claim "spikes come from the curvature" is measured here as a correlation over every step of
every seed: a step is a **spike** when the full-batch loss rises (``L(W_{t+1}) > L(W_t)``: the
loss is deterministic, so a rise is not noise; **[reading]** P5 shows spikes as rises of this
loss, with no threshold), and its curvature is the Hessian's largest eigenvalue ``λ_max(W_t)``
(:func:`hessian`, closed form, tested against autograd). Gradient descent on a function whose
curvature stays below ``2/η`` never raises it (the descent lemma); so the prediction is that
spikes happen where ``η·λ_max > 2`` and the control steps (no spike) mostly where it is not.
The statistic is the share of spike steps with ``η·λ_max > 2`` against that share among the
control steps, each with its exact interval (Fisher's exact test of the difference, descriptive:
the steps of one seed are not independent). The verdict is read per seed: for each seed with a
spike, its spikes' share minus its control steps' share (``seed_differences``), whose mean over
the seeds, with its t interval, is the claim's effect (:mod:`launch.analysis.seed_verdicts`).
**[reading]** ``W₀ ~ N(0, 1/d)`` (P5's spike figure starts from 0, its sharpness figure from
one chosen point; a draw per seed lets the statistic run over many starts).

A bound the tests use: with unit embeddings and two classes, ``λ_max ≤ 1/2`` everywhere (the
softmax's Hessian is at most ``1/2`` on two classes), so at η < 4 no step can be a spike.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from src.command import command_parser, run_command
from src.engine.record import atomic
from src.engine.record.lock import OutputLock
from src.errors import ConfigError


@dataclass
class Memory:
    """One draw of P5's associative-memory problem: embeddings, class embeddings, targets, weights."""

    E: Tensor  # (n, d): token embeddings, unit norm
    U: Tensor  # (m, d): class embeddings
    y: Tensor  # (n,): each token's class
    p: Tensor  # (n,): each token's probability

    @classmethod
    def draw(cls, seed: int, tokens: int = 3, dim: int = 2) -> Memory:
        """``tokens`` unit embeddings drawn from the seed, Zipf weights, the parity as class."""
        g = torch.Generator().manual_seed(seed)
        E = torch.randn(tokens, dim, generator=g, dtype=torch.float64)
        E = E / E.norm(dim=1, keepdim=True)
        x = torch.arange(tokens)
        p = 1.0 / (x + 1.0).double()
        return cls(E, torch.eye(dim, dtype=torch.float64), x % 2, p / p.sum())

    def scores(self, W: Tensor) -> Tensor:  # (d, d) -> (n, m)
        return self.E @ W @ self.U.T

    def loss(self, W: Tensor) -> Tensor:
        """The token-weighted cross-entropy ``Σ_x p_x · CE(e_xᵀ W Uᵀ, y_x)``."""
        return (self.p * F.cross_entropy(self.scores(W), self.y, reduction="none")).sum()

    def accuracy(self, W: Tensor) -> float:
        return float((self.p * (self.scores(W).argmax(1) == self.y)).sum())


def hessian(memory: Memory, W: Tensor) -> Tensor:
    """The loss's Hessian in ``W`` (row-major flattened, ``(d², d²)``), in closed form:
    ``Σ_x p_x · (e_x e_xᵀ) ⊗ Uᵀ(diag(q_x) − q_x q_xᵀ)U``, ``q_x`` the softmax of ``x``'s scores
    (the score is linear in ``W``, so only the softmax's curvature enters)."""
    q = memory.scores(W).softmax(dim=1)  # (n, m)
    softmax_curvature = torch.diag_embed(q) - q[:, :, None] * q[:, None, :]  # (n, m, m)
    per_class = memory.U.T @ softmax_curvature @ memory.U  # (n, d, d)
    outer = memory.E[:, :, None] * memory.E[:, None, :]  # (n, d, d)
    d = W.shape[0]
    return sum(w * torch.kron(o, c) for w, o, c in zip(memory.p, outer, per_class, strict=True)).reshape(
        d * d, d * d
    )


@dataclass
class Trajectory:
    """One seed at one learning rate: per step the loss, accuracy, gradient norm and λ_max."""

    seed: int
    lr: float
    loss: list[float] = field(default_factory=list)
    accuracy: list[float] = field(default_factory=list)
    grad_norm: list[float] = field(default_factory=list)
    sharpness: list[float] = field(default_factory=list)

    def spikes(self) -> list[int]:
        """The steps ``t`` whose update raised the loss: ``loss[t + 1] > loss[t]`` (beyond float
        rounding)."""
        return [t for t in range(len(self.loss) - 1) if self.loss[t + 1] > self.loss[t] * (1 + 1e-12)]


def train(memory: Memory, lr: float, steps: int = 35, seed: int = 0) -> Trajectory:
    """Full-batch gradient descent from ``W₀ ~ N(0, 1/d)`` (the seed's), ``steps`` updates."""
    d = memory.E.shape[1]
    g = torch.Generator().manual_seed(seed + 1_000_003)
    W = (torch.randn(d, d, generator=g, dtype=torch.float64) / math.sqrt(d)).requires_grad_()
    out = Trajectory(seed, lr)
    for step in range(steps + 1):
        loss = memory.loss(W)
        (grad,) = torch.autograd.grad(loss, W)
        out.loss.append(float(loss.detach()))
        out.accuracy.append(memory.accuracy(W.detach()))
        out.grad_norm.append(float(grad.norm()))
        out.sharpness.append(float(torch.linalg.eigvalsh(hessian(memory, W.detach())).max()))
        if step < steps:
            with torch.no_grad():
                W -= lr * grad
    return out


@dataclass(frozen=True)
class SpikeStatistic:
    """Spike steps against control steps: how many of each had ``η·λ_max > 2``."""

    lr: float
    seeds: int
    seeds_with_spikes: int
    spikes: int
    spikes_sharp: int
    control: int
    control_sharp: int
    p_value: float  # Fisher's exact, one-sided: spikes more often sharp than the control
    spike_grad: float  # median gradient norm at the spikes (nan without one)
    control_grad: float
    # per seed with a spike and a control step: its spikes' share with η·λ_max > 2 minus its
    # control steps' share
    seed_differences: list[float] = field(default_factory=list)

    def share(self, sharp: int, total: int) -> tuple[float, float, float]:
        from scipy.stats import binomtest

        if total == 0:
            return math.nan, math.nan, math.nan
        ci = binomtest(sharp, total).proportion_ci(0.95, method="exact")
        return sharp / total, ci.low, ci.high


def spike_statistic(trajectories: Sequence[Trajectory]) -> SpikeStatistic:
    """Every step of every trajectory (one learning rate): spike or control, sharp or not."""
    import statistics

    from scipy.stats import fisher_exact

    spike_sharp = spike_flat = control_sharp = control_flat = 0
    spike_grads, control_grads, differences = [], [], []
    for tr in trajectories:
        spikes = set(tr.spikes())
        steps = range(len(tr.loss) - 1)
        if spikes and len(spikes) < len(steps):
            sharp = [tr.lr * tr.sharpness[t] > 2 for t in steps]
            here = sum(sharp[t] for t in spikes) / len(spikes)
            elsewhere = sum(sharp[t] for t in steps if t not in spikes) / (len(steps) - len(spikes))
            differences.append(here - elsewhere)
        for t in range(len(tr.loss) - 1):
            sharp = tr.lr * tr.sharpness[t] > 2
            if t in spikes:
                spike_sharp, spike_flat = spike_sharp + sharp, spike_flat + (not sharp)
                spike_grads.append(tr.grad_norm[t])
            else:
                control_sharp, control_flat = control_sharp + sharp, control_flat + (not sharp)
                control_grads.append(tr.grad_norm[t])
    _, p = fisher_exact([[spike_sharp, spike_flat], [control_sharp, control_flat]], alternative="greater")
    return SpikeStatistic(
        trajectories[0].lr,
        len(trajectories),
        sum(bool(tr.spikes()) for tr in trajectories),
        spike_sharp + spike_flat,
        spike_sharp,
        control_sharp + control_flat,
        control_sharp,
        float(p),
        statistics.median(spike_grads) if spike_grads else math.nan,
        statistics.median(control_grads) if control_grads else math.nan,
        differences,
    )


def table(found: Sequence[SpikeStatistic]) -> str:
    lines = [
        "| η | seeds with a spike | spikes: η·λ_max > 2 [95%] | control steps: η·λ_max > 2 [95%] "
        "| Fisher p | median ‖∇‖ spike / control |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for s in found:
        cells = []
        for sharp, total in ((s.spikes_sharp, s.spikes), (s.control_sharp, s.control)):
            share, low, high = s.share(sharp, total)
            cells.append(
                f"{sharp} of {total}" + ("" if total == 0 else f" ({share:.0%} [{low:.0%}, {high:.0%}])")
            )
        lines.append(
            f"| {s.lr:g} | {s.seeds_with_spikes} of {s.seeds} | {cells[0]} | {cells[1]} | {s.p_value:.2g} "
            f"| {s.spike_grad:.3g} / {s.control_grad:.3g} |"
        )
    return "\n".join(lines)


def draw(trajectories: Sequence[Trajectory], path: Path, shown: int = 8) -> None:
    """Per learning rate, the loss (spikes marked) and ``η·λ_max`` against 2, for ``shown`` seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lrs = sorted({tr.lr for tr in trajectories}, reverse=True)
    fig, axes = plt.subplots(
        2, len(lrs), figsize=(4.2 * len(lrs), 5.2), squeeze=False, constrained_layout=True
    )
    for column, lr in enumerate(lrs):
        mine = [tr for tr in trajectories if tr.lr == lr][:shown]
        for tr in mine:
            (line,) = axes[0, column].plot(tr.loss, lw=1)
            spikes = tr.spikes()
            axes[0, column].plot(spikes, [tr.loss[t] for t in spikes], "v", color=line.get_color(), ms=4)
            axes[1, column].plot([lr * s for s in tr.sharpness], lw=1, color=line.get_color())
        axes[1, column].axhline(2, color="k", lw=0.8, ls="--")
        axes[0, column].set(title=f"η = {lr:g}: loss (▼ a spike)", yscale="log")
        axes[1, column].set(title="η·λ_max (dashed: 2)", xlabel="step")
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(seeds: Sequence[int], lrs: Sequence[float], steps: int = 35, tokens: int = 3) -> list[Trajectory]:
    return [train(Memory.draw(s, tokens), lr, steps, s) for lr in lrs for s in seeds]


def main(argv: Sequence[str] | None = None) -> int:
    parser = command_parser(__spec__.name, __doc__)
    parser.add_argument("--seeds", default="0-199", help="a range 0-199 or a list 0,3,7")
    parser.add_argument("--lrs", default="10,1", help="learning rates, comma-separated (P5's: 10,1)")
    parser.add_argument("--steps", type=int, default=35, help="gradient steps (P5's: 35)")
    parser.add_argument("--tokens", type=int, default=3, help="tokens in the memory (P5's: 3 or 30)")
    parser.add_argument("--out", type=Path, default=None, help="folder for memory.json and memory.png")
    return run_command(parser, measure_under_lock, argv, expected=(ValueError,))


def measure_under_lock(args: argparse.Namespace) -> int:
    """The arguments checked, then :func:`measure` under ``--out``'s lock (two commands into one
    ``--out``: the second is refused, the folder's lock held to the end)."""
    from .seeds import parse_seeds

    seeds = parse_seeds(args.seeds)
    lrs = [float(v) for v in args.lrs.split(",")]
    if args.steps < 1 or args.tokens < 2 or any(lr <= 0 for lr in lrs):
        raise ConfigError("--steps ≥ 1, --tokens ≥ 2 and positive --lrs")
    with OutputLock(args.out, "python -m src.sandbox.memory") if args.out else contextlib.nullcontext():
        if args.out and (args.out / "memory.json").exists():
            raise ConfigError(
                f"{args.out / 'memory.json'} exists: give another --out (nothing is overwritten)"
            )
        return measure(args, seeds, lrs)


def measure(args: argparse.Namespace, seeds: list[int], lrs: list[float]) -> int:
    """The command's work: every seed at every learning rate, the table, and ``--out``'s files."""
    torch.set_num_threads(1)
    trajectories = run(seeds, lrs, args.steps, args.tokens)
    found = [spike_statistic([t for t in trajectories if t.lr == lr]) for lr in lrs]
    print(table(found))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        record = {"args": vars(args) | {"out": str(args.out)}, "statistics": [asdict(s) for s in found]}
        record["trajectories"] = [asdict(t) for t in trajectories]
        atomic.write_text(args.out / "memory.json", json.dumps(record))
        draw(trajectories, args.out / "memory.png")
        print(f"written: {args.out / 'memory.json'}, {args.out / 'memory.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
