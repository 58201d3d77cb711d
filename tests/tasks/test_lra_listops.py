"""ListOps: the generator against an independent evaluator, the release's TSV round trip,
LRA's tokens, generation on first use, and the missing-file message."""

from __future__ import annotations

import csv
import json

import pytest
import torch
from smoke.lra import write_listops

from src.errors import DataError
from tasks.lra import ListOps, ListOpsSmall, listops

COMMON = dict(input="sequence", num_classes=10, batch_size=4, eval_batch_size=4)


def median_rounded_down(values: list[int]) -> int:
    s = sorted(values)
    return (s[(len(s) - 1) // 2] + s[len(s) // 2]) // 2


INDEPENDENT = {"[MIN": min, "[MAX": max, "[MED": median_rounded_down, "[SM": lambda v: sum(v) % 10}


def parse(source: str) -> tuple[int, int, int, int]:
    """An evaluator written from ListOps' definition alone, reading the release's text:
    ``(value, depth, fewest arguments, most arguments)`` of one expression."""
    stack: list[list] = [[]]
    depth = fewest = most = 0
    fewest = 10**9
    for token in source.split():
        if token in "()":
            continue
        if token.startswith("["):
            stack.append([token])
            depth = max(depth, len(stack) - 1)
        elif token == "]":
            operator, *args = stack.pop()
            fewest, most = min(fewest, len(args)), max(most, len(args))
            stack[-1].append(INDEPENDENT[operator](args))
        else:
            stack[-1].append(int(token))
    (value,) = stack[0]
    return value, depth, fewest, most


def test_generated_targets_are_the_values_of_the_expressions(tmp_path):
    spec = listops.ListOpsSpec(num_train=300, num_val=50, num_test=50, min_length=20, max_length=120, seed=3)
    listops.write_release(tmp_path, listops.generate(spec))
    rows = [row for split in ("train", "val", "test") for row in listops.read_split(tmp_path, split)]
    assert len(rows) == len({source for source, _ in rows}) == 400  # distinct expressions
    for source, target in rows:
        value, depth, fewest, most = parse(source)
        assert target == value
        assert 1 <= depth < spec.max_depth and 2 <= fewest and most <= spec.max_args
        length = sum(t not in "()" for t in source.split())
        assert spec.min_length < length < spec.max_length
    targets = {t for _, t in rows}
    assert targets == set(range(10))  # every class occurs


def test_the_file_is_the_release_format(tmp_path):
    write_listops(tmp_path, 3, 2, 2)
    with open(tmp_path / "basic_train.tsv", newline="") as f:
        rows = list(csv.reader(f, delimiter="\t"))
    assert rows[0] == ["Source", "Target"] and len(rows) == 4
    source, target = rows[1]
    assert source.startswith("( ") and source.endswith(" )") and target.isdigit()
    assert set(source.split()) <= {"(", ")", "]", "[MIN", "[MAX", "[MED", "[SM", *"0123456789"}


def test_tokens_are_lras(tmp_path):
    source = "( ( ( ( [MAX 2 ) 9 ) ( ( ( [SM 4 ) 7 ) ] ) ) ] )"
    ids = listops.tokenize(source, max_length=100)
    expected = ["[MAX", "2", "9", "[SM", "4", "7", "]", "]"]
    assert ids.tolist() == [listops.TOKEN_IDS[t] for t in expected]
    assert listops.tokenize(source, max_length=3).tolist() == ids[:3].tolist()
    with_parens = listops.tokenize(source, 100, keep_parens=True)
    assert len(with_parens) == len(source.split()) and listops.TOKEN_IDS["("] in with_parens.tolist()
    assert listops.tokenize("[FIRST 1 ]", 10)[0] == listops.OOV_ID
    assert 0 not in ids and max(listops.TOKEN_IDS.values()) < listops.OOV_ID < listops.VOCAB_SIZE


def test_the_task_reads_the_release_into_padded_batches(tmp_path):
    splits = write_listops(tmp_path / "listops-1000", 6, 4, 4)
    task = ListOps(name="lra_listops", folder="listops-1000", max_length=40, pad_length=48, **COMMON)
    train, val = task.datasets(tmp_path)
    assert len(train) == 6 and len(val) == 4
    tokens, mask, labels = task.collate_fn([train[i] for i in range(4)])
    assert tokens.shape == mask.shape == (4, 48) and tokens.dtype == torch.long and mask.dtype == torch.bool
    for row, (source, target) in enumerate(splits["train"][:4]):
        expected = listops.tokenize(source, 40)
        assert mask[row].sum() == len(expected) and tokens[row, : len(expected)].tolist() == expected.tolist()
        assert (tokens[row][~mask[row]] == 0).all() and labels[row] == target
    assert task.model_inputs((tokens, mask, labels)) == (tokens, mask)
    test_task = ListOps(
        name="lra_listops", folder="listops-1000", max_length=40, pad_length=48, eval_split="test", **COMMON
    )
    assert [int(y) for *_, y in test_task.datasets(tmp_path)[1]] == [t for _, t in splits["test"]]


def test_a_missing_file_names_it_and_the_release(tmp_path):
    task = ListOps(name="lra_listops", folder="listops-1000", max_length=40, pad_length=48, **COMMON)
    with pytest.raises(DataError, match=r"listops-1000/basic_train\.tsv.*lra_release/listops-1000"):
        task.datasets(tmp_path)


def test_the_small_set_is_generated_once_then_read_back(tmp_path):
    generate = dict(num_train=30, num_val=10, num_test=10, min_length=5, max_length=40, seed=1)
    task = ListOpsSmall(
        generate=generate,
        name="lra_listops_small",
        folder="listops_small",
        max_length=40,
        pad_length=40,
        **COMMON,
    )
    train, val = task.datasets(tmp_path)
    files = [
        tmp_path / "listops_small" / name for name in ("basic_train.tsv", "basic_val.tsv", "basic_test.tsv")
    ]
    assert all(f.is_file() for f in files) and (len(train), len(val)) == (30, 10)
    assert [t for _, t in listops.read_split(files[0].parent, "train")] == train.labels.tolist()
    stamps = [f.stat().st_mtime_ns for f in files]
    again, _ = task.datasets(tmp_path)
    assert [f.stat().st_mtime_ns for f in files] == stamps  # read, not regenerated
    assert all((a[0] == b[0]).all() for a, b in zip(train, again, strict=True))
    other = ListOpsSmall(
        generate={**generate, "seed": 2},
        name="lra_listops_small",
        folder="listops_small",
        max_length=40,
        pad_length=40,
        **COMMON,
    )
    with pytest.warns(UserWarning, match="generating again"):
        regenerated, _ = other.datasets(tmp_path)  # files made with other options are made again
    assert json.loads((files[0].parent / "generator.json").read_text())["seed"] == 2
    assert [t for _, t in listops.read_split(files[0].parent, "train")] == regenerated.labels.tolist()
    assert regenerated.labels.tolist() != train.labels.tolist()


def test_files_put_there_without_the_generators_marker_are_read_never_overwritten(tmp_path):
    """The user's own ListOps files in the small set's folder: used as they are."""
    written = write_listops(tmp_path / "listops_small", num_train=12, num_val=4, num_test=4)
    stamps = [f.stat().st_mtime_ns for f in (tmp_path / "listops_small").glob("*.tsv")]
    task = ListOpsSmall(
        generate=dict(num_train=30, num_val=10, num_test=10, min_length=5, max_length=40, seed=1),
        name="lra_listops_small",
        folder="listops_small",
        max_length=40,
        pad_length=40,
        **COMMON,
    )
    train, _ = task.datasets(tmp_path)
    assert [f.stat().st_mtime_ns for f in (tmp_path / "listops_small").glob("*.tsv")] == stamps
    assert train.labels.tolist() == [label for _, label in written["train"]]
    assert not (tmp_path / "listops_small" / "generator.json").exists()
