"""GLUE fine-tuning: one task of the benchmark, from a masked-LM pretraining run's checkpoint.

``task=glue_<t>`` fine-tunes the backbone (``crammed_bert``) on GLUE task ``t`` with the Cramming
fine-tuning recipe (``conf/recipes/glue_finetune.yaml``) and reports the task's official metrics on
its development set (GLUE's test labels are not public): ``val/matthews`` (CoLA), ``val/acc`` (SST-2,
QNLI, RTE, WNLI, MNLI matched), ``val/acc_mm`` (MNLI mismatched), ``val/acc`` and ``val/f1`` (MRPC,
QQP), ``val/pearson`` and ``val/spearman`` (STS-B); ``val/loss`` is the cross-entropy (the squared
error for STS-B's scores). The GLUE average over the tasks is the report's
(:func:`tasks.glue.metrics.glue_average`).

Weights and vocabulary come from ``backbone.model.pretrained``, an ``mlm`` run's
``checkpoints/last.pt``: the model loads its encoder after the attention variant is applied
(:meth:`Glue.prepare_model`), and the WordPiece tokenizer is the one that run trained, carried in the
checkpoint's ``task`` entry (:meth:`tasks.mlm.MaskedLM.state_dict`). Without a checkpoint
(``pretrained: null``) the run fine-tunes from random initialisation with a WordPiece trained on the
task's own training sentences, and says so in one warning line.

The metrics that are not ratios of sums (Matthews, F1, correlations) are computed from the predictions
of the whole development set, gathered from every process, by scikit-learn and SciPy.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from hydra.utils import instantiate
from omegaconf import DictConfig
from torch import Tensor, nn
from torch.utils.data import Dataset

from src.engine.record import checkpoint
from src.engine.task import Task
from src.errors import ConfigError

from .formats import SPECS, GlueExamples, read_split
from .metrics import task_metrics

log = logging.getLogger(__name__)

#: The record's key of each metric ``tasks.glue.metrics.task_metrics`` returns.
METRIC_KEYS = {
    "matthews": "val/matthews",
    "accuracy": "val/acc",
    "f1": "val/f1",
    "pearson": "val/pearson",
    "spearman": "val/spearman",
}

#: The main metric of each task where it is not accuracy: the Cramming code's target metric
#: (``eval/tasks/*.yaml``), the one the GLUE average takes.
MAIN_METRIC = {"cola": "val/matthews", "mrpc": "val/f1", "qqp": "val/f1", "stsb": "val/pearson"}


class EncodedExamples(Dataset):
    """Encoded examples: ``(ids (N,) int64, label, group)``; ``group`` is 1 for MNLI's mismatched set."""

    def __init__(self, ids: list[list[int]], labels: np.ndarray, groups: np.ndarray) -> None:
        self.ids, self.labels, self.groups = ids, labels, groups

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor, int]:
        return torch.tensor(self.ids[i], dtype=torch.long), torch.tensor(self.labels[i]), int(self.groups[i])


class Glue(Task):
    """One GLUE task (:data:`tasks.glue.formats.SPECS`), fine-tuned; see the module docstring.

    Args:
        glue_task: ``cola``, ``sst2``, ``mrpc``, ``stsb``, ``qqp``, ``mnli``, ``qnli``, ``rte`` or ``wnli``.
        seq_len: the longest encoded example (``[CLS] a [SEP] b [SEP]``, longest-first truncation).
        official, hub: the folders, under ``paths.data_dir``, of GLUE's own layout and of a Hugging
            Face copy (:func:`tasks.glue.formats.read_split`).
        pretrained: the pretraining checkpoint (the config passes ``backbone.model.pretrained``).
        vocab_size: the WordPiece trained on the task's sentences when there is no checkpoint.
        cache_dir: where that WordPiece goes, under ``paths.data_dir``.
        generate: the embedded ``glue_tiny`` data's spec (``root`` and
            :class:`tasks.glue.generate.GlueTinySpec`'s fields), written on first use; None for GLUE.
        The rest: every task's (:class:`src.engine.task.Task`).
    """

    metric_mode = "max"

    def __init__(
        self,
        glue_task: str,
        seq_len: int = 128,
        official: str = "glue_data",
        hub: str = "glue",
        pretrained: str | None = None,
        vocab_size: int = 32768,
        cache_dir: str = "cache/glue",
        generate: dict | None = None,
        **common: Any,
    ) -> None:
        if glue_task not in SPECS:
            raise ConfigError(f"task.glue_task={glue_task!r}: choose one of {', '.join(SPECS)}")
        self.spec = SPECS[glue_task]
        common.setdefault("metric", MAIN_METRIC.get(glue_task, "val/acc"))
        super().__init__(**common)
        self.seq_len, self.official, self.hub = seq_len, official, hub
        self.pretrained, self.vocab_size, self.cache_dir = pretrained, vocab_size, cache_dir
        self.generate = dict(generate) if generate else None
        self.tokenizer = None
        self._pretrained: dict | None = None  # the checkpoint's weights, from datasets() to prepare_model()
        self._outputs: list[tuple[Tensor, Tensor, Tensor]] = []  # one validation's (pred, label, group)

    @property
    def regression(self) -> bool:
        return self.spec.labels is None

    @property
    def num_labels(self) -> int:
        """The model's outputs: one score for a regression (STS-B), else one logit per class."""
        return 1 if self.regression else len(self.spec.labels)

    @property
    def train_size(self) -> int:
        """GLUE's training examples of the task (:class:`~tasks.glue.formats.GlueSpec`), or the
        generated ``glue_tiny`` copy's (``<task>_train`` of ``generate``)."""
        if self.generate:
            from .generate import GlueTinySpec

            field = f"{self.spec.name}_train"
            return int(self.generate.get(field, getattr(GlueTinySpec(), field)))
        return self.spec.train_size

    # -- data ------------------------------------------------------------------------------

    def datasets(self, data_dir: Path) -> tuple[EncodedExamples, EncodedExamples]:
        data_dir = Path(data_dir)
        self.ensure_generated_data(data_dir)
        train = self.read(data_dir, "train")
        devs = [self.read(data_dir, split) for split in self.spec.dev_splits]
        self.tokenizer = self.load_tokenizer(data_dir, train)
        return self.encode([train]), self.encode(devs)

    def prepare_data(self, data_dir: Path) -> None:
        """``glue_tiny``'s generated files, and without a checkpoint the WordPiece trained on the
        training sentences, by :meth:`datasets`' code. With a checkpoint there is nothing to build
        ahead: the examples are encoded in memory at the start of each run with the vocabulary the
        checkpoint carries, which exists only once the pretraining has run."""
        data_dir = Path(data_dir)
        self.ensure_generated_data(data_dir)
        if not self.pretrained:
            self.tokenizer = self.load_tokenizer(data_dir, self.read(data_dir, "train"))

    def ensure_generated_data(self, data_dir: Path) -> None:
        """With ``generate``: the ``glue_tiny`` files, generated unless they are there."""
        if self.generate:
            from .generate import GlueTinySpec, ensure_glue_tiny

            options = dict(self.generate)
            ensure_glue_tiny(data_dir / options.pop("root"), GlueTinySpec(**options))

    def read(self, data_dir: Path, split: str) -> GlueExamples:
        return read_split(data_dir, self.spec, split, official=self.official, hub=self.hub)

    def encode(self, parts: list[GlueExamples]) -> EncodedExamples:
        """The examples of ``parts`` (MNLI's two dev sets: groups 0 and 1), encoded."""
        ids, labels, groups = [], [], []
        for group, part in enumerate(parts):
            ids += self.tokenizer.encode_examples(part.texts, self.seq_len)
            labels.append(part.labels)
            groups.append(np.full(len(part.texts), group))
        dtype = np.float32 if self.regression else np.int64
        return EncodedExamples(ids, np.concatenate(labels).astype(dtype), np.concatenate(groups))

    def load_tokenizer(self, data_dir: Path, train: GlueExamples):
        """The pretraining run's WordPiece, or one trained (once, cached) on the training sentences."""
        from tasks.mlm.wordpiece import cached_wordpiece, pretrained_tokenizer

        if self.pretrained:
            saved = read_checkpoint(self.pretrained)  # read once: prepare_model loads its weights
            self._pretrained = {k: saved[k] for k in ("model", "loop", "step") if k in saved}
            state = saved.get("task") or {}
            if "tokenizer" not in state:
                raise ConfigError(
                    f"backbone.model.pretrained={self.pretrained} carries no tokenizer: it must be a "
                    "checkpoint of an mlm run (task=mlm or mlm_tiny), checkpoints/last.pt"
                )
            return pretrained_tokenizer(state)
        path = data_dir / self.cache_dir / self.spec.name / f"wordpiece-{self.vocab_size}" / "tokenizer.json"
        sentences = [t for example in train.texts for t in example]
        source = {"files": train.source, "sha256": hashlib.sha256("\n".join(sentences).encode()).hexdigest()}
        return cached_wordpiece(path, lambda: sentences, self.vocab_size, source)

    def collate_fn(self, items: list) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Pads to the batch's longest example: ``(ids, pad_mask)`` (B, N), ``(labels, groups)`` (B,)."""
        ids = nn.utils.rnn.pad_sequence([i for i, _, _ in items], batch_first=True, padding_value=0)
        lengths = torch.tensor([len(i) for i, _, _ in items])
        pad_mask = torch.arange(ids.shape[1])[None, :] < lengths[:, None]  # (B, N), True: a real token
        labels = torch.stack([label for _, label, _ in items])
        return ids, pad_mask, labels, torch.tensor([g for _, _, g in items])

    # -- model, loss, metrics ------------------------------------------------------------

    def build_model(self, backbone: DictConfig) -> nn.Module:
        if self.tokenizer is None:
            raise RuntimeError("build_model needs the tokenizer's vocabulary: call datasets() first")
        vocab = self.tokenizer.vocab_size
        return instantiate(backbone.model, vocab_size=vocab, num_labels=self.num_labels, _convert_="all")

    def model_arguments(self) -> dict[str, Any]:
        """``vocab_size``: the WordPiece trained here, or (**[reading]**) with a checkpoint, whose
        vocabulary is known only once it is read, the same: the mlm recipe's 32,768 is the default."""
        return {"vocab_size": self.vocab_size, "num_labels": self.num_labels}

    def example_inputs(self, device: str | torch.device = "cpu") -> tuple[Tensor]:
        """A sequence of ``seq_len`` tokens, none of them padding (the mask left out)."""
        return (torch.zeros(1, self.seq_len, dtype=torch.long, device=device),)  # (1, N) token ids

    def prepare_model(self, model: nn.Module) -> None:
        """Load the pretrained encoder (after the variant, so a parametrization's keys match)."""
        if not self.pretrained:
            log.warning(
                "task %s: fine-tuning from random initialisation (backbone.model.pretrained is null; an "
                "mlm run's checkpoints/last.pt gives the pretrained encoder)",
                self.name,
            )
            return
        saved, self._pretrained = self._pretrained, None  # the weights datasets() read, then released
        loaded = model.load_pretrained(self.pretrained, saved=saved)
        log.info("task %s: fine-tuning from %s (step %s)", self.name, loaded["path"], loaded["step"])

    def model_inputs(self, batch: tuple) -> tuple[Tensor, Tensor]:
        return batch[0], batch[1]

    def loss(self, outputs: Tensor, labels: Tensor, reduction: str = "mean") -> Tensor:
        if self.regression:
            return F.mse_loss(outputs[:, 0].float(), labels.float(), reduction=reduction)
        return F.cross_entropy(outputs.float(), labels, reduction=reduction)

    def train_loss(self, model: nn.Module, batch: tuple) -> Tensor:
        return self.loss(model(*self.model_inputs(batch)), batch[2])

    def eval_sums(self, model: nn.Module, batch: tuple) -> dict[str, tuple[Tensor, int]]:
        outputs, labels = model(*self.model_inputs(batch)), batch[2]
        predictions = outputs[:, 0].float() if self.regression else outputs.argmax(-1)
        self._outputs.append((predictions.cpu(), labels.cpu(), batch[3].cpu()))
        return {"val/loss": (self.loss(outputs, labels, "sum"), labels.numel())}

    def derived_metrics(self, means: dict[str, float]) -> dict[str, float]:
        """The official metrics of the predictions this validation gathered (from every process)."""
        outputs, self._outputs = gather(self._outputs), []
        if not outputs:  # nothing evaluated (on any process)
            return {}
        predictions, labels, groups = (torch.cat(parts).numpy() for parts in zip(*outputs, strict=True))
        metrics = {}
        for group, suffix in ((0, ""), (1, "_mm")):
            chosen = groups == group
            if chosen.any():
                found = task_metrics(self.spec, predictions[chosen], labels[chosen])
                metrics.update({METRIC_KEYS[name] + suffix: value for name, value in found.items()})
        return metrics


def read_checkpoint(path: str) -> dict[str, Any]:
    """A pretraining checkpoint, or a :class:`ConfigError` saying how to make one."""
    if not Path(path).is_file():
        raise ConfigError(
            f"backbone.model.pretrained={path}: no such checkpoint. It is an mlm run's checkpoints/last.pt: "
            "pretrain first (experiment=glue_tiny and paper/glue name the command), or set "
            "backbone.model.pretrained=null to fine-tune from random initialisation"
        )
    return checkpoint.load(Path(path))


def gather(outputs: list) -> list:
    """Every process's ``outputs``, concatenated in rank order (this process's alone without DDP)."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return outputs
    everyone = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(everyone, outputs)
    return [item for part in everyone for item in part]
