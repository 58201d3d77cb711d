"""The base of every task: what the shared loop needs from a task, and its hooks.

A task owns its data and its metric, not the loop. It is built from the ``task`` config group
(``_target_``) and never sees the trainer; the loop calls only the methods below, every one of
which :class:`Task` defines, so that the loop calls them directly and a task overrides the ones
it needs (the way Lightning's hooks work). The hooks get the bare model (not its DDP or compiled
wrapper) and draw from the global RNGs only within a training step (:class:`Task`, last paragraph).

Evaluation (:mod:`src.engine.loop.evaluation`, ``python -m src.eval``, ``trainer.test_after``) reads a
split through :meth:`Task.eval_dataset`: ``val`` by default, ``test`` where the task's data has one
(:attr:`Task.eval_splits` lists them).

What a plan asks without data (``python -m launch.plan``, :mod:`launch.tools.flops`): the training set's
size (:attr:`Task.train_size`), the model's arguments (:meth:`Task.model_arguments`), one sample's
inputs (:meth:`Task.example_inputs`) and the computation a step runs (:meth:`Task.planned_model`).
Each task states its own, so that a new task is planned without an edit outside its module.

What a task must give: :meth:`Task.datasets`, :meth:`Task.train_loss`, :meth:`Task.eval_sums`,
:meth:`Task.model_inputs` (:class:`ClassificationTask` gives the last three for a model that
returns class logits). What it may change, each a no-op by default: :meth:`Task.collate_fn`,
:meth:`Task.on_device`, :meth:`Task.derived_metrics`, :attr:`Task.tokens_per_sample`,
:meth:`Task.prepare_model`, :meth:`Task.after_backward`, :meth:`Task.after_validation`,
:meth:`Task.state_dict` / :meth:`Task.load_state_dict`.

:meth:`Task.fit` is for a task that trains in a loop of its own (detection, in mmengine's Runner);
by default it returns None and the pipeline (:func:`src.engine.experiment.train`) trains the task
in the shared loop (:func:`src.engine.loop.shared_loop.fit_shared`), so that this contract imports
no loop. Either way the record is opened, its rows written
(:class:`src.engine.record.recorder.Recorder`) and its summary and failures written by the same code.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from hydra.utils import instantiate
from omegaconf import DictConfig
from torch import Tensor, nn
from torch.utils.data import Dataset, default_collate

from src.errors import ConfigError

if TYPE_CHECKING:
    from src.attention import Composition, Variant

    from .distributed import Dist
    from .record.recorder import Recorder
    from .record.session import Session


@dataclass
class Run:
    """What :meth:`Task.fit` gets: the composed config, this session at the run folder (its record,
    identity and what checkpoints carry), the processes, where the rows go, and the attention
    variant of ``cfg.attn``, built once as the pipeline checked it (None: build it from ``cfg.attn``)."""

    cfg: DictConfig
    session: Session
    dist: Dist
    recorder: Recorder
    variant: Variant | Composition | None = None


class Task:
    """A task of the suite (module docstring): its data, its model's arguments, loss and metrics.

    The contract, in the order a run calls it (1 to 4: :func:`src.engine.loop.prepared.prepared`,
    for training and evaluation alike; then :func:`src.engine.loop.shared_loop.fit_shared`):

    1. ``__init__``: Hydra builds the task from ``cfg.task`` alone (its ``_target_`` and keys, their
       ``${…}`` resolved); it reads no data. The run's seed is set after it.
    2. :meth:`datasets` (``(train, val)``; :meth:`eval_dataset` for evaluation) reads ``data_dir``
       (and may write generated data and caches there, :mod:`src.engine.generated`), and sets on
       the task what the model depends on: the tokenizer whose vocabulary LM, MLM and GLUE give
       the model, GLUE's pretrained weights. It always runs before :meth:`build_model`, which may
       refuse to run without it.
    3. :meth:`build_model` reads ``cfg.backbone`` only: the model's arguments are its ``model`` node,
       whose ``${task.*}`` interpolations (``img_size``, ``num_classes``, ``seq_len``) the config
       already resolved, plus what the task adds from its data (``vocab_size``). It returns the
       bare model; :func:`src.engine.loop.model.build_model` applies ``cfg.attn``'s variant to it.
    4. :meth:`prepare_model` (training only) gets the model with the variant applied, before it
       moves to the device and before a resumed run's checkpoint is loaded over it: it may change
       weights (GLUE loads the pretrained encoder), never the architecture.
    5. Each step: :meth:`collate_fn` (in the data loader, perhaps in a worker process: it reads only
       what :meth:`datasets` set), :meth:`on_device` once the batch is on the device (evaluation
       and the monitor's batch too), :meth:`train_loss` per micro-batch, :meth:`after_backward`
       (gradients in ``.grad``); :meth:`model_inputs` gives the conditioning monitor its batch.
    6. Each validation: :meth:`eval_sums` per batch on every process, :meth:`derived_metrics` on
       the means reduced over processes, then :meth:`after_validation` on the main process, which
       may write into the run folder (``run_dir``) and nowhere else of the record.
    7. Each checkpoint saves :meth:`state_dict`; a resumed run calls :meth:`load_state_dict` after
       :meth:`prepare_model` and the weights.

    :meth:`train_loss` and :meth:`eval_sums` get the model to call (perhaps DDP's or
    ``torch.compile``'s wrapper); the other hooks get the bare model. Only a training step's hooks,
    :meth:`train_loss` and :meth:`on_device` with ``train``, may draw from the global RNGs (whose
    states a checkpoint carries: ImageNet's mixup and random erasing); no other hook does, since a
    resumed run must draw what an uninterrupted one does, whatever it evaluated before (a task's own
    generator, MLM's masking one, goes into :meth:`state_dict`). ``python -m src.eval`` calls 1,
    :meth:`eval_dataset` (before the model), :meth:`build_model` (no :meth:`prepare_model`: the
    checkpoint's weights are loaded) and 6; ``trainer.test_after`` calls :meth:`eval_dataset` and 6
    on the trained model. A task that overrides :meth:`fit` (detection) gets 1 and then trains as it likes.

    Args (every task's config has them):
        name: the task's name (``task.name``).
        input: the kind of input its backbones take (``image``, ``sequence``, …).
        batch_size: the recipe's micro-batch; × ``trainer.accumulate``, the global batch, which the
            shared loop keeps on any number of processes (:mod:`.batching`); per process for
            detection (mmdetection's convention).
        eval_batch_size: per process.
        metric: the main metric, a key of the evaluation's result (default: the class's).
    """

    metric: str = "val/acc"  # the main metric, e.g. "val/acc"
    metric_mode: str = "max"  # "max" or "min"
    eval_splits: tuple[str, ...] = ("val",)  # the splits eval_dataset gives
    #: repeated augmentation: each sample an epoch draws comes this many times, each copy augmented
    #: on its own (DeiT's; :mod:`src.engine.loop.data`); 0, 1 or None: off. A classification task
    #: takes it as ``task.repeated_aug``.
    repeated_aug: int | None = None

    def __init__(
        self, name: str, input: str, batch_size: int, eval_batch_size: int, metric: str | None = None
    ) -> None:
        self.name, self.input = name, input
        self.batch_size, self.eval_batch_size = batch_size, eval_batch_size
        if metric is not None:
            self.metric = metric

    # -- what the shared loop needs ----------------------------------------------------------

    def datasets(self, data_dir: Path) -> tuple[Dataset, Dataset]:
        """``(train, val)`` read from their official layout under ``data_dir``."""
        raise NotImplementedError(f"{type(self).__name__} does not read data for the shared loop")

    def eval_dataset(self, data_dir: Path, split: str) -> Dataset:
        """The data set of ``split`` to evaluate on, one of :attr:`eval_splits`. Default: ``val``,
        the validation set of :meth:`datasets`; a task whose data has a test split overrides it."""
        self.check_split(split)
        return self.datasets(data_dir)[1]

    def check_split(self, split: str) -> None:
        """A :class:`ConfigError` unless ``split`` is one of :attr:`eval_splits`."""
        if split not in self.eval_splits:
            raise ConfigError(
                f"task {self.name} has no {split!r} split to evaluate: its splits are "
                f"{', '.join(self.eval_splits)}"
            )

    # -- data built ahead, on the CPU (python -m launch.cluster.prepare) -------------------------------

    def prepare_data(self, data_dir: Path) -> Any:
        """Build under ``data_dir`` what :meth:`datasets` would otherwise build on first use (token
        caches, a tokenizer trained here, generated data sets), by the code :meth:`datasets` runs,
        so that a run finds it ready; read nothing else, touch no GPU. Everything built goes
        through :func:`src.engine.generated.ensure_generated`, which a check
        (:func:`~src.engine.generated.preparing` with ``check=True``) turns into a cheap look that
        builds nothing. Default: nothing to build (the data is read as it is); a task whose data is
        missing may say so here (a :class:`DataError`)."""
        return None

    def build_model(self, backbone: DictConfig) -> nn.Module:
        """The model for this task from the ``backbone`` config group (default: its ``model``)."""
        return instantiate(backbone.model, _convert_="all")

    def train_loss(self, model: nn.Module, batch: Any) -> Tensor:
        """The scalar training loss of one batch (already on the device)."""
        raise NotImplementedError(f"{type(self).__name__} has no training loss for the shared loop")

    def eval_sums(self, model: nn.Module, batch: Any) -> dict[str, tuple[Tensor, int]]:
        """Sums over the batch, each ``(total, count)``; the loop adds them over batches and
        processes and reports ``total / count`` under the key (``val/loss``, ``val/acc``)."""
        raise NotImplementedError(f"{type(self).__name__} has no evaluation for the shared loop")

    def model_inputs(self, batch: Any) -> tuple:
        """The positional inputs of ``model`` in a batch (for the conditioning monitor)."""
        raise NotImplementedError(f"{type(self).__name__} does not say what its model takes")

    # -- hooks: no-ops unless a task needs them ----------------------------------------------

    def prepare_model(self, model: nn.Module) -> None:
        """Called once after the attention variant is applied and before training starts (a resumed
        run then loads its checkpoint over it): fine-tuning loads pretrained weights here, where
        their keys match the variant's parametrizations."""

    def collate_fn(self, items: list) -> Any:
        """Samples into a batch (default: torch's ``default_collate``; LRA pads sequences)."""
        return default_collate(items)

    def on_device(self, batch: Any, train: bool) -> Any:
        """The batch once it is on the device, before the model sees it (``train``: a training
        micro-batch; else evaluation's or the monitor's): the place for work the device does faster
        than the loader's workers (ImageNet: uint8 images normalised, random erasing in training,
        as timm's prefetch loader does). With ``train`` it may draw from the global RNGs, whose
        states every checkpoint carries; without, it must not. Default: the batch unchanged."""
        return batch

    def derived_metrics(self, means: dict[str, float]) -> dict[str, float]:
        """Metrics computed from the reduced means (perplexity from the mean loss), added to them."""
        return {}

    @property
    def tokens_per_sample(self) -> int | None:
        """Tokens per sample, with which the loop logs ``tokens_per_s`` beside ``throughput``."""
        return None

    def after_backward(self, model: nn.Module, step: int, loss: float) -> dict[str, float] | None:
        """Called after backward and clipping, before ``optimizer.step()`` (gradients in ``.grad``;
        ``step`` counts from 1, ``loss`` is the step's mean); the metrics it returns are logged at
        ``step`` (split ``train``). A task that overrides it makes the shared loop read the loss
        every step, a host sync per step on a GPU, which the loop otherwise reads once per logging
        interval (:mod:`src.engine.loop.readings`)."""
        return None

    def after_validation(self, model: nn.Module, step: int, run_dir: Path, final: bool) -> None:
        """Called on the main process after each validation is logged (``final`` at the last
        step), for what a task writes into the run folder."""

    def statistics(self, run_dir: Path) -> dict[str, Any] | None:
        """Statistics of the finished run read from its folder, for ``summary.json``'s
        ``statistics`` (None: the task has none). Read from the record, so a resumed run gives
        what an uninterrupted one does."""
        return None

    def state_dict(self) -> dict[str, Any] | None:
        """The task's own state, carried by the checkpoint so that a resumed run logs what an
        uninterrupted one does (None: it has none)."""
        return None

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""

    # -- what a plan asks, without data (python -m launch.plan) -----------------------------

    #: Samples in the training set where the data set fixes it (ImageNet-1k's 1,281,167 images),
    #: None where only reading the data tells. ``python -m launch.plan`` counts a recipe given in
    #: epochs with it and refuses a global batch of more epochs than a step may span.
    train_size: int | None = None

    def model_arguments(self) -> dict[str, Any]:
        """The arguments :meth:`build_model` adds to ``backbone.model`` (vocabulary, labels,
        positions), as the config states them without the data: a plan builds the model on the
        meta device with them. Default: none (``${task.*}`` interpolations carry the rest)."""
        return {}

    def example_inputs(self, device: str | torch.device = "cpu") -> tuple[Tensor, ...]:
        """One typical training sample's positional model inputs, zeros with a batch of 1 on
        ``device``: a plan counts one sample's FLOPs and kernel launches with them."""
        raise NotImplementedError(f"{type(self).__name__} does not say what one sample of its looks like")

    def planned_model(self, cfg: DictConfig, device: str = "meta") -> tuple[Any, str]:
        """What one training step computes on :meth:`example_inputs`, built on ``device`` (meta, or
        the CPU under fake tensors) without data or weights, and a note on what it leaves out:
        ``cfg.backbone.model`` with :meth:`model_arguments`, ``cfg.attn``'s variant applied where
        its setup needs no weights (else the backbone alone, as the note says). A task whose step is
        not its model's forward overrides it (masked-LM pretraining, detection)."""
        from src import attention

        model = planned_backbone(cfg.backbone.model, self.model_arguments(), device)
        try:
            attention.apply(model, attention.variant_from_config(cfg.attn))
        except Exception as e:  # noqa: BLE001  a variant whose setup needs real weights
            return model, f"{cfg.attn.variant} not applied ({type(e).__name__}): the backbone's FLOPs"
        return model, ""

    # -- training ----------------------------------------------------------------------------

    def fit(self, run: Run) -> dict[str, Any] | None:
        """Train in a loop of the task's own; what the run reached (``steps``, ``final``, ``best``,
        ``wall_s``, …), which ``summary.json`` gets beside the keys every run has. Default: None,
        for a task that trains in the shared loop, which the pipeline then runs
        (:func:`src.engine.loop.shared_loop.fit_shared`)."""
        return None


def planned_backbone(node: DictConfig, arguments: dict[str, Any], device: str) -> Any:
    """The model ``node`` describes, instantiated with ``arguments`` on ``device``. On the meta
    device (no weights, nothing drawn) it is built once per process for each config and each later
    call gets a copy: a plan counts every variant of one backbone, and building a full-size timm
    model takes longer than copying it."""
    from omegaconf import OmegaConf

    key = None
    if device == "meta":
        try:
            key = OmegaConf.to_yaml(node, resolve=True) + repr(sorted(arguments.items()))
        except Exception:  # noqa: BLE001  an interpolation only a run resolves: built each time
            pass
    if key is None or key not in _PLANNED:
        with torch.device(device):
            model = instantiate(node, _convert_="all", **arguments)
        if key is None:
            return model
        _PLANNED[key] = model
    return copy.deepcopy(_PLANNED[key])


#: :func:`planned_backbone`'s meta models, by their config
_PLANNED: dict[str, Any] = {}


def held_out_share(test_fraction: float | None, val_fraction: float, what: str) -> float:
    """A task's ``test_fraction`` (null: 0, no test split), or a :class:`ConfigError` where it and
    ``val_fraction`` would leave no ``what`` (images, text) to train on."""
    test_fraction = test_fraction or 0.0
    if not 0 <= test_fraction < 1 - val_fraction:
        raise ConfigError(
            f"task.test_fraction={test_fraction}: with task.val_fraction={val_fraction} it must be "
            f"in [0, {1 - val_fraction:g}) so that {what} are left to train on (0: no test split)"
        )
    return test_fraction


def classification_sums(logits: Tensor, labels: Tensor) -> dict[str, tuple[Tensor, int]]:
    """``val/loss`` (summed cross-entropy) and ``val/acc`` (correct predictions) of a batch's
    class logits ``(B, C)``, each with the batch's count; computed in float32."""
    out, n = logits.float(), labels.numel()
    return {
        "val/loss": (F.cross_entropy(out, labels, reduction="sum"), n),
        "val/acc": ((out.argmax(-1) == labels).sum(), n),
    }


class ClassificationTask(Task):
    """A task whose batches are ``(inputs…, labels)`` and whose model returns class logits:
    cross-entropy to train, ``val/loss`` and ``val/acc`` to evaluate. ``repeated_aug``: DeiT's
    repeated augmentation's copies (:attr:`Task.repeated_aug`; 0, 1 or None: off)."""

    def __init__(self, *args: Any, repeated_aug: int | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if repeated_aug is not None and repeated_aug < 0:
            raise ConfigError(f"task.repeated_aug={repeated_aug}: copies per sample, 0 or 1 for none")
        self.repeated_aug = repeated_aug

    def model_inputs(self, batch: tuple) -> tuple:
        return tuple(batch[:-1])

    def logits(self, model: nn.Module, batch: tuple) -> Tensor:
        """The model's class logits ``(B, C)`` for a batch."""
        return model(*self.model_inputs(batch))

    def train_loss(self, model: nn.Module, batch: tuple) -> Tensor:
        return F.cross_entropy(self.logits(model, batch), batch[-1])

    def eval_sums(self, model: nn.Module, batch: tuple) -> dict[str, tuple[Tensor, int]]:
        return classification_sums(self.logits(model, batch), batch[-1])
