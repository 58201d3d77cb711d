"""BERT's WordPiece tokenizer, trained offline on a corpus or read from BERT's released vocabulary.

Cramming (Geiping & Goldstein, 2022; its ``data/bookcorpus-wikipedia.yaml``) trains a WordPiece
vocabulary of 32,768 tokens on the pretraining corpus with BERT's text handling: the text is
cleaned, lowercased and stripped of accents (BERT's normaliser), then split on whitespace and
punctuation (BERT's pre-tokenizer) before WordPiece cuts words into ``##``-continued pieces.
:func:`train_wordpiece` does the same with Hugging Face ``tokenizers``; the five special tokens
come first, so a vocabulary trained here has ``[PAD]=0, [UNK]=1, [CLS]=2, [SEP]=3, [MASK]=4``.
:func:`load_bert_vocab` reads BERT's own vocabulary instead (``bert-base-uncased``: 30,522
tokens, ``[PAD]=0, [UNK]=100, [CLS]=101, [SEP]=102, [MASK]=103``).

:class:`WordPieceTokenizer` satisfies :class:`tasks.lm.tokenizer.TextTokenizer` with ``[SEP]``
as the document separator (``eot``), which gives Cramming's packed corpus: documents joined,
each followed by ``[SEP]``, no ``[CLS]``. :meth:`WordPieceTokenizer.encode_examples` gives the
fine-tuning layout, ``[CLS] a [SEP]`` or ``[CLS] a [SEP] b [SEP]``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from src.engine.generated import counted, ensure_generated
from src.errors import DataError
from tasks.lm.tokenizer import save_tokenizer

if TYPE_CHECKING:
    from tokenizers import Tokenizer, models

SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")  # ids 0..4 in a vocabulary trained here
PREFIX = "##"  # WordPiece's mark of a piece that continues a word
BERT_FILES = ("tokenizer.json", "vocab.txt")  # BERT's vocabulary, in the order they are looked for
OFFLINE_VOCAB = (
    "the WordPiece vocabulary needs no download: task.tokenizer=wordpiece (the default) trains it offline "
    "on the corpus"
)


class WordPieceTokenizer:
    """A Hugging Face ``tokenizers`` WordPiece with BERT's special tokens.

    Attributes:
        name: ``wordpiece`` (trained here) or ``bert`` (BERT's vocabulary).
        vocab_size: number of ids.
        pad_id, unk_id, cls_id, sep_id, mask_id: the special tokens' ids.
        eot: ``sep_id``, the separator :func:`tasks.lm.cache.cached_tokens` puts after each document.
        fingerprint: a hash of the serialised tokenizer; changes whenever some text's ids would.
    """

    def __init__(self, name: str, tokenizer: Tokenizer) -> None:
        self.name, self.tokenizer = name, tokenizer
        self.vocab_size = tokenizer.get_vocab_size()
        ids = [tokenizer.token_to_id(token) for token in SPECIALS]
        if None in ids:
            missing = [token for token, i in zip(SPECIALS, ids, strict=True) if i is None]
            raise DataError(f"the {name} vocabulary has no {', '.join(missing)}: is it a BERT WordPiece?")
        self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = ids
        self.eot = self.sep_id
        self.fingerprint = hashlib.sha256(self.to_str().encode()).hexdigest()[:12]

    @property
    def special_ids(self) -> tuple[int, ...]:
        """The ids of :data:`SPECIALS`, in that order."""
        return (self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Each text's ids, without special tokens."""
        return [e.ids for e in self.tokenizer.encode_batch(list(texts), add_special_tokens=False)]

    def encode_examples(self, texts: list[tuple[str, ...]], max_len: int) -> list[list[int]]:
        """Fine-tuning inputs: ``[CLS] a [SEP]`` for one text, ``[CLS] a [SEP] b [SEP]`` for a pair,
        at most ``max_len`` ids; a pair too long loses tokens from the end of its longer text
        first (BERT's ``_truncate_seq_pair``; equal lengths: from the second)."""
        if not texts:
            return []
        sizes = {len(example) for example in texts}
        if not sizes <= {1, 2}:
            raise DataError(f"examples must be one or two texts each, got {sorted(sizes)}")
        firsts = self.encode_batch([example[0] for example in texts])
        seconds = iter(self.encode_batch([example[1] for example in texts if len(example) == 2]))
        out = []
        for example, a in zip(texts, firsts, strict=True):
            if len(example) == 1:
                out.append([self.cls_id, *a[: max(0, max_len - 2)], self.sep_id])
                continue
            a, b = truncate_pair(a, next(seconds), max_len - 3)
            out.append([self.cls_id, *a, self.sep_id, *b, self.sep_id])
        return out

    def decode(self, ids: Iterable[int]) -> str:
        """The text of ``ids`` (lowercased, accents stripped: what the normaliser kept)."""
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)

    def to_str(self) -> str:
        """The whole tokenizer as JSON (``tokenizer.json``'s content): what checkpoints carry."""
        return self.tokenizer.to_str()

    @classmethod
    def from_str(cls, text: str, name: str = "wordpiece") -> WordPieceTokenizer:
        """The tokenizer that :meth:`to_str` serialised."""
        from tokenizers import Tokenizer

        return cls(name, Tokenizer.from_str(text))


def truncate_pair(a: list[int], b: list[int], budget: int) -> tuple[list[int], list[int]]:
    """``a`` and ``b`` cut to at most ``budget`` ids together as BERT cuts them: one id at a time
    from the end of the longer (of two equal, from ``b``). In closed form: the longer alone
    shrinks while that suffices, else both end at half the budget (``a`` keeps the odd one)."""
    budget = max(0, budget)
    if len(a) + len(b) <= budget:
        return a, b
    if 2 * min(len(a), len(b)) <= budget:  # the shorter is kept whole
        return (a[: budget - len(b)], b) if len(a) > len(b) else (a, b[: budget - len(a)])
    return a[: (budget + 1) // 2], b[: budget // 2]


def bert_wordpiece(model: models.WordPiece | None = None) -> Tokenizer:
    """A ``tokenizers.Tokenizer`` set up as BERT's uncased one around the WordPiece ``model``:
    BERT's normaliser (clean text, lowercase, strip accents, space around CJK characters), BERT's
    pre-tokenizer (whitespace and punctuation) and the ``##`` decoder."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

    tokenizer = Tokenizer(model if model is not None else models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=True, lowercase=True
    )
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece(prefix=PREFIX)
    return tokenizer


def train_wordpiece(texts: Iterable[str], vocab_size: int, path: Path) -> WordPieceTokenizer:
    """Train a WordPiece of ``vocab_size`` tokens (:data:`SPECIALS` first, ids 0..4) on ``texts``,
    save it to ``path`` (``tokenizer.json``, written under another name and renamed, so that a
    reader never sees half of it) and return it."""
    from tokenizers import trainers

    tokenizer = bert_wordpiece()
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIALS),
        continuing_subword_prefix=PREFIX,
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    save_tokenizer(tokenizer, path)
    return WordPieceTokenizer("wordpiece", tokenizer)


def load_trained_wordpiece(path: Path) -> WordPieceTokenizer:
    """A WordPiece that :func:`train_wordpiece` saved."""
    return WordPieceTokenizer.from_str(Path(path).read_text(encoding="utf-8"), "wordpiece")


def cached_wordpiece(
    path: Path, texts: Callable[[], Iterable[str]], vocab_size: int, source: Any
) -> WordPieceTokenizer:
    """The WordPiece saved at ``path``, trained on ``texts()`` first unless ``trained.json`` beside it
    says it was trained with ``vocab_size`` on ``source`` (the corpus files' fingerprint): once
    however many processes ask, again when the corpus changes (:mod:`src.engine.generated`)."""
    path = Path(path)

    def train() -> None:
        train_wordpiece(counted(texts(), "texts read"), vocab_size, path)

    def damage(saved: dict) -> str | None:
        return None if path.is_file() else f"missing {path}"

    ensure_generated(
        path.with_name("trained.json"),
        {"source": source, "vocab_size": vocab_size},
        train,
        damage,
        what=f"a WordPiece vocabulary of {vocab_size:,} tokens",
        outputs=(path,),
    )
    return load_trained_wordpiece(path)


def bert_vocab_present(folder: Path) -> bool:
    """Whether ``folder`` holds one of :data:`BERT_FILES`."""
    return any((Path(folder) / name).is_file() for name in BERT_FILES)


def load_bert_vocab(folder: Path) -> WordPieceTokenizer:
    """BERT's WordPiece from ``folder``: its ``tokenizer.json`` (which carries its own text
    handling), else its ``vocab.txt`` read as an uncased vocabulary (``bert-base-uncased``);
    a :class:`DataError` naming both and how to get them when neither is there."""
    from tokenizers import Tokenizer, models

    folder = Path(folder)
    if (folder / "tokenizer.json").is_file():
        return WordPieceTokenizer("bert", Tokenizer.from_file(str(folder / "tokenizer.json")))
    if (folder / "vocab.txt").is_file():
        model = models.WordPiece.from_file(str(folder / "vocab.txt"), unk_token="[UNK]")
        return WordPieceTokenizer("bert", bert_wordpiece(model))
    raise DataError(missing_bert_message(folder))


def missing_bert_message(folder: Path, also: bool = False) -> str:
    """Where BERT's vocabulary was looked for, how to get it and the offline alternative: one
    line (``also``: the line added to a missing corpus's message) or two."""
    looked = f"{folder}/tokenizer.json or {folder}/vocab.txt"
    fetch = f"hf download google-bert/bert-base-uncased vocab.txt --local-dir {folder}"
    offline = (
        "offline, task.tokenizer=wordpiece (the default) trains a WordPiece vocabulary on the corpus instead"
    )
    if also:
        return f"BERT's vocabulary is missing too ({looked}): {fetch}; or, {offline}"
    return (
        f"BERT's WordPiece vocabulary (task.tokenizer=bert) is not in {folder}: looked for {looked}\n"
        f"on a machine with internet: {fetch}; {offline}"
    )


def missing_tokenizer_line(kind: str, bert_dir: Path) -> str | None:
    """The line a missing corpus's message gets about the tokenizer ``kind``: that ``wordpiece``
    needs no download, or where BERT's vocabulary is missing too (None: it is there)."""
    if kind == "wordpiece":
        return OFFLINE_VOCAB
    return None if bert_vocab_present(bert_dir) else missing_bert_message(bert_dir, also=True)


def pretrained_tokenizer(task_state: dict[str, Any]) -> WordPieceTokenizer:
    """The tokenizer an ``mlm`` checkpoint carries in its ``task`` entry (:meth:`MaskedLM.state_dict`)."""
    return WordPieceTokenizer.from_str(task_state["tokenizer"], task_state.get("tokenizer_name", "wordpiece"))
