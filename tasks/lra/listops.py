"""ListOps (Nangia & Bowman, 2018) as LRA releases it: the generator, the TSV files, the tokens.

The release holds ``listops-1000/basic_{train,val,test}.tsv``: a header ``Source\\tTarget``,
then one expression and its value per row. An expression is a tree of operators over
digits, written with the generator's binary bracketing, e.g. for ``[MAX 2 9 ]``::

    ( ( ( [MAX 2 ) 9 ) ] )

Operators are ``[MIN``, ``[MAX``, ``[MED`` (median, rounded down) and ``[SM`` (sum modulo
10); ``]`` closes one; the value is a digit, so 10 classes.

Tokens, as LRA's input pipeline makes them (``lra_benchmarks/listops/input_pipeline.py``):
the parentheses are dropped, ``]`` is a token, the rest split on whitespace, ids from 1
with 0 for padding, truncated to ``max_length`` (2000). ``keep_parens=True`` keeps ``(``
and ``)`` as tokens instead. The token count of an expression is the ``length`` the
generator bounds (operators, digits and ``]``).

The generator follows LRA's ``lra_benchmarks/data/listops.py``: a node is a digit with
probability ``1 − VALUE_P`` (always at ``max_depth``), otherwise an operator over 2 to
``max_args`` sub-trees; trees whose length lies strictly between ``min_length`` and
``max_length`` are kept, duplicates dropped, then split in order into train, val and test.
"""

from __future__ import annotations

import csv
import io
import math
import random
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from src.engine.record import atomic
from src.errors import DataError

MIN, MAX, MED, SUM_MOD, END = "[MIN", "[MAX", "[MED", "[SM", "]"
OPERATORS = (MIN, MAX, MED, SUM_MOD)
VALUE_P = 0.25  # LRA's probability that a node below max_depth is an operator

#: Token ids: 0 is padding, then the operators, ``]`` and the digits; unknown tokens get the
#: last id (TokenTextEncoder's out-of-vocabulary id).
VOCAB = ("<pad>", *OPERATORS, END, *(str(d) for d in range(10)), "(", ")")
TOKEN_IDS = {tok: i for i, tok in enumerate(VOCAB)}
OOV_ID = len(VOCAB)
VOCAB_SIZE = len(VOCAB) + 1

SPLITS = {"train": "basic_train.tsv", "val": "basic_val.tsv", "test": "basic_test.tsv"}
RELEASE_HINT = (
    "the official LRA release (https://storage.googleapis.com/long-range-arena/lra_release.gz) "
    "puts them in lra_release/listops-1000/; set paths.data_dir to the folder that holds listops-1000/, "
    "or generate a set in the same format with `python -m tasks.lra.generate listops <folder>`"
)


# -- the generator -------------------------------------------------------------------------

Tree = int | tuple  # a digit, or (left, right) in the generator's binary bracketing


def generate_tree(
    rng: random.Random, depth: int, max_depth: int, max_args: int, budget: float = math.inf
) -> tuple[Tree | None, int]:
    """A random expression and its length (operators, digits and closing brackets).

    Generation stops early, returning ``(None, length)``, once the length exceeds
    ``budget``: a tree that long would be rejected anyway, and the supercritical branching
    of LRA's grammar (an operator has 6 arguments on average) makes such trees huge.
    """
    if depth >= max_depth or rng.random() > VALUE_P:
        return rng.randrange(10), 1
    length, args = 2, []
    for _ in range(rng.randint(2, max_args)):
        sub, sub_length = generate_tree(rng, depth + 1, max_depth, max_args, budget - length)
        length += sub_length
        if sub is None or length > budget:
            return None, length
        args.append(sub)
    tree: Tree = (rng.choice(OPERATORS), args[0])
    for arg in args[1:]:
        tree = (tree, arg)
    return (tree, END), length


def to_string(tree: Tree) -> str:
    """The release's text of a tree: every pair in parentheses, tokens separated by spaces."""
    if isinstance(tree, tuple):
        return f"( {to_string(tree[0])} {to_string(tree[1])} )"
    return str(tree)


def evaluate(tree: Tree) -> int:
    """The value of a generated tree."""
    operator, args = _collect(tree)
    if operator is None:
        return int(tree)  # type: ignore[arg-type]
    values = [evaluate(a) for a in args]
    return apply_operator(operator, values)


def _collect(tree: Tree) -> tuple[str | None, list[Tree]]:
    """``(operator, arguments)`` of an operator node ``((((op, a1), a2), …), END)``."""
    if not isinstance(tree, tuple):
        return None, []
    node, args = tree[0], []  # tree[1] is END
    while isinstance(node, tuple):
        node, arg = node
        args.append(arg)
    return node, args[::-1]


def apply_operator(operator: str, values: list[int]) -> int:
    if operator == MIN:
        return min(values)
    if operator == MAX:
        return max(values)
    if operator == MED:
        return int(statistics.median(values))
    return sum(values) % 10


@dataclass(frozen=True)
class ListOpsSpec:
    """What to generate: LRA's defaults are 96000/2000/2000 examples, lengths 500-2000."""

    num_train: int = 96_000
    num_val: int = 2_000
    num_test: int = 2_000
    min_length: int = 500
    max_length: int = 2_000
    max_depth: int = 10
    max_args: int = 10
    seed: int = 0


def generate(spec: ListOpsSpec) -> dict[str, list[tuple[str, int]]]:
    """``{split: [(source, target), …]}``: distinct expressions, split in order of generation."""
    rng, seen = random.Random(spec.seed), {}
    total = spec.num_train + spec.num_val + spec.num_test
    while len(seen) < total:
        tree, length = generate_tree(rng, 1, spec.max_depth, spec.max_args, budget=spec.max_length)
        if tree is not None and spec.min_length < length < spec.max_length:
            source = to_string(tree)
            if source not in seen:
                seen[source] = evaluate(tree)
    rows = list(seen.items())
    cut = (spec.num_train, spec.num_train + spec.num_val)
    return {"train": rows[: cut[0]], "val": rows[cut[0] : cut[1]], "test": rows[cut[1] :]}


def write_release(folder: Path, splits: dict[str, list[tuple[str, int]]]) -> None:
    """Write ``basic_{train,val,test}.tsv`` into ``folder`` atomically (a concurrent reader
    sees either no file or a complete one)."""
    folder.mkdir(parents=True, exist_ok=True)
    for split, rows in splits.items():
        text = io.StringIO(newline="")
        writer = csv.writer(text, delimiter="\t", lineterminator="\n")
        writer.writerow(["Source", "Target"])
        writer.writerows(rows)
        atomic.write_text(folder / SPLITS[split], text.getvalue())  # a crash never leaves a torn file


# -- reading the release ---------------------------------------------------------------------


def read_split(folder: Path, split: str) -> list[tuple[str, int]]:
    """``[(source, target), …]`` of ``basic_<split>.tsv``; one clear error if it is missing or bad."""
    path = Path(folder) / SPLITS[split]
    if not path.is_file():
        raise DataError(f"missing ListOps file {path}: {RELEASE_HINT}")
    with open(path, newline="") as f:
        reader = csv.reader(f, delimiter="\t")
        header = next(reader, None)
        if header is None or [h.strip() for h in header[:2]] != ["Source", "Target"]:
            raise DataError(
                f"{path}: expected a header 'Source<TAB>Target' (the release's TSV), got {header}"
            )
        try:
            rows = [(row[0], int(row[1])) for row in reader if row]
        except (IndexError, ValueError) as e:
            raise DataError(f"{path}: every row must be '<expression><TAB><digit>' ({e})") from e
    if not rows:
        raise DataError(f"{path} holds no examples")
    return rows


def tokenize(source: str, max_length: int, keep_parens: bool = False) -> np.ndarray:
    """Token ids of one expression, truncated to ``max_length``; ``int16`` ``(L,)``."""
    tokens: Iterable[str] = source.split()
    if not keep_parens:
        tokens = (t for t in tokens if t not in "()")
    ids = [TOKEN_IDS.get(t, OOV_ID) for t in tokens]
    return np.asarray(ids[:max_length], dtype=np.int16)
