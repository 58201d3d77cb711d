"""The language-modelling tasks: next-token prediction with a causal decoder.

Every task yields windows of ``seq_len + 1`` tokens (inputs ``[:-1]``, targets ``[1:]``),
trains with the mean token cross-entropy and reports, on the validation split (in order, over
``trainer.eval_batches`` batches so that runs compare):

* ``val/loss``: mean cross-entropy per token, in nats (the main metric, lower is better);
* ``val/ppl``: perplexity, ``exp(val/loss)``.

The loop logs ``tokens_per_s`` beside its ``throughput`` (samples/s) from
``tokens_per_sample``.

Tasks: ``lm_char`` (the embedded default: CPython's documentation as UTF-8 bytes, see
:mod:`tasks.lm.corpora`), ``lm_tinystories`` and ``lm_wikitext103`` (Hugging Face copies on
disk, GPT-2's BPE, tokenised once into memory-mapped arrays, see :mod:`tasks.lm.cache`).
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from hydra.utils import instantiate
from omegaconf import DictConfig
from torch import Tensor, nn

from src.engine.generated import counted, ensure_generated
from src.engine.task import Task, held_out_share
from src.errors import ConfigError, DataError

from .cache import TokenWindows, cached_splits
from .corpora import HubDataset, find_split, pydoc_topics_text, read_text_file
from .tokenizer import (
    GPT2_VOCAB,
    ByteTokenizer,
    TextTokenizer,
    gpt2_files_present,
    load_gpt2,
    load_trained_bpe,
    missing_gpt2_message,
    train_bpe,
)

TOKENIZERS = ("gpt2", "bpe", "bytes")


class LanguageModelling(Task):
    """Next-token prediction over windows of ``seq_len + 1`` tokens with a causal decoder.

    Args:
        tokenizer: ``gpt2`` (GPT-2's BPE from ``gpt2_dir``), ``bpe`` (a byte-level BPE of
            ``bpe_vocab_size`` trained on the training split) or ``bytes``; see
            :mod:`tasks.lm.tokenizer`.
        gpt2_dir: where GPT-2's BPE files are, relative to ``paths.data_dir``.
        cache_dir: where tokenizers trained here and token arrays go; relative paths are
            under ``paths.data_dir`` (default ``cache/lm``).
        The rest: every task's (:class:`src.engine.task.Task`).
    """

    metric = "val/loss"
    metric_mode = "min"

    def __init__(
        self,
        seq_len: int,
        tokenizer: str = "gpt2",
        gpt2_dir: str = "tokenizers/gpt2",
        bpe_vocab_size: int = 50257,
        cache_dir: str = "cache/lm",
        **common: Any,
    ) -> None:
        if tokenizer not in TOKENIZERS:
            raise ConfigError(f"task.tokenizer={tokenizer!r}: choose one of {', '.join(TOKENIZERS)}")
        super().__init__(**common)
        self.seq_len = seq_len
        self.tokenizer_kind, self.gpt2_dir, self.bpe_vocab_size = tokenizer, gpt2_dir, bpe_vocab_size
        self.cache_dir = cache_dir
        self.tokenizer: TextTokenizer | None = None

    @property
    def tokens_per_sample(self) -> int:
        """Tokens predicted per sample: the loop turns samples/s into tokens/s with it."""
        return self.seq_len

    # -- data ------------------------------------------------------------------------------

    def datasets(self, data_dir: Path) -> tuple[TokenWindows, TokenWindows]:
        train, val = self.token_arrays(Path(data_dir))
        return self.windows(train, "training"), self.windows(val, "validation")

    def prepare_data(self, data_dir: Path) -> None:
        """The tokenizer trained here (``bpe``) and the token caches :meth:`datasets` reads, by the
        same code (:meth:`token_arrays`)."""
        self.token_arrays(Path(data_dir))

    def windows(self, tokens: np.ndarray, split: str) -> TokenWindows:
        """The windows of a split's tokens; a :class:`DataError` when it has less than one."""
        if len(tokens) <= self.seq_len:
            raise DataError(
                f"task {self.name}: the {split} split has {len(tokens)} tokens, fewer than one window "
                f"of task.seq_len={self.seq_len} + 1"
            )
        return TokenWindows(tokens, self.seq_len)

    def token_arrays(self, data_dir: Path) -> tuple[np.ndarray, np.ndarray]:
        """The training and validation token arrays; sets ``self.tokenizer``."""
        raise NotImplementedError

    def load_tokenizer(
        self, data_dir: Path, train_texts=None, cache: Path | None = None, trained_on: str | None = None
    ) -> TextTokenizer:
        """The configured tokenizer; ``bpe`` is trained on ``train_texts()`` once and saved in ``cache``
        (again where ``trained_on``, a digest of that text where the caller has one, changed)."""
        if self.tokenizer_kind == "bytes":
            return ByteTokenizer()
        if self.tokenizer_kind == "gpt2":
            return load_gpt2(data_dir / self.gpt2_dir)
        path = cache / f"bpe-{self.bpe_vocab_size}" / "tokenizer.json"

        def train() -> None:
            texts = counted((t for batch in train_texts() for t in batch), "texts read")
            train_bpe(texts, self.bpe_vocab_size, path)

        ensure_generated(  # concurrent runs train it once; one trained before its marker existed is kept
            path.with_name("trained.json"),
            {"vocab_size": self.bpe_vocab_size, **({"trained_on": trained_on} if trained_on else {})},
            train,
            lambda saved: None if path.is_file() else f"missing {path}",
            present=path.is_file,
            what=f"a BPE tokenizer of {self.bpe_vocab_size:,} tokens",
            outputs=(path,),
        )
        return load_trained_bpe(path)

    def cache_root(self, data_dir: Path) -> Path:
        return data_dir / self.cache_dir  # an absolute cache_dir stays as it is

    # -- model, loss, metrics ------------------------------------------------------------

    def build_model(self, backbone: DictConfig) -> nn.Module:
        """The backbone's model, told the tokenizer's vocabulary."""
        if self.tokenizer is None:
            raise RuntimeError("build_model needs the tokenizer's vocabulary: call datasets() first")
        return instantiate(backbone.model, vocab_size=self.tokenizer.vocab_size, _convert_="all")

    def model_arguments(self) -> dict[str, Any]:
        """The tokenizer's vocabulary as its kind fixes it: GPT-2's 50,257, ``bpe_vocab_size``, 256 bytes."""
        sizes = {"gpt2": GPT2_VOCAB, "bpe": self.bpe_vocab_size, "bytes": ByteTokenizer.vocab_size}
        return {"vocab_size": sizes[self.tokenizer_kind]}

    def example_inputs(self, device: str | torch.device = "cpu") -> tuple[Tensor]:
        return (torch.zeros(1, self.seq_len, dtype=torch.long, device=device),)  # (1, L) token ids

    def train_loss(self, model: nn.Module, batch: Tensor) -> Tensor:  # batch (B, L + 1)
        logits = model(batch[:, :-1])  # (B, L, V)
        return F.cross_entropy(logits.flatten(0, 1).float(), batch[:, 1:].flatten())

    def eval_sums(self, model: nn.Module, batch: Tensor) -> dict[str, tuple[Tensor, int]]:
        logits = model(batch[:, :-1])  # (B, L, V)
        targets = batch[:, 1:].flatten()
        return {
            "val/loss": (
                F.cross_entropy(logits.flatten(0, 1).float(), targets, reduction="sum"),
                targets.numel(),
            )
        }

    def derived_metrics(self, means: dict[str, float]) -> dict[str, float]:
        """Perplexity from the mean loss (not a ratio of sums, so the loop asks for it after reducing)."""
        return {"val/ppl": math.exp(min(means["val/loss"], 700.0))}

    def model_inputs(self, batch: Tensor) -> tuple[Tensor]:
        return (batch[:, :-1],)


class CharCorpus(LanguageModelling):
    """``lm_char``: a small text as UTF-8 bytes, cut (at character boundaries) into a leading
    training part, a test part (``test_fraction``) and a trailing validation part
    (``val_fraction``).

    Validation is the last ``val_fraction`` of the text, the same bytes as before the test split
    existed; it serves everything chosen while runs go on (budgets, readings, best checkpoints, the
    settle loop's looks). ``test`` is the ``test_fraction`` just before it, evaluated once when
    training ends (``trainer.test_after``). ``test_fraction=0`` (or null) gives the older two-way
    split (training is everything before validation); null also keeps the identity of runs recorded
    before the option existed (null values leave the identity), so their records resume.

    The text is CPython's documentation topics (:func:`tasks.lm.corpora.pydoc_topics_text`),
    or the UTF-8 file ``text_file`` (relative to ``paths.data_dir``) when set.
    """

    def __init__(
        self,
        val_fraction: float = 0.1,
        test_fraction: float | None = 0.1,
        text_file: str | None = None,
        **kwargs,
    ) -> None:
        kwargs.setdefault("tokenizer", "bytes")
        super().__init__(**kwargs)
        test_fraction = held_out_share(test_fraction, val_fraction, "bytes of text")
        self.val_fraction, self.test_fraction, self.text_file = val_fraction, test_fraction, text_file

    @property
    def eval_splits(self) -> tuple[str, ...]:
        return ("val", "test") if self.test_fraction else ("val",)

    def text(self, data_dir: Path) -> str:
        return read_text_file(data_dir / self.text_file) if self.text_file else pydoc_topics_text()

    def split_texts(self, text: str) -> dict[str, str]:
        """``{"train", "test", "val"}`` → the text's parts, in that order (``test`` empty at 0)."""
        val_cut = int(len(text) * (1 - self.val_fraction))
        test_cut = int(len(text) * (1 - self.val_fraction - self.test_fraction))
        return {"train": text[:test_cut], "test": text[test_cut:val_cut], "val": text[val_cut:]}

    def split_tokens(self, data_dir: Path) -> dict[str, np.ndarray]:
        """Every part's bytes (or tokens); sets ``self.tokenizer`` (one ``bpe`` learns on training)."""
        parts = self.split_texts(self.text(data_dir))
        digest = hashlib.sha256(parts["train"].encode("utf-8")).hexdigest()[:16]
        self.tokenizer = self.load_tokenizer(
            data_dir, lambda: [[parts["train"]]], self.cache_root(data_dir) / self.name, trained_on=digest
        )
        encoded = self.tokenizer.encode_batch(list(parts.values()))
        return {name: np.asarray(ids, dtype=np.int64) for name, ids in zip(parts, encoded, strict=True)}

    def token_arrays(self, data_dir: Path) -> tuple[np.ndarray, np.ndarray]:
        tokens = self.split_tokens(data_dir)
        return tokens["train"], tokens["val"]

    def eval_dataset(self, data_dir: Path, split: str) -> TokenWindows:
        """``val``: the validation windows; ``test``: the test part's, in the same windows."""
        self.check_split(split)
        if split == "val":
            return super().eval_dataset(data_dir, split)
        return self.windows(self.split_tokens(Path(data_dir))["test"], "test")


class HubTextCorpus(LanguageModelling):
    """A text data set of the Hugging Face hub, read from a copy on disk under
    ``${paths.data_dir}/<folder>`` (see :mod:`tasks.lm.corpora` for the layouts), tokenised
    once per tokenizer into ``<cache_dir>/<folder>/<tokenizer>-<fingerprint>/<split>.bin``.
    Where the corpus has a test split (:attr:`test_split`), evaluation reads it the same way."""

    dataset: HubDataset
    separate_documents: bool
    test_split: str | None = None  # the hub's name of the corpus's test split, where it has one

    def __init__(
        self,
        folder: str,
        train_split: str = "train",
        val_split: str = "validation",
        column: str = "text",
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        self.folder, self.train_split, self.val_split, self.column = folder, train_split, val_split, column

    @property
    def eval_splits(self) -> tuple[str, ...]:
        return ("val", "test") if self.test_split else ("val",)

    def eval_dataset(self, data_dir: Path, split: str) -> TokenWindows:
        """``val``: the validation windows; ``test``: the corpus's test split, tokenised (once)
        and cached beside the others."""
        self.check_split(split)
        if split == "val":
            return super().eval_dataset(data_dir, split)
        (tokens,) = self.split_tokens(Path(data_dir), (self.test_split,))
        return self.windows(tokens, self.test_split)

    def token_arrays(self, data_dir: Path) -> tuple[np.ndarray, np.ndarray]:
        train, val = self.split_tokens(data_dir, (self.train_split, self.val_split))
        return train, val

    def prepare_data(self, data_dir: Path) -> None:
        """The tokenizer and every split's token cache, the test split's included (evaluation's) where
        the copy has it: one without its test files trains, and ``trainer.test_after`` then says how
        to test once they are there (a run's identity holds the caches made here)."""
        data_dir = Path(data_dir)
        test = (self.test_split,) if self.test_split and self.has_split(data_dir, self.test_split) else ()
        self.split_tokens(data_dir, (self.train_split, self.val_split, *test))

    def has_split(self, data_dir: Path, split: str) -> bool:
        """Whether the copy under ``data_dir`` holds ``split``'s files."""
        try:
            find_split(data_dir / self.folder, split, self.dataset)
        except DataError:
            return False
        return True

    def split_tokens(self, data_dir: Path, splits: tuple[str, ...]) -> list[np.ndarray]:
        """The token arrays of ``splits`` (the hub's names), tokenised once into the cache;
        sets ``self.tokenizer`` (a ``bpe`` one is trained on the train split)."""
        root = data_dir / self.folder
        try:  # the train split first: where it is missing, the whole copy usually is
            sources = [find_split(root, split, self.dataset) for split in splits]
        except DataError as missing:
            if self.tokenizer_kind == "gpt2" and not gpt2_files_present(data_dir / self.gpt2_dir):
                also = missing_gpt2_message(data_dir / self.gpt2_dir, also=True)
                raise DataError(f"{missing}\n{also}") from None
            raise
        cache = self.cache_root(data_dir) / Path(self.folder).name

        def train_texts():  # what a bpe tokenizer not trained yet learns from
            found = dict(zip(splits, sources, strict=True))
            train = found.get(self.train_split) or find_split(root, self.train_split, self.dataset)
            return train.batches(self.column)

        self.tokenizer = self.load_tokenizer(data_dir, train_texts, cache)
        return cached_splits(cache, splits, sources, self.tokenizer, self.column, self.separate_documents)


class TinyStories(HubTextCorpus):
    """TinyStories (Eldan & Li, 2023): short stories, one per row; ``<|endoftext|>`` after each."""

    dataset = HubDataset("TinyStories", "roneneldan/TinyStories")
    separate_documents = True


class WikiText103(HubTextCorpus):
    """WikiText-103 (Merity et al., 2016), raw: rows are consecutive lines of Wikipedia
    articles, joined as they come (the ``= Title =`` lines mark the articles)."""

    dataset = HubDataset("WikiText-103", "Salesforce/wikitext", "wikitext-103-raw-v1")
    separate_documents = False
    test_split = "test"
