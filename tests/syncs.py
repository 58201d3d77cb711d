"""Host syncs and collectives, seen on a CPU: what would make a GPU step wait.

On a CUDA device, reading a tensor's value on the host (``.item()``, ``.tolist()``, ``.cpu()``,
``.numpy()``, a Python ``bool``/``float``/``int`` of it, ``.to("cpu")``) waits for the GPU, and so
does an op whose output shape depends on the values (``nonzero``, ``masked_select``, indexing with a
boolean mask, ``unique``); a collective (``torch.distributed.all_reduce``, ``broadcast``, …) waits
for every process. On a CPU nothing waits, but the same calls are made, so they can be counted:

* :func:`forbidden` makes each host read raise inside a block (a variant's step must have none);
* :class:`SyncAudit` counts host reads, data-dependent shapes and collectives inside a block, with
  the step each happened at, and can be paused around work that is not the step's (data loading on
  the host, validation, checkpoints).

On a CPU every tensor is on the host, so the audit takes every tensor read for one on the device
(it over-counts, never under-counts) except those its ``on_host`` says a GPU run keeps on the host:
torch's optimizers keep their ``step`` counters there (unless ``capturable``), and reading one
waits for nothing (:func:`optimizer_steps`).

What no CPU instrument sees: syncs inside torch's own CUDA kernels (a factorisation's error check)
and the collectives DDP's reducer launches from C++ (the gradients' all-reduce, the step's one
necessary collective). The GPU check (``launch/tools/gpu_check.py``) counts CUDA's own reports.
"""

from __future__ import annotations

import contextlib
import functools
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

#: the Tensor methods that read a value on the host
SYNCS = ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__", "__index__")
#: torch.distributed's collectives, as Python calls them
COLLECTIVES = (
    "all_reduce",
    "broadcast",
    "reduce",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_to_all",
    "all_to_all_single",
    "gather",
    "scatter",
    "barrier",
    "broadcast_object_list",
    "all_gather_object",
    "gather_object",
    "scatter_object_list",
)
aten = torch.ops.aten
#: ops whose output's shape (or a Python value) depends on the data: each waits for the device
DATA_DEPENDENT = {
    aten.nonzero.default,
    aten.masked_select.default,
    aten._local_scalar_dense.default,
    aten.unique_consecutive.default,
    aten._unique2.default,
    aten.unique_dim.default,
}


@contextlib.contextmanager
def forbidden(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every host read of a tensor (the names in :data:`SYNCS`) raises inside the block."""
    with monkeypatch.context() as patch:
        for name in SYNCS:

            def refuse(*args, _name=name, **kwargs):
                raise AssertionError(f"Tensor.{_name} in the training step: a host sync on a GPU")

            patch.setattr(torch.Tensor, name, refuse)
        yield


def _to_host(tensor: torch.Tensor, args: tuple, kwargs: dict) -> bool:
    """Whether ``tensor.to(*args, **kwargs)`` copies to the host: a literal ``"cpu"``, or a CPU
    device other than the tensor's (a ``.to(device)`` to the run's device is a copy *to* it)."""
    target = kwargs.get("device", next((a for a in args if isinstance(a, (str, torch.device))), None))
    if target is None:
        return False
    if isinstance(target, str):
        return target == "cpu"
    return target.type == "cpu" and tensor.device.type != "cpu"


def optimizer_steps(optimizer: torch.optim.Optimizer) -> Callable[[torch.Tensor], bool]:
    """Whether a tensor is one of ``optimizer``'s ``step`` counters (kept on the host by torch)."""
    return lambda tensor: any(tensor is state.get("step") for state in optimizer.state.values())


class SyncAudit(TorchDispatchMode):
    """Counts, while active (``with audit.active(monkeypatch):``), every host read, data-dependent op
    and collective, as ``(step, name)`` in :attr:`events`; :attr:`step` is whatever the caller sets.
    A host read counts once (``.item()`` is not counted again as the op it dispatches)."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple[int | None, str]] = []
        self.step: int | None = None
        self._paused = 0
        self._inside = 0  # inside a counted Python call: its own ops are not counted again
        self.on_host: Callable[[torch.Tensor], bool] = lambda tensor: False

    def note(self, name: str) -> None:
        if not self._paused and not self._inside:
            self.events.append((self.step, name))

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1

    def per_step(self) -> Counter:
        return Counter(step for step, _ in self.events)

    def names(self) -> Counter:
        return Counter(name for _, name in self.events)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in DATA_DEPENDENT or (
            func is aten.index.Tensor and any(i is not None and i.dtype == torch.bool for i in args[1])
        ):
            self.note(str(func.overloadpacket.__name__))
        return func(*args, **kwargs)

    def _counted(self, name: str, original):
        @functools.wraps(original)
        def call(*args: Any, **kwargs: Any) -> Any:
            if name.startswith("dist.") or not self.on_host(args[0]):
                if name != "to" or _to_host(args[0], args[1:], kwargs):
                    self.note(name)
            self._inside += 1
            try:
                return original(*args, **kwargs)
            finally:
                self._inside -= 1

        return call

    @contextlib.contextmanager
    def active(self, monkeypatch: pytest.MonkeyPatch) -> Iterator[SyncAudit]:
        with monkeypatch.context() as patch:
            for name in (*SYNCS, "to"):
                patch.setattr(torch.Tensor, name, self._counted(name, getattr(torch.Tensor, name)))
            for name in COLLECTIVES:
                patch.setattr(dist, name, self._counted(f"dist.{name}", getattr(dist, name)))
            with self:
                yield self
