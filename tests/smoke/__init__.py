"""Per task family: the overrides under which each task trains 2 steps on tiny data in its
real on-disk layout, and ``prepare(data_dir)``, which writes that data.

``tests/test_sweeps.py`` discovers every module here: a new task family adds one module
with ``OVERRIDES: dict[str, list[str]]`` (task name -> overrides) and ``prepare``.

A family with full-size backbones (``scale: full``) also says how they are tested without
training them (``tests/test_sweeps.py``, "full size"):

* ``meta_batch(task)``: a training batch of the task's own sizes, made on the current default
  device (the meta device there), and the shape the model's output must have for it;
* ``meta_loss(task, model, batch)`` (optional; default ``task.train_loss``): the step's loss
  where the task's own loss needs values (a data-dependent mask);
* ``meta_model(task, cfg)`` (optional; default ``task.build_model`` then the variant applied, as
  the shared loop does): the model as training builds it;
* ``without_data(task)`` (optional): what ``build_model`` reads from the data (a tokenizer's
  vocabulary size), set without reading any;
* ``FULL_SIZE_STEP``: the experiment file whose one real step (``train()`` on the tiny data)
  stands for the family's full-size backbones;
* ``REDUCED_WIDTH``: per full-size backbone, the overrides that keep its depth, heads and layout
  at a few channels per head (where a variant needs the weights' values: ``mimetic``).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn


def train_step(task, model: nn.Module, batch: Any) -> tuple[Tensor, Any]:
    """``(loss, output)``: the task's training loss of ``batch`` and the model's output on the way
    (caught by a forward hook on ``model``)."""
    outputs = []
    hook = model.register_forward_hook(lambda module, args, output: outputs.append(output))
    try:
        loss = task.train_loss(model, batch)
    finally:
        hook.remove()
    return loss, outputs[-1]
