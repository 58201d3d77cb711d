"""Where the text comes from: Hugging Face ``datasets`` copies on disk, and the embedded corpus.

A hub data set is read from either layout a machine without internet can hold, nothing is
fetched (``HF_DATASETS_OFFLINE=1`` is set before ``datasets`` is imported):

* the ``save_to_disk`` layout, ``<root>/<split>/state.json`` beside its ``data-*.arrow``
  files, which ``DatasetDict.save_to_disk(root)`` writes and ``datasets.load_from_disk``
  reads (memory-mapped, no copy);
* parquet files as the hub repositories hold them: ``<root>/<split>-*.parquet``,
  ``<root>/data/<split>-*.parquet`` (TinyStories) or ``<root>/<config>/<split>-*.parquet``
  (WikiText's ``wikitext-103-raw-v1/``), read in record batches by ``pyarrow``.

The embedded corpus of ``lm_char`` is CPython's own documentation: ``pydoc_data/topics.py``,
the text ``help('<topic>')`` prints (about 465 KB of English prose and code snippets in
CPython 3.11), shipped with every CPython installation. Its exact text changes with the
Python version, so the loss figures do too.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from src.errors import DataError


@dataclass(frozen=True)
class HubDataset:
    """A data set of the Hugging Face hub, named for the missing-data message."""

    title: str  # "TinyStories"
    repo: str  # "roneneldan/TinyStories"
    config: str | None = None  # "wikitext-103-raw-v1"


@dataclass
class SplitSource:
    """One split found on disk: its layout and files."""

    kind: Literal["arrow", "parquet"]
    path: Path  # the split folder (arrow) or the folder of the parquet files
    files: list[Path]

    def fingerprint(self) -> list[list]:
        """Names and sizes of the files: changes when the copy on disk is replaced."""
        return [[f.name, f.stat().st_size] for f in self.files]

    def batches(self, column: str = "text", batch_size: int = 1000) -> Iterator[list[str]]:
        """The split's ``column``, in order, ``batch_size`` rows at a time."""
        if self.kind == "arrow":
            os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
            import datasets

            ds = datasets.load_from_disk(str(self.path))
            self._check_column(column, ds.column_names)
            for batch in ds.select_columns([column]).iter(batch_size=batch_size):
                yield batch[column]
            return
        import pyarrow.parquet as pq

        for file in self.files:
            parquet = pq.ParquetFile(file)
            self._check_column(column, parquet.schema_arrow.names, file)
            for batch in parquet.iter_batches(batch_size=batch_size, columns=[column]):
                yield batch.column(0).to_pylist()

    def _check_column(self, column: str, names: list[str], where: Path | None = None) -> None:
        if column not in names:
            raise DataError(f"{where or self.path} has no column {column!r} (columns: {', '.join(names)})")


def find_split(root: Path, split: str, dataset: HubDataset) -> SplitSource:
    """The copy of ``split`` under ``root`` in either layout, or a :class:`DataError` naming
    every path looked at and how to get the data."""
    folders = [root, root / "data"] + ([root / dataset.config] if dataset.config else [])
    for folder in (root, *folders[2:]):
        if (folder / split / "state.json").is_file():
            files = sorted((folder / split).glob("*.arrow"))
            if files:
                return SplitSource("arrow", folder / split, files)
    for folder in folders:
        files = sorted(folder.glob(f"{split}-*.parquet")) or sorted(folder.glob(f"{split}.parquet"))
        if files:
            return SplitSource("parquet", folder, files)
    raise DataError(missing_split_message(root, split, dataset, folders))


def missing_split_message(root: Path, split: str, dataset: HubDataset, folders: list[Path]) -> str:
    """Two lines: the files looked for, then the command that gets them."""
    config = f", {dataset.config!r}" if dataset.config else ""
    parquet = ", ".join(f"{f}/{split}-*.parquet" for f in folders)
    return (
        f"missing {dataset.title} split {split!r}: looked for {root}/{split}/state.json with *.arrow "
        f"(datasets' save_to_disk) and for {parquet} (the hub's {dataset.repo} layout)\n"
        f'get it on a machine with internet: python -c "import datasets; '
        f"datasets.load_dataset('{dataset.repo}'{config}).save_to_disk('{root.name}')\", "
        f"copy {root.name}/ to {root} (or set DATA_DIR to its parent)"
    )


def pydoc_topics_text() -> str:
    """CPython's ``pydoc_data.topics`` (the text of ``help('<topic>')``), topics in name order."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[name].strip("\n") for name in sorted(topics)) + "\n"


def read_text_file(path: Path) -> str:
    """A UTF-8 text file, or a :class:`DataError` naming it."""
    if not path.is_file():
        raise DataError(f"missing text file {path} (task.text_file; a relative path is under paths.data_dir)")
    return path.read_text(encoding="utf-8")
