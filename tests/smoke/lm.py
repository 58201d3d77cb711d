"""Language modelling: the embedded byte corpus needs no data; TinyStories and WikiText-103 get
small copies in the real Hugging Face layouts, and GPT-2's BPE files are stood in for by a
byte-level BPE trained on the same text and saved in GPT-2's file format (``vocab.json``,
``merges.txt``).

The text is CPython's ``pydoc_data`` topics (English prose and code, shipped with Python).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import torch
from torch import Tensor

TINY_LM = ["task.seq_len=16", "task.batch_size=4", "task.eval_batch_size=4", "trainer.num_workers=0"]
HUB = [*TINY_LM, "trainer.precision=fp32"]

OVERRIDES = {"lm_char": TINY_LM, "lm_tinystories": HUB, "lm_wikitext103": HUB}
#: full-size decoders (up to 472M parameters) build and step on the meta device on this task only;
#: on the others, whose data path the tiny decoder covers, they compose
FULL_SIZE_STEPS_ON = ["lm_char"]
#: the full-size decoders' one real step: GPT-2 small on the TinyStories copy, GPT-2's file format
FULL_SIZE_STEP = "paper/lm"
#: each full-size decoder's depth and heads at 2 channels per head
REDUCED_WIDTH = {
    "gpt2_small": ["backbone.model.dim=24"],  # 12 heads
    "gpt2_medium": ["backbone.model.dim=32"],  # 16 heads
    "gpt_472m": ["backbone.model.dim=40"],  # 20 heads
}
#: the vocabulary of each tokenizer a task can name (``bpe``: the task's ``bpe_vocab_size``)
VOCABULARY = {"bytes": 256, "gpt2": 50257}


def documents() -> tuple[list[str], list[str]]:
    """``(train, validation)`` documents: 40 and 8 of the pydoc topics, in name order."""
    from pydoc_data.topics import topics

    docs = [topics[name] for name in sorted(topics)]
    return docs[:40], docs[40:48]


def write_save_to_disk(root: Path, splits: dict[str, list[str]]) -> None:
    """``DatasetDict.save_to_disk(root)`` of one ``text`` column per split."""
    import datasets

    datasets.DatasetDict(
        {k: datasets.Dataset.from_dict({"text": v}) for k, v in splits.items()}
    ).save_to_disk(str(root))


def write_parquet(folder: Path, splits: dict[str, list[str]]) -> None:
    """``<folder>/<split>-00000-of-00001.parquet`` as the hub repositories name them."""
    import datasets

    folder.mkdir(parents=True, exist_ok=True)
    for split, rows in splits.items():
        datasets.Dataset.from_dict({"text": rows}).to_parquet(str(folder / f"{split}-00000-of-00001.parquet"))


def lines(docs: list[str]) -> list[str]:
    """WikiText's rows: every line of every document, newline kept."""
    return [line for doc in docs for line in doc.splitlines(keepends=True)]


def write_gpt2_format_bpe(folder: Path, texts: list[str], vocab_size: int = 512) -> None:
    """A byte-level BPE trained on ``texts``, saved as GPT-2's ``vocab.json`` and ``merges.txt``."""
    from tasks.lm.tokenizer import train_bpe

    folder.mkdir(parents=True, exist_ok=True)
    trained = train_bpe(texts, vocab_size, folder / "trained.json")
    trained.tokenizer.model.save(str(folder))
    (folder / "trained.json").unlink()


def prepare(data_dir: Path) -> None:
    train, val = documents()
    write_save_to_disk(data_dir / "tinystories", {"train": train, "validation": val})
    write_parquet(
        data_dir / "wikitext103" / "wikitext-103-raw-v1",
        {"train": lines(train), "validation": lines(val), "test": lines(val)},  # WikiText's three splits
    )
    write_gpt2_format_bpe(data_dir / "tokenizers" / "gpt2", train)


def without_data(task) -> None:
    """The tokenizer's vocabulary size, which ``build_model`` reads, without reading the data."""
    size = VOCABULARY.get(task.tokenizer_kind, task.bpe_vocab_size)
    task.tokenizer = SimpleNamespace(vocab_size=size)


def synthetic_batch(task, size: int = 2) -> tuple[Tensor, tuple[int, ...]]:
    """``seq_len + 1`` token ids per sample ``(B, L + 1)`` on the default device, and the logits'
    shape ``(B, L, V)``."""
    vocab = task.tokenizer.vocab_size
    return torch.randint(0, vocab, (size, task.seq_len + 1)), (size, task.seq_len, vocab)
