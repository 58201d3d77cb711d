"""GLUE's nine tasks as they lie on disk: GLUE's own TSV files, or a Hugging Face copy.

:func:`read_split` reads the first of two layouts it finds under ``data_dir``:

1. GLUE's files, ``<data_dir>/glue_data/<Folder>/<split>.tsv``, as GLUE's ``download_glue_data.py``
   writes them, read with ``csv.QUOTE_NONE`` (the texts hold ``"`` and ``'`` that belong to them).
   Their quirks: CoLA's train and dev have no header (source, label, the author's ``*``, sentence);
   MRPC's train and dev begin with a byte-order mark (read as ``utf-8-sig``); MNLI's train has 12
   columns, its two dev sets 16 (five annotators' labels, then the gold one), its tests 10; QQP's
   train holds a few malformed rows, skipped with a warning as Hugging Face and transformers skip them.
2. A copy of the hub's ``nyu-mll/glue`` under ``<data_dir>/glue/<config>/``: ``save_to_disk``'s layout
   (``<split>/state.json``, ``*.arrow``) or the repository's ``<split>-00000-of-00001.parquet``
   (:func:`tasks.lm.corpora.find_split`), with ``validation`` for GLUE's ``dev`` in split names.

Labels are class indices in the hub's order (:attr:`GlueSpec.labels`) whichever layout is read:
GLUE's 0/1 columns are those indices already, its names (``entailment`` …) are looked up. A test
split has no labels (None; the hub's copy writes -1). Every problem is one :class:`DataError`.
"""

from __future__ import annotations

import csv
import math
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from src.errors import ConfigError, DataError
from tasks.lm.corpora import HubDataset, SplitSource, find_split


@dataclass(frozen=True)
class GlueSpec:
    """One GLUE task: its folder in GLUE's files, its config in the hub's copy, its columns there,
    its classes in the hub's order (None: a regression), its dev splits and official metrics, and
    its training examples as the hub's ``nyu-mll/glue`` card counts them (Wang et al., 2019), with
    which a plan counts a recipe's epochs."""

    name: str
    folder: str
    hub_config: str
    text_columns: tuple[str, ...]
    labels: tuple[str, ...] | None
    dev_splits: tuple[str, ...]
    metrics: tuple[str, ...]
    train_size: int

    @property
    def test_splits(self) -> tuple[str, ...]:
        """MNLI's two test sets, or ``("test",)``."""
        return tuple(s.replace("dev", "test") for s in self.dev_splits)

    @property
    def splits(self) -> tuple[str, ...]:
        """Every split :func:`read_split` accepts for this task."""
        return ("train", *self.dev_splits, *self.test_splits)


_PAIR, _ENTAIL, _DEV, _ACC = (
    ("sentence1", "sentence2"),
    ("entailment", "not_entailment"),
    ("dev",),
    ("accuracy",),
)
# fmt: off
SPECS: dict[str, GlueSpec] = {s.name: s for s in (
    GlueSpec("cola", "CoLA", "cola", ("sentence",), ("unacceptable", "acceptable"), _DEV, ("matthews",),
             8_551),
    GlueSpec("sst2", "SST-2", "sst2", ("sentence",), ("negative", "positive"), _DEV, _ACC, 67_349),
    GlueSpec("mrpc", "MRPC", "mrpc", _PAIR, ("not_equivalent", "equivalent"), _DEV, ("accuracy", "f1"),
             3_668),
    GlueSpec("stsb", "STS-B", "stsb", _PAIR, None, _DEV, ("pearson", "spearman"), 5_749),
    GlueSpec("qqp", "QQP", "qqp", ("question1", "question2"), ("not_duplicate", "duplicate"), _DEV,
             ("accuracy", "f1"), 363_846),
    GlueSpec("mnli", "MNLI", "mnli", ("premise", "hypothesis"), ("entailment", "neutral", "contradiction"),
             ("dev_matched", "dev_mismatched"), _ACC, 392_702),
    GlueSpec("qnli", "QNLI", "qnli", ("question", "sentence"), _ENTAIL, _DEV, _ACC, 104_743),
    GlueSpec("rte", "RTE", "rte", _PAIR, _ENTAIL, _DEV, _ACC, 2_490),
    GlueSpec("wnli", "WNLI", "wnli", _PAIR, ("not_entailment", "entailment"), _DEV, _ACC, 635),
)}
# fmt: on

#: Tasks whose GLUE files write the label as 0/1 (the index itself); the others write its name.
NUMERIC_LABELS = frozenset({"cola", "sst2", "mrpc", "qqp", "wnli"})
_MNLI = ("index", "promptID", "pairID", "genre", "sentence1_binary_parse", "sentence2_binary_parse")
_MNLI += ("sentence1_parse", "sentence2_parse", "sentence1", "sentence2")
_MRPC = ("#1 ID", "#2 ID", "#1 String", "#2 String")
_STSB = ("index", "genre", "filename", "year", "old_index", "source1", "source2", "sentence1", "sentence2")
#: GLUE's headers: (train and dev, test); CoLA's train and dev have none.
HEADERS: dict[str, tuple[tuple[str, ...] | None, tuple[str, ...]]] = {
    "cola": (None, ("index", "sentence")),
    "sst2": (("sentence", "label"), ("index", "sentence")),
    "mrpc": (("Quality", *_MRPC), ("index", *_MRPC)),
    "stsb": ((*_STSB, "score"), _STSB),
    "qqp": (
        ("id", "qid1", "qid2", "question1", "question2", "is_duplicate"),
        ("id", "question1", "question2"),
    ),
    "mnli": ((*_MNLI, "label1", "gold_label"), _MNLI),  # dev: label1 … label5, gold_label
    "qnli": (("index", "question", "sentence", "label"), ("index", "question", "sentence")),
    "rte": (("index", *_PAIR, "label"), ("index", *_PAIR)),
    "wnli": (("index", *_PAIR, "label"), ("index", *_PAIR)),
}
_TEXTS = {"cola": ("sentence",), "sst2": ("sentence",), "mrpc": ("#1 String", "#2 String")}
_TEXTS |= {"qqp": ("question1", "question2"), "qnli": ("question", "sentence")}
_COLA = ("source", "label", "annotation", "sentence")
GLUE_SCRIPT = "https://gist.github.com/W4ngatang/60c2bdb54d156a41194446737ce03e2e"


@dataclass
class GlueExamples:
    """One split: a tuple of texts per example, labels (int64 class indices, float32 scores for
    STS-B, None for a test split) and the file(s) read, for messages."""

    texts: list[tuple[str, ...]]
    labels: np.ndarray | None
    source: str


@dataclass(frozen=True)
class Columns:
    """Where a GLUE file keeps what is read: its header (None: none), width, texts and label."""

    header: tuple[str, ...] | None
    names: tuple[str, ...]
    texts: tuple[int, ...]
    label: int | None


def official_columns(spec: GlueSpec, split: str) -> Columns:
    """The columns of GLUE's ``<split>.tsv`` of ``spec``."""
    test = split.startswith("test")
    if spec.name == "cola" and not test:
        return Columns(None, _COLA, (3,), 1)
    header = HEADERS[spec.name][test]
    if spec.name == "mnli" and split.startswith("dev"):
        header = (*_MNLI, *(f"label{i}" for i in range(1, 6)), "gold_label")
    texts = tuple(header.index(n) for n in _TEXTS.get(spec.name, _PAIR))
    return Columns(header, header, texts, None if test else 0 if spec.name == "mrpc" else len(header) - 1)


def read_split(
    data_dir: Path, spec: GlueSpec, split: str, official: str = "glue_data", hub: str = "glue"
) -> GlueExamples:
    """``split`` of ``spec`` from GLUE's files under ``data_dir/official``, else from a hub copy under
    ``data_dir/hub/<config>``; a :class:`DataError` naming both when neither is there."""
    if split not in spec.splits:
        raise ConfigError(f"GLUE {spec.folder} has no split {split!r}; its splits: {', '.join(spec.splits)}")
    folder = Path(data_dir) / official / spec.folder
    if spec.name == "mnli":
        devs = [folder / "dev_matched.tsv", folder / "dev_mismatched.tsv"]
        if sum(p.is_file() for p in devs) == 1:
            missing = next(p for p in devs if not p.is_file())
            raise DataError(
                f"{folder}: MNLI needs both dev sets, dev_matched.tsv and dev_mismatched.tsv, and {missing} "
                "is missing: copy the whole MNLI folder that download_glue_data.py writes (it holds both)"
            )
    if (folder / f"{split}.tsv").is_file():
        return read_official(folder / f"{split}.tsv", spec, split)
    root, hub_split = Path(data_dir) / hub / spec.hub_config, split.replace("dev", "validation")
    try:
        source = find_split(root, hub_split, HubDataset("GLUE", "nyu-mll/glue", None))
    except DataError:
        raise DataError(missing_message(spec, split, folder, root)) from None
    return read_hub(source, spec)


def missing_message(spec: GlueSpec, split: str, folder: Path, root: Path) -> str:
    """Two lines: the places looked at, then the two ways to get the files."""
    hub_split = split.replace("dev", "validation")
    return (
        f"missing GLUE {spec.folder} split {split!r}: looked for {folder / f'{split}.tsv'} (GLUE's files) "
        f"and for {root}/{hub_split}/state.json with *.arrow or {root}/{hub_split}-*.parquet "
        "(a nyu-mll/glue copy)\n"
        f"get them with GLUE's script ({GLUE_SCRIPT}): python download_glue_data.py --data_dir "
        f'{folder.parent} --tasks all; or on a machine with internet: python -c "import datasets; '
        f"datasets.load_dataset('nyu-mll/glue', '{spec.hub_config}').save_to_disk('{spec.hub_config}')\" "
        f"and copy {spec.hub_config}/ to {root}"
    )


def _fix(spec: GlueSpec, path: Path, why: str = "the file is damaged or another task's") -> str:
    """Why the file is unusable and what to do."""
    return f"{why}: get GLUE's {spec.folder}/{path.name} again (download_glue_data.py) or a nyu-mll/glue copy"


def read_official(path: Path, spec: GlueSpec, split: str) -> GlueExamples:
    """GLUE's ``<split>.tsv`` of ``spec`` (its layout: :func:`official_columns`)."""
    columns = official_columns(spec, split)
    texts: list[tuple[str, ...]] = []
    labels: list[float] = []
    malformed: list[tuple[int, int]] = []  # QQP's (line, width)
    with open(path, encoding="utf-8-sig", newline="") as f:
        reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        for number, row in enumerate(r for r in reader if r):
            line = reader.line_num
            if number == 0 and columns.header is not None:
                _check_header(path, line, spec, columns.header, row)
                continue
            if len(row) != len(columns.names):
                if spec.name == "qqp":
                    malformed.append((line, len(row)))
                    continue
                raise DataError(
                    f"{path}:{line}: expected {len(columns.names)} columns ({' '.join(columns.names)}), got "
                    f"{len(row)}{' (CoLA has no header here)' if number == 0 else ''}; {_fix(spec, path)}"
                )
            texts.append(tuple(row[i] for i in columns.texts))
            if columns.label is not None:
                labels.append(official_label(spec, row[columns.label], path, line))
    _check_malformed(path, spec, malformed, len(texts) + len(malformed))
    if not texts:
        raise DataError(f"{path} has no examples (expected GLUE's {spec.folder} rows); {_fix(spec, path)}")
    return GlueExamples(texts, _labels(spec, labels) if columns.label is not None else None, str(path))


def _check_header(path: Path, line: int, spec: GlueSpec, header: tuple[str, ...], row: list[str]) -> None:
    if tuple(row) == header:
        return
    expected, got = "\t".join(header), "\t".join(row)
    raise DataError(
        f"{path}:{line}: expected GLUE's {spec.folder} header of {len(header)} columns, {expected!r}; got "
        f"{len(row)} columns, {got[:200]!r}; {_fix(spec, path, 'the file looks like another task or format')}"
    )


def _check_malformed(path: Path, spec: GlueSpec, malformed: list[tuple[int, int]], rows: int) -> None:
    """QQP's malformed rows: a warning with their count, a DataError when over 0.1% of the rows."""
    if not malformed:
        return
    (line, width), expected = malformed[0], len(official_columns(spec, path.stem).names)
    what = f"{len(malformed)} of {rows} rows have a wrong column count"
    what += f" (the first: line {line}, {width} columns, {expected} wanted)"
    if len(malformed) > rows / 1000:
        raise DataError(
            f"{path}: {what}; {_fix(spec, path, 'QQP has a few such rows, more than 0.1% is not QQP')}"
        )
    warnings.warn(f"{path}: skipped {what}, as Hugging Face's and transformers' readers do", stacklevel=4)


def official_label(spec: GlueSpec, value: str, path: Path, line: int) -> float:
    """The class index (or STS-B's score) that ``value``, GLUE's label at ``path:line``, stands for."""
    if spec.labels is None:
        try:
            score = float(value)
        except ValueError:
            score = math.nan
        if not 0 <= score <= 5:
            raise DataError(f"{path}:{line}: score {value!r} is not a number from 0 to 5; {_fix(spec, path)}")
        return score
    names = ("0", "1") if spec.name in NUMERIC_LABELS else spec.labels
    if value not in names:
        allowed = f"{', '.join(names)} (GLUE {spec.folder}'s labels)"
        raise DataError(f"{path}:{line}: label {value!r} is not one of {allowed}; {_fix(spec, path)}")
    return names.index(value)


def _labels(spec: GlueSpec, values: list) -> np.ndarray:
    return np.asarray(values, dtype=np.float32 if spec.labels is None else np.int64)


def read_hub(source: SplitSource, spec: GlueSpec) -> GlueExamples:
    """One split of a nyu-mll/glue copy; labels of -1 throughout (a test split) are None."""
    where = str(source.path) if source.kind == "arrow" else ", ".join(map(str, source.files))
    if source.kind == "arrow":
        os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
        import datasets

        names = datasets.load_from_disk(str(source.path)).column_names
    else:
        names = pq.ParquetFile(source.files[0]).schema_arrow.names
    wanted = [*spec.text_columns, "label"]
    missing = [c for c in wanted if c not in names]
    if missing:
        raise DataError(
            f"{where} has no column {', '.join(missing)} (its columns: {', '.join(names)}); nyu-mll/glue's "
            f"{spec.hub_config!r} has {', '.join(wanted)}: copy that config there (another task's copy?)"
        )
    data = {c: [v for batch in source.batches(c) for v in batch] for c in wanted}
    texts = list(zip(*(data[c] for c in spec.text_columns), strict=True))
    if not texts:
        raise DataError(f"{where} has no rows; copy nyu-mll/glue's {spec.hub_config!r} there again")
    for row, values in enumerate(texts):
        if not all(isinstance(v, str) for v in values):
            raise DataError(f"{where}: row {row} has a text that is not a string: {values!r}")
    labels = data["label"]
    if all(v == -1 for v in labels):
        return GlueExamples(texts, None, where)
    size = len(spec.labels) if spec.labels is not None else None
    for row, value in enumerate(labels):
        if not (0 <= value <= 5 if size is None else value in range(size)):
            allowed = "a score from 0 to 5" if size is None else f"0 to {size - 1} ({', '.join(spec.labels)})"
            raise DataError(
                f"{where}: row {row}: label {value!r} is not {allowed}; copy nyu-mll/glue's data again"
            )
    return GlueExamples(texts, _labels(spec, labels), where)
