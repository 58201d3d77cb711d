"""Masked-language-model pretraining (``task=mlm``, ``task=mlm_tiny``): BERT's objective with the
Cramming recipe (see :mod:`tasks.mlm.task`), a WordPiece tokenizer trained offline or BERT's own
(:mod:`tasks.mlm.wordpiece`) and BERT's 80/10/10 masking (:mod:`tasks.mlm.masking`)."""

from .masking import indexed_mask_tokens, mask_tokens
from .task import MaskedLM, PackedSequences
from .wordpiece import (
    SPECIALS,
    WordPieceTokenizer,
    load_bert_vocab,
    pretrained_tokenizer,
    train_wordpiece,
)

__all__ = [
    "SPECIALS",
    "MaskedLM",
    "PackedSequences",
    "WordPieceTokenizer",
    "indexed_mask_tokens",
    "load_bert_vocab",
    "mask_tokens",
    "pretrained_tokenizer",
    "train_wordpiece",
]
