"""Tokenizers for the language-modelling tasks, all offline.

* ``gpt2``: GPT-2's byte-level BPE (50,257 tokens, ``<|endoftext|>`` = 50256), what P3 and P4
  train with, read from its released files under ``${paths.data_dir}/tokenizers/gpt2/``:
  ``vocab.json`` + ``merges.txt`` (the Hugging Face repository ``openai-community/gpt2``),
  ``encoder.json`` + ``vocab.bpe`` (OpenAI's release, the same two files under other names),
  or a ``tokenizer.json``. No package installable here ships these files (tiktoken downloads
  them at first use), so they must be copied in; without them the run stops and says so.
* ``bpe``: a byte-level BPE of the same kind trained offline by Hugging Face ``tokenizers`` on
  the training split (``bpe_vocab_size`` tokens, ``<|endoftext|>`` included), saved under the
  cache folder and reused. Its losses are not comparable with GPT-2's.
* ``bytes``: UTF-8 bytes, 256 tokens; the embedded task's tokenizer (nothing to fetch or train).

All three round-trip: ``decode(encode(text)) == text`` for any text (byte-level).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

from src.engine.record import atomic
from src.errors import DataError

EOT = "<|endoftext|>"

#: GPT-2's vocabulary, 50,257 tokens (its released ``encoder.json``), what a plan sizes the model with
GPT2_VOCAB = 50_257
# The file pairs GPT-2's BPE is released as, in the order they are looked for.
GPT2_FILES = (("vocab.json", "merges.txt"), ("encoder.json", "vocab.bpe"))


class TextTokenizer(Protocol):
    name: str
    vocab_size: int
    eot: int | None  # the document separator's id, or None where there is none
    fingerprint: str  # changes whenever the token ids of some text would

    def encode_batch(self, texts: list[str]) -> list[list[int]]: ...

    def decode(self, ids: Iterable[int]) -> str: ...


class ByteTokenizer:
    """UTF-8 bytes as tokens: 256 ids, no separator."""

    name, vocab_size, eot, fingerprint = "bytes", 256, None, "utf8"

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [list(t.encode("utf-8")) for t in texts]

    def decode(self, ids: Iterable[int]) -> str:
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")


class BPETokenizer:
    """A Hugging Face ``tokenizers`` byte-level BPE (GPT-2's or one trained here)."""

    def __init__(self, name: str, tokenizer) -> None:
        self.name, self.tokenizer = name, tokenizer
        self.vocab_size = tokenizer.get_vocab_size()
        self.eot = tokenizer.token_to_id(EOT)
        self.fingerprint = hashlib.sha256(tokenizer.to_str().encode()).hexdigest()[:12]

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self.tokenizer.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)


def byte_level_bpe(model=None):
    """A ``tokenizers.Tokenizer`` set up as GPT-2's: byte-level pre-tokenizer (GPT-2's split
    pattern, no prefix space) and decoder around the BPE ``model``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    tokenizer = Tokenizer(model if model is not None else models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def gpt2_files_present(folder: Path) -> bool:
    folder = Path(folder)
    pairs = any((folder / a).is_file() and (folder / b).is_file() for a, b in GPT2_FILES)
    return pairs or (folder / "tokenizer.json").is_file()


def load_gpt2(folder: Path) -> BPETokenizer:
    """GPT-2's BPE from its released files in ``folder``; a :class:`DataError` naming them if absent."""
    from tokenizers import Tokenizer, models

    folder = Path(folder)
    for vocab, merges in GPT2_FILES:
        if (folder / vocab).is_file() and (folder / merges).is_file():
            tokenizer = byte_level_bpe(models.BPE.from_file(str(folder / vocab), str(folder / merges)))
            break
    else:
        if not (folder / "tokenizer.json").is_file():
            raise DataError(missing_gpt2_message(folder))
        tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    bpe = BPETokenizer("gpt2", tokenizer)
    if bpe.eot is None:
        raise DataError(f"{folder}: the GPT-2 vocabulary has no {EOT} token; are these GPT-2's files?")
    return bpe


def missing_gpt2_message(folder: Path, also: bool = False) -> str:
    """Where GPT-2's BPE files were looked for and how to get them: two lines, or one when
    ``also`` (the line added to a missing data set's message)."""
    looked = f"{folder}/vocab.json + merges.txt, {folder}/encoder.json + vocab.bpe or {folder}/tokenizer.json"
    fetch = f"hf download openai-community/gpt2 vocab.json merges.txt --local-dir {folder}"
    if also:
        return f"GPT-2's BPE files are missing too ({looked}): {fetch}, or offline task.tokenizer=bpe"
    return (
        f"GPT-2's BPE files are not in {folder}: looked for {looked}. "
        "No package installable offline ships them\n"
        f"on a machine with internet: {fetch} (or OpenAI's encoder.json and vocab.bpe from "
        "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/); offline: task.tokenizer=bpe "
        "trains a BPE of the same size on the training split (not GPT-2's vocabulary, nor its losses)"
    )


def train_bpe(texts: Iterable[str], vocab_size: int, path: Path) -> BPETokenizer:
    """Train a byte-level BPE of ``vocab_size`` tokens (``<|endoftext|>`` first) on ``texts``,
    save it to ``path`` (``tokenizer.json``) and return it."""
    from tokenizers import pre_tokenizers, trainers

    tokenizer = byte_level_bpe()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    save_tokenizer(tokenizer, path)
    return BPETokenizer("bpe", tokenizer)


def save_tokenizer(tokenizer, path: Path) -> None:
    """A ``tokenizers.Tokenizer`` saved to ``path`` whole (:func:`atomic.write_text`, the bytes
    ``Tokenizer.save`` writes): concurrent runs never collide, and a reader never sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_text(path, tokenizer.to_str(pretty=True))


def load_trained_bpe(path: Path) -> BPETokenizer:
    from tokenizers import Tokenizer

    return BPETokenizer("bpe", Tokenizer.from_file(str(path)))
