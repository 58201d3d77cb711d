"""``task=mlm``: masked-language-model pretraining of a BERT encoder with the Cramming recipe.

Cramming (Geiping & Goldstein, 2022; ``JonasGeiping/cramming``, ``train/bert-o4.yaml``,
``data/bookcorpus-wikipedia.yaml``) trains BERT's objective on a corpus packed into sequences of
128 WordPiece tokens: documents joined in order, each followed by ``[SEP]``, no ``[CLS]``
(``include_cls_token_in_corpus: False``, ``include_sep_token_in_corpus: True``), cut into
non-overlapping sequences. BERT's masking (:mod:`tasks.mlm.masking`) hides ``mask_prob`` of the
tokens, and the prediction is sparse: the encoder's states at the masked positions alone go
through the decoder, and the loss is their mean cross-entropy. They are gathered without a host
sync (a bound on their number known on the host, :func:`tasks.mlm.masking.masked_positions`).

Validation reports ``val/loss`` (the mean cross-entropy per masked token, in nats: the main metric,
lower is better), ``val/acc`` (the share of masked tokens predicted exactly) and ``val/ppl``
(``exp(val/loss)``) over ``trainer.eval_batches`` batches of the validation sequences.

Masks. Training masks come from the task's own ``torch.Generator``, seeded with ``mask_seed`` and
advanced only by :meth:`MaskedLM.train_loss`; its state is in :meth:`MaskedLM.state_dict`, so a
resumed run masks as an uninterrupted one. (Every process of a DDP run draws the same stream,
for its own sequences.) Validation masks are a function of each sequence's index alone
(:func:`tasks.mlm.masking.indexed_mask_tokens`): the same in every validation of every run.

The checkpoint's ``task`` entry (:meth:`MaskedLM.state_dict`) carries the tokenizer, which GLUE
fine-tuning reads back (:func:`tasks.mlm.wordpiece.pretrained_tokenizer`): ``{"mask_generator": ByteTensor,
"tokenizer": tokenizer.json's text, "tokenizer_name": "wordpiece" | "bert"}``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from hydra.utils import instantiate
from omegaconf import DictConfig
from torch import Tensor, nn

from src.engine.task import Task
from src.errors import ConfigError, DataError
from tasks.lm.cache import MappedTokens, cached_splits
from tasks.lm.corpora import HubDataset, SplitSource, find_split

from .masking import (
    apply,
    draw,
    indexed_draws,
    masked_logits,
    masked_positions,
    selection_bound,
    unwrap,
)
from .wordpiece import (
    WordPieceTokenizer,
    cached_wordpiece,
    load_bert_vocab,
    missing_tokenizer_line,
)

TOKENIZERS = ("wordpiece", "bert")
IGNORE = -100  # the target of a gathered position that is not masked: the loss skips it


class PackedSequences(MappedTokens):
    """Non-overlapping sequences of ``seq_len`` tokens of ``tokens[start:stop]``: item ``i`` is
    ``(ids (N,) int64, i)``, the index with which evaluation masks it. A memory-mapped array is
    reopened, not copied, in DataLoader workers."""

    def __init__(self, tokens: np.ndarray, seq_len: int, start: int = 0, stop: int | None = None) -> None:
        super().__init__(tokens)
        self.seq_len, self.start = seq_len, start
        self.stop = len(tokens) if stop is None else stop

    def __len__(self) -> int:
        return max(0, (self.stop - self.start) // self.seq_len)

    def __getitem__(self, index: int) -> tuple[Tensor, int]:  # (N,), index
        if not 0 <= index < len(self):
            raise IndexError(index)
        at = self.start + index * self.seq_len
        return torch.from_numpy(self.tokens[at : at + self.seq_len].astype(np.int64)), index


class MaskedDecoding:
    """One training step's computation as :meth:`MaskedLM.train_loss` runs it, for a plan: the
    encoder on every position, the tied decoder only on the masked ones (``mask_prob`` of them,
    the mean; **[reading]**), as :func:`tasks.mlm.masking.masked_logits` gathers them."""

    def __init__(self, model: nn.Module, mask_prob: float) -> None:
        self.model, self.mask_prob = model, mask_prob

    def __call__(self, ids: Tensor) -> Tensor:  # ids (B, N)
        hidden = self.model.encode(ids)  # (B, N, D)
        masked = max(1, round(self.mask_prob * ids.shape[1]))
        return self.model.mlm_logits(hidden[:, :masked])  # (B, M, V)

    def parameters(self) -> Any:
        return self.model.parameters()

    def train(self) -> None:
        self.model.train()


class MaskedLM(Task):
    """Masked-LM pretraining on a Hugging Face text corpus on disk (module docstring).

    Args:
        folder: the corpus under ``paths.data_dir`` (``save_to_disk`` or the hub's parquet layout,
            :mod:`tasks.lm.corpora`).
        dataset, dataset_config: its hub name and config, for the missing-data message. [reading]
            The default corpus is English Wikipedia (``wikimedia/wikipedia``, ``20231101.en``); the
            Cramming paper trains on Wikipedia + BookCorpus, then on the Pile.
        train_split, val_split: the hub's split names; ``val_split=None`` holds out the last
            ``val_fraction`` of the training split's sequences.
        column: the text column. seq_len: tokens per sequence (Cramming's 128).
        tokenizer: ``wordpiece`` (trained here on the training split, ``vocab_size`` tokens, cached
            in ``<cache_dir>/<folder>/wordpiece-<vocab_size>/tokenizer.json``) or ``bert`` (BERT's
            vocabulary from ``bert_dir``, under ``paths.data_dir``).
        cache_dir: tokenizers and token arrays; relative paths are under ``paths.data_dir``.
        mask_prob: the share of tokens masked: BERT's 0.15. [reading] Cramming's final recipe
            (``train/bert-o4.yaml``) masks 0.25.
        mask_seed: the training masks' seed (the configs set ``${seed}``).
        generate: ``{root: <folder under paths.data_dir>, **GlueTinySpec fields}``: generate the
            synthetic ``glue_tiny`` corpus there before reading (:mod:`tasks.glue.generate`), or None.
        The rest: every task's (:class:`src.engine.task.Task`).
    """

    metric = "val/loss"
    metric_mode = "min"

    def __init__(
        self,
        folder: str = "wikipedia",
        seq_len: int = 128,
        dataset: str = "wikimedia/wikipedia",
        dataset_config: str | None = "20231101.en",
        train_split: str = "train",
        val_split: str | None = None,
        val_fraction: float = 0.001,
        column: str = "text",
        tokenizer: str = "wordpiece",
        vocab_size: int = 32768,
        bert_dir: str = "tokenizers/bert-base-uncased",
        cache_dir: str = "cache/mlm",
        mask_prob: float = 0.15,
        mask_seed: int = 0,
        generate: dict[str, Any] | None = None,
        **common: Any,
    ) -> None:
        check_options(tokenizer, mask_prob, val_split, val_fraction, seq_len)
        super().__init__(**common)
        self.folder, self.seq_len, self.column = folder, seq_len, column
        self.hub = HubDataset(dataset, dataset, dataset_config)
        self.train_split, self.val_split, self.val_fraction = train_split, val_split, val_fraction
        self.tokenizer_kind, self.vocab_size, self.bert_dir = tokenizer, vocab_size, bert_dir
        self.cache_dir, self.mask_prob = cache_dir, mask_prob
        self.generate = dict(generate) if generate is not None else None
        self.generator = torch.Generator().manual_seed(mask_seed)
        self.tokenizer: WordPieceTokenizer | None = None

    @property
    def tokens_per_sample(self) -> int:
        return self.seq_len

    # -- data ------------------------------------------------------------------------------

    def datasets(self, data_dir: Path) -> tuple[PackedSequences, PackedSequences]:
        data_dir = Path(data_dir)
        arrays = self.token_arrays(data_dir)
        train, val = self.train_split, self.val_split
        if val is None:  # the last val_fraction of the training split's sequences
            n = len(arrays[0]) // self.seq_len
            cut = (n - max(1, round(n * self.val_fraction))) * self.seq_len
            parts = [(arrays[0], 0, cut, train), (arrays[0], cut, None, f"held-out end of {train}")]
        else:
            parts = [(arrays[0], 0, None, train), (arrays[1], 0, None, val)]
        sets = [PackedSequences(tokens, self.seq_len, start, stop) for tokens, start, stop, _ in parts]
        for packed, (tokens, _, _, split) in zip(sets, parts, strict=True):
            if len(packed) == 0:
                raise DataError(
                    f"task {self.name}: the {split} split ({len(tokens)} tokens in all) holds no sequence "
                    f"of task.seq_len={self.seq_len}"
                )
        return sets[0], sets[1]

    def prepare_data(self, data_dir: Path) -> None:
        """The generated corpus (``generate``), the WordPiece trained here and the token caches that
        :meth:`datasets` reads, by the same code (:meth:`token_arrays`)."""
        self.token_arrays(Path(data_dir))

    def token_arrays(self, data_dir: Path) -> list[np.ndarray]:
        """The token arrays of the training split and of ``val_split`` (when set), the corpus
        generated and the tokenizer trained first where needed; sets ``self.tokenizer``."""
        self.ensure_corpus(data_dir)
        train, val = self.train_split, self.val_split
        return self.split_tokens(data_dir, (train,) if val is None else (train, val))

    def ensure_corpus(self, data_dir: Path) -> None:
        """With ``generate``: the synthetic ``glue_tiny`` corpus, generated unless it is there."""
        if self.generate is None:
            return
        from tasks.glue.generate import GlueTinySpec, ensure_glue_tiny

        spec = dict(self.generate)
        root = spec.pop("root", None)
        if root is None:
            raise ConfigError("task.generate needs root: the folder under paths.data_dir to generate into")
        try:
            made = GlueTinySpec(**spec)
        except TypeError as error:
            raise ConfigError(f"task.generate: {error} (GlueTinySpec's fields, besides root)") from None
        ensure_glue_tiny(data_dir / root, made)

    def split_tokens(self, data_dir: Path, splits: tuple[str, ...]) -> list[np.ndarray]:
        """The token arrays of ``splits``, tokenised once into the cache; sets ``self.tokenizer``."""
        sources = self.find_sources(data_dir, splits)
        cache = data_dir / self.cache_dir / self.folder
        self.tokenizer = self.load_tokenizer(data_dir, sources[0], cache)
        return cached_splits(cache, splits, sources, self.tokenizer, self.column, separate=True)

    def find_sources(self, data_dir: Path, splits: tuple[str, ...]) -> list[SplitSource]:
        """Each split's files, or find_split's :class:`DataError` with a line on the tokenizer."""
        try:
            return [find_split(data_dir / self.folder, split, self.hub) for split in splits]
        except DataError as missing:
            line = missing_tokenizer_line(self.tokenizer_kind, data_dir / self.bert_dir)
            if line is None:
                raise
            raise DataError(f"{missing}\n{line}") from None

    def load_tokenizer(self, data_dir: Path, train: SplitSource, cache: Path) -> WordPieceTokenizer:
        """BERT's vocabulary, or a WordPiece trained on ``train`` once (again when its files change)."""
        if self.tokenizer_kind == "bert":
            return load_bert_vocab(data_dir / self.bert_dir)
        path = cache / f"wordpiece-{self.vocab_size}" / "tokenizer.json"
        source = {"files": train.fingerprint(), "column": self.column}
        texts = lambda: (t for batch in train.batches(self.column) for t in batch)  # noqa: E731
        return cached_wordpiece(path, texts, self.vocab_size, source)

    # -- model, loss, metrics ------------------------------------------------------------

    def model_arguments(self) -> dict[str, Any]:
        """The WordPiece's ``vocab_size`` (**[reading]** with ``tokenizer=bert`` too: BERT's vocabulary
        is known only from its file, and bert-base-uncased's 30,522 is near the default 32,768)."""
        return {"vocab_size": self.vocab_size}

    def example_inputs(self, device: str | torch.device = "cpu") -> tuple[Tensor]:
        return (torch.zeros(1, self.seq_len, dtype=torch.long, device=device),)  # (1, N) token ids

    def planned_model(self, cfg: DictConfig, device: str = "meta") -> tuple[Any, str]:
        """The encoder with the decoder on the masked positions only, as :meth:`train_loss` runs it."""
        model, note = super().planned_model(cfg, device)
        return MaskedDecoding(model, self.mask_prob), note

    def build_model(self, backbone: DictConfig) -> nn.Module:
        """The backbone's encoder, told the tokenizer's vocabulary."""
        if self.tokenizer is None:
            raise RuntimeError("build_model needs the tokenizer's vocabulary: call datasets() first")
        model = instantiate(backbone.model, vocab_size=self.tokenizer.vocab_size, _convert_="all")
        max_len = getattr(model, "max_len", None)
        if max_len is not None and max_len < self.seq_len:
            raise ConfigError(f"backbone.model.max_len={max_len} is shorter than task.seq_len={self.seq_len}")
        return model

    def masks(self, ids: Tensor, indices: Tensor | None = None) -> tuple[Tensor, Tensor, int]:
        """``(inputs (B, N), targets_mask (B, N), bound)``: from the training stream, or by sample
        index; ``bound`` (on the host) is at least the number of masked tokens."""
        tok = self.tokenizer
        shape, specials = ids.shape, tok.special_ids
        if indices is None:
            draws = draw(shape, tok.vocab_size, specials, self.generator)
        else:
            draws = indexed_draws(shape, indices, tok.vocab_size, specials)
        inputs, mask = apply(ids, draws, self.mask_prob, specials, tok.mask_id)
        return inputs, mask, selection_bound(draws[0], self.mask_prob)

    def masked_targets(
        self, model: nn.Module, batch: tuple[Tensor, Tensor], indices: Tensor | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """``(logits (K, V) float32, targets (K,), mask (B, N))`` at the gathered positions, the
        unmasked ones among them with target :data:`IGNORE`; no host sync (module docstring)."""
        ids = batch[0]  # (B, N)
        inputs, mask, bound = self.masks(ids, indices)
        positions, valid = masked_positions(mask, bound)  # (K,), (K,)
        logits = masked_logits(model, inputs, positions).float()  # (K, V)
        targets = ids.flatten()[positions].masked_fill(~valid, IGNORE)  # (K,)
        return logits, targets, mask

    def train_loss(self, model: nn.Module, batch: tuple[Tensor, Tensor]) -> Tensor:
        logits, targets, mask = self.masked_targets(model, batch)
        loss = F.cross_entropy(logits, targets, ignore_index=IGNORE, reduction="sum")
        return loss / mask.sum().clamp_min(1)  # a batch with no masked token (never, in practice): 0

    def eval_sums(self, model: nn.Module, batch: tuple[Tensor, Tensor]) -> dict[str, tuple[Tensor, Tensor]]:
        logits, targets, mask = self.masked_targets(unwrap(model), batch, batch[1])
        count = mask.sum()  # a tensor: the loop adds it on the device
        return {
            "val/loss": (F.cross_entropy(logits, targets, ignore_index=IGNORE, reduction="sum"), count),
            "val/acc": ((logits.argmax(-1) == targets).sum(), count),  # IGNORE never equals a class
        }

    def derived_metrics(self, means: dict[str, float]) -> dict[str, float]:
        return {"val/ppl": math.exp(min(means["val/loss"], 700.0))}

    def model_inputs(self, batch: tuple[Tensor, Tensor]) -> tuple[Tensor]:
        """The masked inputs the model sees in evaluation (the conditioning monitor's)."""
        return (self.masks(*batch)[0],)

    # -- state -----------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """``mask_generator`` (the training masks' RNG state) and, once the data was read,
        ``tokenizer`` (``tokenizer.json``'s text) and ``tokenizer_name``: stable keys, which GLUE
        fine-tuning reads from the checkpoint (:func:`tasks.mlm.wordpiece.pretrained_tokenizer`)."""
        state: dict[str, Any] = {"mask_generator": self.generator.get_state()}
        if self.tokenizer is not None:
            state.update(tokenizer=self.tokenizer.to_str(), tokenizer_name=self.tokenizer.name)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["mask_generator"])
        saved = state.get("tokenizer")
        if saved is not None and self.tokenizer is not None and saved != self.tokenizer.to_str():
            raise DataError(
                f"task {self.name}: the checkpoint's {state.get('tokenizer_name')} vocabulary is not "
                f"this run's ({self.tokenizer.fingerprint}; retrained since?), so its token ids mean other "
                "tokens: rerun with trainer.resume=restart or another task.cache_dir"
            )


def check_options(tokenizer: str, mask_prob: float, val_split, val_fraction: float, seq_len: int) -> None:
    """One :class:`ConfigError` for the first option out of range."""
    if tokenizer not in TOKENIZERS:
        raise ConfigError(f"task.tokenizer={tokenizer!r}: choose one of {', '.join(TOKENIZERS)}")
    if not 0.0 < mask_prob < 1.0:
        raise ConfigError(f"task.mask_prob={mask_prob}: the share of masked tokens must be in (0, 1)")
    if val_split is None and not 0.0 < val_fraction < 1.0:
        raise ConfigError(f"task.val_fraction={val_fraction}: with val_split=null it must be in (0, 1)")
    if seq_len < 2:
        raise ConfigError(f"task.seq_len={seq_len}: a sequence needs at least 2 tokens")
