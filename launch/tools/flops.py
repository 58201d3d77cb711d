"""What one training step of a run computes, counted without data or weights: FLOPs and kernels.

The run's model is built on the meta device as its task says (:meth:`src.engine.task.Task.planned_model`:
the backbone's ``model`` node with the task's :meth:`~src.engine.task.Task.model_arguments`, and
``cfg.attn``'s variant applied where that works on meta); one sample's forward and backward
(:meth:`~src.engine.task.Task.example_inputs`) run under two counters:

- FLOPs of matmul-like operations (a multiply-add counts 2), by the formulas and the rule of
  :class:`torch.utils.flop_counter.FlopCounterMode` (:class:`StepCount`). A variant's
  decompositions (SVD, eigenvalues), the optimizer and the data pipeline are not in it.
- The aten operations that run a kernel (every operation but views), the launches a GPU waits
  on when a step is too small to fill it (:mod:`launch.plan` prices each at a host cost per
  launch). **[reading]** One aten operation is one kernel launch; on meta, SDPA runs its math
  form (about 8 operations a layer where a GPU's fused kernel is 2), so a ViT's count is about
  15% high.

On meta, a call the counter has seen before (the same operation on inputs of the same shapes,
strides and dtypes) gets new tensors of the outputs' shapes instead of running its meta kernel
again (:func:`computed`): later blocks and variants repeat the first block's calls, and many meta
kernels are Python decompositions; the counts are the kernels' (a test compares them).

A model that cannot run on meta (``torch.autocast`` knows no meta device: the Nyströmformer)
runs on fake CPU tensors, which hold no data either. No task is named here: masked-LM
pretraining decodes only its masked positions (:class:`tasks.mlm.task.MaskedDecoding`) and
detection counts Mask R-CNN in its parts (:mod:`tasks.detection.planning`) because their tasks
say so.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class StepCount(TorchDispatchMode):
    """Counts, in one pass, the aten operations dispatched inside it that run a kernel (views
    excluded) and their FLOPs as :class:`torch.utils.flop_counter.FlopCounterMode` counts its
    total: an operation without a formula is decomposed where it can be and its parts counted
    (``ops`` counts the operation autograd dispatched, not its parts). One mode where the two
    counters stacked took twice the Python dispatch per operation (and FlopCounterMode's
    per-module bookkeeping, which a total does not need)."""

    def __init__(self) -> None:
        from torch.utils.flop_counter import flop_registry

        super().__init__()
        self.ops, self.flops, self.formulas, self.inside = 0, 0, flop_registry, False

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if not self.inside and not getattr(func, "is_view", False):
            self.ops += 1
        if func not in self.formulas and decomposes(func):  # FlopCounterMode's rule
            outer, self.inside = self.inside, True
            try:
                with self:
                    parts = func.decompose(*args, **kwargs)
            finally:
                self.inside = outer
            if parts is not NotImplemented:
                return parts
        out = computed(func, args, kwargs)
        formula = self.formulas.get(func._overloadpacket)
        if formula is not None:
            self.flops += formula(*args, **kwargs, out_val=out)
        return out


class MetaShapes(TorchDispatchMode):
    """Every operation dispatched inside it through :func:`computed`, counting nothing: for code
    that builds and steps full-size models on the meta device many times in one process (the
    tests of every full-size combination), where the meta kernels' Python decompositions are
    most of the time."""

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        return computed(func, args, kwargs or {})


def computed(func: Any, args: tuple, kwargs: dict) -> Any:
    """``func(*args, **kwargs)``; on the meta device, for an operation that neither writes nor
    aliases its inputs, its outputs' shapes, strides and dtypes are remembered by those of its
    inputs and its other arguments, and new meta tensors of that kind stand in when the same call
    comes again. Many meta kernels are Python decompositions (layer norm and its backward: a few
    ms a call); a model repeats the calls of its first block in every later one, and a variant
    those of the backbone, so most calls of a plan are answered from :data:`_SHAPES`. The
    tensors that come back are the ones the kernel would give in all that a count reads."""
    key = call_key(func, args, kwargs)
    if key is None:
        return func(*args, **kwargs)
    if key not in _SHAPES:
        out = func(*args, **kwargs)
        _SHAPES[key] = out_spec(out)
        return out
    spec = _SHAPES[key]
    if spec is None:  # an output the cache cannot stand in for: the kernel each time
        return func(*args, **kwargs)
    made = [
        None if each is None else torch.empty_strided(each[0], each[1], dtype=each[2], device="meta")
        for each in spec[1]
    ]
    return made[0] if spec[0] == "one" else (tuple(made) if spec[0] == "tuple" else made)


#: ``{call_key: out_spec}`` of meta calls seen in this process (a kernel's outputs depend on its
#: inputs' metadata and its other arguments only: on meta there is no data)
_SHAPES: dict[tuple, Any] = {}


def call_key(func: Any, args: tuple, kwargs: dict) -> tuple | None:
    """What a meta kernel's outputs depend on, hashable; None where the call is not remembered: an
    operation that writes or aliases an argument (in-place, out=, views), an argument that is not
    a meta tensor or a hashable value (lists and tuples of them are read one level down)."""
    if not keeps_apart(func):
        return None
    key: list = [func, torch.get_default_dtype()]  # a factory given no dtype takes the default
    for value in (*args, *(kwargs.items() if kwargs else ())):
        if isinstance(value, list | tuple):
            key.append(len(value))
            for each in value:
                if (part := leaf_key(each)) is None:
                    return None
                key.append(part)
        elif (part := leaf_key(value)) is None:
            return None
        else:
            key.append(part)
    return tuple(key)


def leaf_key(value: Any) -> Any:
    """A meta tensor as ``(shape, stride, dtype, offset)``, a hashable value as ``(type, value)``;
    None otherwise (a CPU or fake tensor, a nested list, an unhashable value)."""
    if isinstance(value, torch.Tensor):
        if value.device.type != "meta" or type(value) not in (torch.Tensor, torch.nn.Parameter):
            return None
        return tuple(value.shape), value.stride(), value.dtype, value.storage_offset()
    if isinstance(value, list | tuple | dict):
        return None
    try:
        hash(value)
    except TypeError:
        return None
    return type(value), value


@functools.cache
def keeps_apart(func: Any) -> bool:
    """Whether ``func`` neither writes an argument nor returns an alias of one (its schema)."""
    schema = func._schema
    return not schema.is_mutable and all(r.alias_info is None for r in schema.returns)


def out_spec(out: Any) -> tuple[str, list] | None:
    """``out`` (a meta tensor, or a tuple or list of them and None) as ``(kind, [(shape, stride,
    dtype) or None, …])``; None where it holds anything else."""
    kind, items = ("one", [out]) if isinstance(out, torch.Tensor) else (type(out).__name__, out)
    if kind not in ("one", "tuple", "list"):
        return None
    spec = []
    for each in items:
        if each is None:
            spec.append(None)
        elif type(each) is torch.Tensor and each.device.type == "meta" and each.storage_offset() == 0:
            spec.append((tuple(each.shape), each.stride(), each.dtype))
        else:
            return None
    return kind, spec


@functools.cache
def decomposes(func: Any) -> bool:
    """Whether ``func.decompose`` can split the aten operation ``func`` into others (its rule,
    asked once per operation rather than tried at every call; ``prim.device`` is never split)."""
    if func is torch.ops.prim.device.default:
        return False
    key = torch._C.DispatchKey.CompositeImplicitAutograd
    return key in func.py_kernels or torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), key)


def count_step(step: Any) -> tuple[int, int]:
    """``(FLOPs, kernel launches)`` of ``step()``, a callable running one forward and backward."""
    with StepCount() as counted:
        step()
    return int(counted.flops), counted.ops


def count_flops(model: Any, inputs: tuple, backward: bool = False) -> int:
    """FLOPs of ``model(*inputs)`` (and of the backward of its output's sum), a multiply-add as 2."""
    return count_step(lambda: forward_backward(model, inputs, backward))[0]


def forward_backward(model: Any, inputs: tuple, backward: bool = True) -> None:
    """``model(*inputs)``, then the backward of its (first) output's sum."""
    out = model(*inputs)
    if backward:
        out = out[0] if isinstance(out, tuple | list) else out
        out.float().sum().backward()


def forward_flops(model: Any, img_size: int = 224, in_chans: int = 3, inputs: tuple | None = None) -> int:
    """FLOPs of one sample's forward pass (a multiply-add counted as 2), counted on the meta device.

    ``model``: a timm model name (built on meta at ``img_size``, no weights) or a built model;
    ``inputs``: its positional inputs for one sample (default: one ``in_chans × img_size²`` image
    on the model's device)."""
    if isinstance(model, str):
        import timm

        with torch.device("meta"):
            model = timm.create_model(model, pretrained=False, img_size=img_size, in_chans=in_chans)
    if inputs is None:
        device = next(model.parameters()).device
        inputs = (torch.zeros(1, in_chans, img_size, img_size, device=device),)
    with torch.no_grad():
        return count_flops(model, inputs)


def planned_task(cfg: Any) -> Any:
    """The run's task, built from ``cfg.task`` as a run builds it (a task reads no data when built,
    :class:`src.engine.task.Task`), with the pretrained weights the run names left out: weights
    change no FLOPs, and GLUE's ``${pretrained_by:…}`` names a run folder only a run has."""
    from hydra.utils import instantiate

    return instantiate(without_weights(cfg).task)


def without_weights(cfg: Any) -> Any:
    """A copy of ``cfg`` whose ``backbone.model.pretrained`` (where it has one) is null."""
    from omegaconf import OmegaConf

    cfg = copy.deepcopy(cfg)
    if OmegaConf.to_container(cfg.backbone.model, resolve=False).get("pretrained") is not None:
        OmegaConf.update(cfg, "backbone.model.pretrained", None)
    return cfg


def model_and_inputs(cfg: Any, device: str = "meta") -> tuple[Any, tuple, str]:
    """The run's model without weights (on ``device``: meta, or the CPU inside a
    :class:`FakeTensorMode <torch._subclasses.fake_tensor.FakeTensorMode>`) as one training step
    computes with it, one sample's inputs, and a note on what was approximated: each asked of the
    run's task (:meth:`~src.engine.task.Task.planned_model`,
    :meth:`~src.engine.task.Task.example_inputs`), which knows its data's shapes and sizes."""
    from hydra.utils import instantiate

    cfg = without_weights(cfg)
    task = instantiate(cfg.task)
    model, note = task.planned_model(cfg, device)
    return model, task.example_inputs(device), note


def step_cost(cfg: Any) -> tuple[int | None, float | None, int | None, str]:
    """``(parameters, FLOPs of one sample's forward + backward, its kernel launches, note)`` of
    the run of ``cfg``: on the meta device, or where a model cannot run there (``torch.autocast``
    knows no meta device: the Nyströmformer), on fake CPU tensors, which hold no data either."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    def counted(device: str) -> tuple[int, int, int, str]:
        model, x, note = model_and_inputs(cfg, device=device)
        model.train()
        flops, kernels = count_step(lambda: forward_backward(model, x))
        return sum(p.numel() for p in model.parameters()), flops, kernels, note

    try:
        try:
            params, flops, kernels, note = counted("meta")
        except RuntimeError:
            with FakeTensorMode(allow_non_fake_inputs=True):
                params, flops, kernels, note = counted("cpu")
    except Exception as e:  # noqa: BLE001  said in the table, not fatal to the plan
        return None, None, None, f"not counted: {str(e).splitlines()[0][:80]}"
    return params, float(flops), kernels, note
