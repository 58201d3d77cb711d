"""Token arrays: a split tokenised once into a flat memory-mapped file, and the training windows.

A split is stored as ``<split>.bin`` (raw ``uint16`` ids, ``uint32`` for vocabularies above
65,535) beside ``<split>.json``, which records what was tokenised and how (the tokenizer's
fingerprint, the source files' names and sizes, the separator, the token count). A later run
finds a matching ``.json`` and memory-maps the ``.bin``; anything that differs, or a ``.bin`` of
the wrong size, or whose content is not what ``<split>.manifest.json`` says was written (a
zero-filled array at its own size), triggers a rebuild. Concurrent runs (the processes of a DDP
run, the runs of a multirun) take an exclusive ``flock`` on ``<split>.lock``: one tokenises, the
others wait and then read its cache (:func:`src.engine.generated.ensure_generated`). The array is
hashed as it is written (never read back: caches can be GBs), fsynced and renamed; then the
manifest, then the ``.json``, each fsynced before its rename.

Documents are joined in order, each followed by the tokenizer's ``<|endoftext|>`` when
``separate`` (GPT-2's convention; TinyStories' stories), or joined as they come (WikiText's
rows are consecutive lines of its articles).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from src.engine.generated import ensure_generated, hashed_output, progress
from src.errors import ConfigError

from .corpora import SplitSource
from .tokenizer import EOT, TextTokenizer


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16 if vocab_size <= np.iinfo(np.uint16).max + 1 else np.uint32)


def encode_documents(
    batches: Iterable[list[str]], tokenizer: TextTokenizer, separate: bool
) -> Iterable[np.ndarray]:
    """Token ids of each batch of documents, concatenated (``<|endoftext|>`` after each when ``separate``)."""
    dtype = token_dtype(tokenizer.vocab_size)
    for texts in batches:
        ids = tokenizer.encode_batch(texts)
        if separate:
            ids = [[*doc, tokenizer.eot] for doc in ids]
        yield np.fromiter((i for doc in ids for i in doc), dtype=dtype)


def cached_splits(
    cache: Path,
    splits: Sequence[str],
    sources: Sequence[SplitSource],
    tokenizer: TextTokenizer,
    column: str,
    separate: bool,
) -> list[np.ndarray]:
    """Each split's tokens from its source's ``column``, cached once under
    ``cache/<tokenizer>-<fingerprint>/<split>`` (:func:`cached_tokens`; the source's layout, files
    and column are its fingerprint). The language-model and masked-LM tasks read their splits so."""
    folder = cache / f"{tokenizer.name}-{tokenizer.fingerprint}"
    arrays = []
    for split, source in zip(splits, sources, strict=True):
        fingerprint = {"layout": source.kind, "files": source.fingerprint(), "column": column}
        batches = lambda s=source: s.batches(column)  # noqa: E731
        arrays.append(cached_tokens(folder / split, batches, tokenizer, separate, fingerprint))
    # Tokenising is done: DataLoader workers forked from here never tokenise (and this
    # silences `tokenizers`' warning about forking after its thread pool was used).
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    return arrays


def cached_tokens(
    base: Path, batches: Callable[[], Iterable[list[str]]], tokenizer: TextTokenizer, separate: bool, source
) -> np.ndarray:
    """``base.bin`` memory-mapped, tokenising ``batches()`` into it first unless ``base.json``
    says it already holds exactly that (same ``source`` fingerprint, tokenizer and separator)."""
    if separate and tokenizer.eot is None:
        raise ConfigError(
            f"task.tokenizer={tokenizer.name} has no {EOT} to separate this data set's documents: "
            "use gpt2 or bpe"
        )
    dtype = token_dtype(tokenizer.vocab_size)
    meta = {
        "tokenizer": tokenizer.name,
        "tokenizer_fingerprint": tokenizer.fingerprint,
        "vocab_size": tokenizer.vocab_size,
        "separate_documents": separate,
        "source": source,
        "dtype": dtype.name,
    }
    bin_path = base.with_suffix(".bin")

    def damage(saved: dict) -> str | None:  # the same data, but the array is missing or has the wrong size
        expected = saved.get("tokens", -1) * dtype.itemsize
        if bin_path.is_file() and bin_path.stat().st_size == expected:
            return None
        found = bin_path.stat().st_size if bin_path.is_file() else "no"
        return f"token cache {bin_path} is damaged ({found} bytes where {expected} were written)"

    def tokenise() -> dict[str, int]:
        tokens = 0
        with hashed_output(bin_path, itemsize=dtype.itemsize) as out:  # hashed as written, fsynced, renamed
            for chunk in encode_documents(batches(), tokenizer, separate):
                out.write(memoryview(np.ascontiguousarray(chunk)).cast("B"))
                tokens += chunk.size
                progress(f"{bin_path.name}: {tokens:,} tokens so far")
        return {"tokens": tokens}

    what = f"the {tokenizer.name} token cache {bin_path.name}"
    marker = base.with_suffix(".json")
    saved = ensure_generated(marker, meta, tokenise, damage, what=what, outputs=(bin_path,))
    return _open(bin_path, dtype, saved["tokens"])


def _open(path: Path, dtype: np.dtype, tokens: int) -> np.ndarray:
    """The array memory-mapped (an empty file cannot be mapped: an empty array then)."""
    return np.memmap(path, dtype=dtype, mode="r", shape=(tokens,)) if tokens else np.zeros(0, dtype)


class MappedTokens(Dataset):
    """A data set over a flat token array that DataLoader workers reopen (a memory-mapped array is
    pickled as its file, not copied)."""

    def __init__(self, tokens: np.ndarray) -> None:
        self._tokens: np.ndarray | None = tokens
        self._file = (tokens.filename, tokens.dtype, tokens.shape) if isinstance(tokens, np.memmap) else None

    @property
    def tokens(self) -> np.ndarray:
        if self._tokens is None:
            filename, dtype, shape = self._file
            self._tokens = np.memmap(filename, dtype=dtype, mode="r", shape=shape)
        return self._tokens

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_tokens": None} if self._file is not None else dict(self.__dict__)


class TokenWindows(MappedTokens):
    """Consecutive, non-overlapping windows of ``seq_len + 1`` tokens over a flat token array:
    item ``i`` is ``tokens[i·L : i·L + L + 1]`` as ``int64`` (inputs ``[:-1]``, targets ``[1:]``).
    """

    def __init__(self, tokens: np.ndarray, seq_len: int) -> None:
        super().__init__(tokens)
        self.seq_len = seq_len

    def __len__(self) -> int:
        return max(0, (len(self.tokens) - 1) // self.seq_len)

    def __getitem__(self, index: int) -> Tensor:  # (L + 1,)
        if not 0 <= index < len(self):
            raise IndexError(index)
        start = index * self.seq_len
        return torch.from_numpy(self.tokens[start : start + self.seq_len + 1].astype(np.int64))


def unigram_entropy(tokens: np.ndarray, vocab_size: int) -> float:
    """Entropy, in nats, of the tokens' unigram frequencies: the loss of the best model that
    ignores context (the cross-entropy a model reaches by predicting these frequencies)."""
    counts = np.bincount(np.asarray(tokens), minlength=vocab_size).astype(np.float64)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())
