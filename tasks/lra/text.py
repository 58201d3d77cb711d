"""Byte-level text for LRA: IMDB reviews (Text) and ACL Anthology paper pairs (Retrieval).

Tokens, as LRA's ``ByteTextEncoder`` makes them: the UTF-8 bytes of the text, each ``b``
becoming id ``b + 1`` (0 is padding), so the vocabulary has 257 ids; truncated to
``max_length`` (Text 4096 here, Retrieval 4000 per document).

IMDB (50,000 reviews, labels 0 negative / 1 positive), any of:

* the Stanford release ``aclImdb/{train,test}/{neg,pos}/*.txt``;
* a Hugging Face ``imdb`` copy under ``imdb/``: ``save_to_disk`` output
  (``dataset_dict.json``) or the hub's parquet files (``plain_text/{train,test}-*.parquet``).

LRA trains on the 25,000 training reviews and evaluates on the 25,000 test reviews (it has
no separate validation split; ``val`` is ``test``).

Retrieval: the release's ``tsv_data/new_aan_pairs.{train,eval,test}.tsv``, tab-separated
without a header: ``label, id1, id2, text1, text2`` (label 1 when one paper cites the
other), read as LRA does (no quoting).
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import numpy as np

from src.errors import DataError

BYTE_VOCAB_SIZE = 257  # 256 bytes shifted by one, 0 for padding

IMDB_HINT = (
    "IMDB is read from the Stanford release aclImdb/{train,test}/{neg,pos}/*.txt "
    "(https://ai.stanford.edu/~amaas/data/sentiment/aclImdb_v1.tar.gz, unpacked), or from a Hugging Face "
    "copy of `imdb` under imdb/ (save_to_disk output, or the hub's plain_text/{train,test}-*.parquet); "
    "set paths.data_dir to the folder that holds it"
)
AAN_FILES = {
    "train": "new_aan_pairs.train.tsv",
    "val": "new_aan_pairs.eval.tsv",
    "test": "new_aan_pairs.test.tsv",
}
AAN_HINT = (
    "the official LRA release (https://storage.googleapis.com/long-range-arena/lra_release.gz) puts "
    "new_aan_pairs.{train,eval,test}.tsv in lra_release/tsv_data/; set paths.data_dir to the folder that "
    "holds tsv_data/"
)


def encode_bytes(text: str, max_length: int) -> np.ndarray:
    """Byte ids (``byte + 1``) of ``text``, truncated to ``max_length``; ``int16`` ``(L,)``."""
    raw = np.frombuffer(text.encode("utf-8")[:max_length], dtype=np.uint8)
    return raw.astype(np.int16) + 1


# -- IMDB ----------------------------------------------------------------------------------


def read_imdb(root: Path, split: str) -> tuple[list[str], list[int]]:
    """Texts and labels of IMDB's ``train`` or ``test`` split under ``root``."""
    if (root / "aclImdb").is_dir():
        return _read_acl_imdb(root / "aclImdb", split)
    if (root / "imdb").is_dir():
        return _read_hf_imdb(root / "imdb", split)
    raise DataError(
        f"no IMDB data under {root} (looked for {root / 'aclImdb'} and {root / 'imdb'}): {IMDB_HINT}"
    )


def _read_acl_imdb(folder: Path, split: str) -> tuple[list[str], list[int]]:
    texts, labels = [], []
    for label, polarity in enumerate(("neg", "pos")):
        files = sorted((folder / split / polarity).glob("*.txt"))
        if not files:
            raise DataError(f"no reviews in {folder / split / polarity}: {IMDB_HINT}")
        texts += [f.read_text(encoding="utf-8") for f in files]
        labels += [label] * len(files)
    return texts, labels


def _read_hf_imdb(folder: Path, split: str) -> tuple[list[str], list[int]]:
    if (folder / "dataset_dict.json").is_file():
        import datasets

        table = datasets.load_from_disk(str(folder))[split]
        columns = {name: table[name] for name in table.column_names}
    else:
        import pyarrow.parquet as pq

        files = sorted(folder.glob(f"**/{split}-*.parquet"))
        if not files:
            raise DataError(
                f"{folder}: neither dataset_dict.json (save_to_disk) nor {split}-*.parquet files: {IMDB_HINT}"
            )
        tables = [pq.read_table(f).to_pydict() for f in files]
        columns = {name: [x for t in tables for x in t[name]] for name in tables[0]}
    if not {"text", "label"} <= set(columns):
        raise DataError(f"{folder}: the {split} split needs columns text and label, has {sorted(columns)}")
    return list(columns["text"]), [int(x) for x in columns["label"]]


# -- AAN retrieval ---------------------------------------------------------------------------


def read_aan(folder: Path, split: str) -> tuple[list[str], list[str], list[int]]:
    """``(texts1, texts2, labels)`` of one split of the AAN pairs."""
    path = Path(folder) / AAN_FILES[split]
    if not path.is_file():
        raise DataError(f"missing retrieval file {path}: {AAN_HINT}")
    csv.field_size_limit(sys.maxsize)
    first, second, labels = [], [], []
    with open(path, newline="", encoding="utf-8") as f:
        for line, row in enumerate(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE), start=1):
            if not row:
                continue
            if len(row) < 5:
                raise DataError(
                    f"{path}:{line}: expected 5 tab-separated fields (label, id1, id2, text1, text2)"
                )
            try:
                label = int(float(row[0]))
            except ValueError:
                if line == 1:  # a header row
                    continue
                raise DataError(f"{path}:{line}: label {row[0]!r} is not a number") from None
            first.append(row[3])
            second.append(row[4])
            labels.append(label)
    if not labels:
        raise DataError(f"{path} holds no pairs")
    return first, second, labels
