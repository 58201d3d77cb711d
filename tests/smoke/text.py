"""Masked LM and GLUE: a small corpus in the hub's parquet layout for ``mlm`` (CPython's documentation
topics, as the LM family's), every GLUE task's files in GLUE's own layout (a few rows each, written from
the official layouts by ``tests/glue_fixtures.py``); the ``glue_tiny`` tasks generate their own.
Without a pretrained checkpoint the GLUE tasks fine-tune from random initialisation (their warning)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from smoke import train_step
from tasks.mlm import MaskedLM

TINY_TEXT = ["task.seq_len=32", "task.batch_size=4", "task.eval_batch_size=4", "trainer.num_workers=0"]
#: no pretraining run here: the experiments' pretrained_by would name one (tests/test_glue_pipeline.py
#: runs the pipeline that makes it)
GLUE = [*TINY_TEXT, "backbone.model.pretrained=null"]
GLUE_TASKS = ("cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte", "wnli")

OVERRIDES = {
    "mlm": [
        *TINY_TEXT,
        "task.vocab_size=300",
        "task.val_fraction=0.1",
        "trainer.accumulate=1",
        "trainer.precision=fp32",
    ],  # fmt: skip
    "mlm_tiny": TINY_TEXT,
    **{f"glue_{t}": [*GLUE, "task.vocab_size=200"] for t in GLUE_TASKS},
    "glue_tiny_sst2": GLUE,
    "glue_tiny_rte": GLUE,
}
#: the full-size Crammed BERT (120M parameters) builds and steps on the meta device on the embedded
#: pretraining only; on the other tasks, whose data paths the micro model covers, it composes
FULL_SIZE_STEPS_ON = ["mlm_tiny"]
#: the full-size encoder's one real step: Crammed BERT fine-tuned on the CoLA files (from random weights)
FULL_SIZE_STEP = "paper/glue"
#: Crammed BERT's 16 blocks and 12 heads at 2 channels per head
REDUCED_WIDTH = {"crammed_bert": ["backbone.model.dim=24", "backbone.model.ffn_dim=48"]}


def prepare(data_dir: Path) -> None:
    from glue_fixtures import write_official

    from smoke.lm import documents, write_parquet

    train, _ = documents()
    write_parquet(data_dir / "wikipedia" / "20231101.en", {"train": train})
    write_official(data_dir)


def without_data(task) -> None:
    """The vocabulary size ``build_model`` reads from the tokenizer, without reading the data: the
    task's ``vocab_size`` (the WordPiece it would train)."""
    task.tokenizer = SimpleNamespace(vocab_size=task.vocab_size)


def synthetic_batch(task, size: int = 2) -> tuple[tuple[Tensor, ...], tuple[int, ...]]:
    """A batch of ``seq_len`` token ids on the default device and the model's output shape: masked
    LM ``(ids (B, N), index (B,))`` -> logits ``(B, N, V)``; GLUE ``(ids, pad_mask (B, N), labels,
    groups (B,))`` -> ``(B, num_labels)``."""
    ids = torch.randint(0, task.tokenizer.vocab_size, (size, task.seq_len))
    if isinstance(task, MaskedLM):
        return (ids, torch.arange(size)), (size, task.seq_len, task.tokenizer.vocab_size)
    labels = torch.randn(size) if task.regression else torch.randint(0, len(task.spec.labels), (size,))
    pad_mask = torch.ones(size, task.seq_len, dtype=torch.bool)
    outputs = 1 if task.regression else len(task.spec.labels)
    return (ids, pad_mask, labels, torch.zeros(size, dtype=torch.long)), (size, outputs)


def step(task, model: nn.Module, batch: tuple[Tensor, ...]) -> tuple[Tensor, Tensor]:
    """``(loss, output)`` of one training batch. Masked LM picks the masked positions by value, which
    the meta device has not: its loss is then over every position's logits ``(B, N, V)``, the path
    a DDP or compiled model takes (``tasks.mlm.masking.masked_logits``). GLUE: the task's loss."""
    if not isinstance(task, MaskedLM):
        return train_step(task, model, batch)
    logits = model(batch[0])  # (B, N, V)
    return F.cross_entropy(logits.flatten(0, 1).float(), batch[0].flatten()), logits
