"""Sparse modular addition (P5): the data, the task, and the hooks that feed the visual sandbox.

A sequence ``x ∈ {0, …, p−1}^L`` has i.i.d. uniform tokens and the target
``y = (x_1 + … + x_k) mod p``: only the first ``k`` tokens matter. The training and test
sets (``train_size``, ``test_size`` sequences) are drawn, in that order, from one generator
seeded with ``data_seed`` (by default the run's seed, as P5 draws them from its run's RNG);
as in P5 they are independent draws, so with ``p^L`` small they share sequences. Nothing is
read from disk: the data is generated, a few kilobytes.

The task trains a sandbox backbone (:mod:`src.models.sandbox`, ``kind: modadd``) with
cross-entropy and reports ``val/acc`` and ``val/loss`` on the test set. Through the loop's
hooks (:class:`src.engine.task.Task`) it also

* after every backward pass (:meth:`after_backward`): feeds the step's loss to a
  :class:`~src.sandbox.spikes.SpikeDetector`; logs, every ``grad_every`` steps, the largest
  gradient norm of each module over those steps and the largest eigenvalue of each
  RMSNorm's Jacobian on the step's batch; and at a spike, the loss, its running median,
  the gradient norms and the norms' eigenvalues at that step;
* at every validation (:meth:`after_validation`): saves a snapshot of every layer on
  ``probe_size`` test sequences and draws its frame, rewrites the run's page, and at the
  end of training assembles the GIF (all under ``<run_dir>/sandbox/``, see
  :mod:`src.sandbox`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from torch import Tensor, nn
from torch.utils.data import Dataset, TensorDataset

from src.engine.task import ClassificationTask
from src.errors import ConfigError
from src.sandbox.snapshot import Snapshot, take_snapshot
from src.sandbox.spikes import SpikeDetector, grad_norms, norm_jacobian_max


def sparse_modular_addition(
    n: int, p: int, seq_len: int, k: int, generator: torch.Generator
) -> tuple[Tensor, Tensor]:
    """``n`` sequences ``(n, L)`` of i.i.d. uniform tokens in ``0…p−1`` and targets ``(n,)``:
    the sum of the first ``k`` tokens modulo ``p``."""
    x = torch.randint(0, p, (n, seq_len), generator=generator)
    return x, x[:, :k].sum(dim=1) % p


def partial_sums(x: Tensor, k: int) -> Tensor:
    """``x_1 + … + x_k`` for each sequence of ``x (n, L)`` (before the modulo)."""
    return x[:, :k].sum(dim=1)


class Sequences(TensorDataset):
    """``(tokens, target)`` pairs; reading one draws no random number, so the loop need not seed it."""

    draws_random = False


DEFAULT_SANDBOX = {
    "frames": True,  # snapshot and frame at each validation, the page, the GIF at the end
    "probe_size": 512,  # test sequences drawn in each frame
    "gif": True,
    "gif_ms": 120,  # milliseconds per GIF frame
    "dpi": 64,
    "grad_every": 10,  # steps between gradient-norm rows (maxima over those steps)
    "spike_factor": 10.0,  # a spike: loss > factor × max(running median, floor)
    "spike_window": 100,
    "spike_floor": 0.01,
}


class SparseModularAddition(ClassificationTask):
    """P5's sparse modular addition on a sandbox backbone; see the module docstring."""

    def __init__(
        self,
        p: int,
        seq_len: int,
        k: int,
        train_size: int,
        test_size: int,
        data_seed: int = 0,
        sandbox: dict[str, Any] | DictConfig | None = None,
        **common: Any,
    ) -> None:
        if p < 2 or not 1 <= k <= seq_len:
            raise ConfigError(
                f"task=modadd needs p ≥ 2 and 1 ≤ k ≤ seq_len, got p={p}, k={k}, seq_len={seq_len}"
            )
        super().__init__(**common)
        self.p, self.seq_len, self.k = p, seq_len, k
        self.train_size, self.test_size, self.data_seed = train_size, test_size, data_seed
        options = OmegaConf.to_container(sandbox) if isinstance(sandbox, DictConfig) else dict(sandbox or {})
        unknown = sorted(set(options) - set(DEFAULT_SANDBOX))
        if unknown:
            raise ConfigError(
                f"unknown task.sandbox option(s) {', '.join(unknown)}; valid: {', '.join(DEFAULT_SANDBOX)}"
            )
        self.sandbox = {**DEFAULT_SANDBOX, **options}
        self.spikes = SpikeDetector(
            self.sandbox["spike_factor"], self.sandbox["spike_window"], floor=self.sandbox["spike_floor"]
        )
        self._grad_max: dict[str, float] = {}
        self._last_batch: tuple[Tensor, Tensor] | None = None
        self._probe: tuple[Tensor, Tensor] | None = None
        self._initial: Snapshot | None = None  # the model at step 0, drawn at the first validation

    # -- what the loop needs ---------------------------------------------------------------

    def example_inputs(self, device: str | torch.device = "cpu") -> tuple[Tensor]:
        return (torch.zeros(1, self.seq_len, dtype=torch.long, device=device),)  # (1, L) tokens

    def datasets(self, data_dir: Path) -> tuple[Dataset, Dataset]:
        g = torch.Generator().manual_seed(self.data_seed)
        train = sparse_modular_addition(self.train_size, self.p, self.seq_len, self.k, g)
        test = sparse_modular_addition(self.test_size, self.p, self.seq_len, self.k, g)
        self._probe = tuple(t[: self.sandbox["probe_size"]] for t in test)
        return Sequences(*train), Sequences(*test)

    def train_loss(self, model: nn.Module, batch: tuple[Tensor, Tensor]) -> Tensor:
        self._last_batch = batch  # for the norms' Jacobian in after_backward
        return super().train_loss(model, batch)

    # -- the loop's hooks --------------------------------------------------------------------

    def after_backward(self, model: nn.Module, step: int, loss: float) -> dict[str, float] | None:
        """Spike detection every step; gradient norms and the norms' Jacobian when worth a row.

        At step 1 the model is still the initialized one: its snapshot is kept for the first
        validation to draw (frame 0).
        """
        if step == 1 and self.sandbox["frames"] and self._probe is not None:
            self._initial = self._snapshot(model, 0)
        spike = self.spikes.update(loss)
        norms = grad_norms(model)
        for module, value in norms.items():
            self._grad_max[module] = max(self._grad_max.get(module, 0.0), value)
        row: dict[str, float] = {}
        if spike is not None:
            row.update(spike)
            row.update({f"spike/grad_norm/{m}": v for m, v in norms.items()})
        regular = step % self.sandbox["grad_every"] == 0
        if regular:
            row.update({f"grad_norm/{m}": v for m, v in self._grad_max.items()})
            self._grad_max = {}
        if (spike is not None or regular) and self._last_batch is not None:
            jac = norm_jacobian_max(model, self._last_batch[0])
            row.update({f"norm_jacobian/{n}": v for n, v in jac.items()})
        return row or None

    def after_validation(self, model: nn.Module, step: int, run_dir: Path, final: bool) -> None:
        """Snapshot, frame and page at each validation (first the initialization's); the GIF at the end."""
        if not self.sandbox["frames"] or self._probe is None:
            return
        from src.sandbox.record import record_snapshot  # matplotlib is imported only when frames are drawn

        options = {**self.sandbox, "k": self.k}
        if self._initial is not None:
            record_snapshot(self._initial, Path(run_dir), final=False, options=options)
            self._initial = None
        record_snapshot(self._snapshot(model, step), Path(run_dir), final=final, options=options)

    def _snapshot(self, model: nn.Module, step: int) -> Snapshot:
        device = next(model.parameters()).device
        x, y = (t.to(device) for t in self._probe)
        return take_snapshot(model, x, y, partial_sums(x, self.k), self.k, step)

    def statistics(self, run_dir: Path) -> dict[str, Any]:
        """P5's statistics of the run (:func:`src.sandbox.statistics.run_statistics`): its stages,
        and each layer's clustering where it drew snapshots."""
        from src.sandbox.statistics import run_statistics

        return run_statistics(Path(run_dir), self.test_size)

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs to log exactly what an uninterrupted one logs."""
        return {"spikes": self.spikes.state_dict(), "grad_max": dict(self._grad_max)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.spikes.load_state_dict(state["spikes"])
        self._grad_max = dict(state["grad_max"])
