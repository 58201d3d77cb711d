"""Small GLUE files of all nine tasks, for the reader's tests: GLUE's own layout and the hub's parquet one.

The official files are written here from the layouts ``download_glue_data.py`` produces, not through
``tasks.glue``: CoLA's train and dev without a header (source, label, ``*`` for the unacceptable,
sentence); MRPC's train and dev headers after a byte-order mark; STS-B's scores as ``3.800``; MNLI's
12 columns in train, 16 in both dev sets (five annotators, then the gold label, which the annotators
do not always agree with here, so that reading the wrong column shows) and 10 in the tests; texts
with ``"`` and ``'``; SST-2's sentences with GLUE's trailing space.

``ROWS[task][split]`` is what each file holds, as the reader should return it: ``(texts, label)`` with
the label the hub's index (a float score for STS-B; None in a test split). Labels cycle through every
class, so that each class name and number is read at least once.
"""

from __future__ import annotations

from pathlib import Path

#: task: (GLUE's folder, the hub copy's text columns, the hub's class names in index order)
TASKS: dict[str, tuple[str, tuple[str, ...], tuple[str, ...] | None]] = {
    "cola": ("CoLA", ("sentence",), ("unacceptable", "acceptable")),
    "sst2": ("SST-2", ("sentence",), ("negative", "positive")),
    "mrpc": ("MRPC", ("sentence1", "sentence2"), ("not_equivalent", "equivalent")),
    "stsb": ("STS-B", ("sentence1", "sentence2"), None),
    "qqp": ("QQP", ("question1", "question2"), ("not_duplicate", "duplicate")),
    "mnli": ("MNLI", ("premise", "hypothesis"), ("entailment", "neutral", "contradiction")),
    "qnli": ("QNLI", ("question", "sentence"), ("entailment", "not_entailment")),
    "rte": ("RTE", ("sentence1", "sentence2"), ("entailment", "not_entailment")),
    "wnli": ("WNLI", ("sentence1", "sentence2"), ("not_entailment", "entailment")),
}
#: Tasks whose GLUE files hold the label as 0/1 rather than its name.
NUMERIC = {"cola", "sst2", "mrpc", "qqp", "wnli"}
POOL = (
    'the cat said "hello" to the dog .',
    "it 's a charming and often affecting journey . ",
    'John\'s "new" book, which Mary read, was excellent.',
    "'Twas brillig, and the slithy toves did gyre",
    'He asked: "is it raining?" and left',
    "What is the boy 's favourite kite ?",
    "a \"quoted\" word and an 'apostrophe'",
    'Why do actors say "break a leg"?',
    "the 5\" screen isn't bright",
    "nothing special here at all",
    'Mary thinks that "John left"',
    '"Hold the door," said the man .',
    '" the film is " \'s worth a look',  # an unbalanced quote: csv's quoting would swallow lines
)
MNLI_STUB = ("( ( the cat ) sat )", "( ( a dog ) ran )", "(ROOT (S (NP the cat) (VP sat)))", "(ROOT (S ran))")


def splits(task: str) -> dict[str, str]:
    """GLUE's split names of ``task`` and the hub's name of each."""
    if task == "mnli":
        names = ("train", "dev_matched", "dev_mismatched", "test_matched", "test_mismatched")
    else:
        names = ("train", "dev", "test")
    return {name: name.replace("dev", "validation") for name in names}


def make_rows(task: str, split: str) -> list[tuple[tuple[str, ...], int | float | None]]:
    """6 to 10 examples of ``task``'s ``split``: texts drawn from :data:`POOL`, labels cycling."""
    _, columns, labels = TASKS[task]
    count = 10 if split == "train" else 6 + list(splits(task)).index(split) % 3
    offset = sum(map(ord, task + split))
    rows = []
    for i in range(count):
        texts = tuple(POOL[(offset + 3 * i + 5 * j) % len(POOL)] for j in range(len(columns)))
        if split.startswith("test"):
            label = None
        else:
            label = round((offset + 7 * i) % 26 / 5, 1) if labels is None else (offset + i) % len(labels)
        rows.append((texts, label))
    return rows


ROWS = {task: {split: make_rows(task, split) for split in splits(task)} for task in TASKS}


def _label(task: str, label: int | float) -> str:
    """The label as GLUE's file writes it."""
    names = TASKS[task][2]
    if names is None:
        return f"{label:.3f}"
    return str(label) if task in NUMERIC else names[label]


def official_cells(task: str, split: str, i: int, texts: tuple[str, ...], label) -> list[str]:
    """Row ``i`` of GLUE's ``<split>.tsv`` of ``task``, cell by cell."""
    test, (a, b) = split.startswith("test"), (texts[0], texts[-1])
    tail = [] if test else [_label(task, label)]
    if task == "cola":
        return [str(i), a] if test else [f"gj0{i}", tail[0], "" if label else "*", a]
    if task == "sst2":
        return [str(i), a] if test else [a, *tail]
    if task == "mrpc":
        return [str(i) if test else tail[0], f"{1000 + i}", f"{2000 + i}", a, b]
    if task == "stsb":
        return [str(i), "main-captions", "MSRvid", "2012test", f"{i:04d}", "none", "none", a, b, *tail]
    if task == "qqp":
        return [str(i), a, b] if test else [str(i), str(2 * i + 1), str(2 * i + 2), a, b, *tail]
    if task == "mnli":
        front = [str(i), f"{31193 + i}", f"{31193 + i}n", "fiction", *MNLI_STUB, a, b]
        if test:
            return front
        other = TASKS["mnli"][2][(label + 1) % 3]  # an annotator who disagrees with the gold label
        annotators = (
            [tail[0], other, tail[0], other, tail[0]] if "dev" in split else [other if i == 0 else tail[0]]
        )
        return [*front, *annotators, *tail]
    return [str(i), a, b, *tail]  # QNLI, RTE, WNLI


def official_header(task: str, split: str) -> str | None:
    """GLUE's header line of ``task``'s ``split`` (None: CoLA's train and dev have none)."""
    test = split.startswith("test")
    mrpc, pair = "#1 ID\t#2 ID\t#1 String\t#2 String", "index\tsentence1\tsentence2"
    stsb = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2"
    mnli = "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\t"
    mnli += "sentence1_parse\tsentence2_parse\tsentence1\tsentence2"
    labelled, unlabelled = {
        "cola": (None, "index\tsentence"),
        "sst2": ("sentence\tlabel", "index\tsentence"),
        "mrpc": (f"\ufeffQuality\t{mrpc}", f"index\t{mrpc}"),  # the MSR file's byte-order mark
        "stsb": (f"{stsb}\tscore", stsb),
        "qqp": ("id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate", "id\tquestion1\tquestion2"),
        "mnli": (mnli + ("\tlabel1\tlabel2\tlabel3\tlabel4\tlabel5" if "dev" in split else "\tlabel1"), mnli),
        "qnli": ("index\tquestion\tsentence\tlabel", "index\tquestion\tsentence"),
    }.get(task, (f"{pair}\tlabel", pair))
    if task == "mnli" and not test:
        labelled += "\tgold_label"
    return unlabelled if test else labelled


def official_lines(task: str, split: str, rows: list) -> list[str]:
    """The lines of GLUE's ``<split>.tsv`` of ``task`` holding ``rows``, the header first (if any)."""
    header = official_header(task, split)
    lines = ["\t".join(official_cells(task, split, i, texts, label)) for i, (texts, label) in enumerate(rows)]
    return ([header] if header is not None else []) + lines


def write_lines(path: Path, lines: list[str]) -> Path:
    """``lines``, each ending in a newline, as UTF-8 (a BOM in the first line is written as it is)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def write_official(data_dir: Path, tasks: tuple[str, ...] = tuple(TASKS), folder: str = "glue_data") -> Path:
    """GLUE's files of ``tasks`` (every split of :data:`ROWS`) under ``data_dir/folder``; returns that."""
    root = Path(data_dir) / folder
    for task in tasks:
        for split, rows in ROWS[task].items():
            write_lines(root / TASKS[task][0] / f"{split}.tsv", official_lines(task, split, rows))
    return root


def write_hub_parquet(data_dir: Path, task: str, split: str, rows: list, hub: str = "glue") -> Path:
    """``rows`` as the nyu-mll/glue repository holds ``task``'s ``split`` (GLUE's split name):
    ``data_dir/hub/<task>/<hub split>-00000-of-00001.parquet`` with the text columns, ``label`` (-1 in
    a test split, float32 for STS-B) and ``idx``; returns the file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    _, columns, labels = TASKS[task]
    table = {name: [texts[j] for texts, _ in rows] for j, name in enumerate(columns)}
    values = [-1 if label is None else label for _, label in rows]
    table["label"] = pa.array(values, pa.float32() if labels is None else pa.int64())
    table["idx"] = list(range(len(rows)))
    path = Path(data_dir) / hub / task / f"{splits(task)[split]}-00000-of-00001.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(table), path)
    return path


def write_hub(data_dir: Path, tasks: tuple[str, ...] = tuple(TASKS)) -> Path:
    """Every split of :data:`ROWS` of ``tasks`` in the hub's parquet layout; returns ``data_dir/glue``."""
    for task in tasks:
        for split, rows in ROWS[task].items():
            write_hub_parquet(data_dir, task, split, rows)
    return Path(data_dir) / "glue"
