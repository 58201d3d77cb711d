"""GLUE's reader: every task's official files and their hub parquet copy (tests/glue_fixtures.py),
the labels in the hub's order, MNLI's two dev sets, QQP's malformed rows, and one DataError per mistake."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from glue_fixtures import ROWS, TASKS, write_hub, write_hub_parquet, write_lines, write_official

from src.errors import ConfigError, DataError
from tasks.glue.formats import SPECS, read_split

CASES = [(task, split) for task in TASKS for split in ROWS[task]]


def message(call) -> str:
    """The message of the DataError ``call()`` raises."""
    with pytest.raises(DataError) as error:
        call()
    return str(error.value)


@pytest.fixture(scope="module")
def copies(tmp_path_factory):
    """Every task's rows twice: GLUE's files in one folder, the hub's parquet files in another."""
    official, hub = tmp_path_factory.mktemp("official"), tmp_path_factory.mktemp("hub")
    write_official(official)
    write_hub(hub)
    return official, hub


@pytest.mark.parametrize("task,split", CASES)
def test_official_files_give_the_rows_and_the_hub_copy_gives_the_same(copies, task, split):
    official, hub = copies
    spec, rows = SPECS[task], ROWS[task][split]
    read = read_split(official, spec, split)
    assert read.source == str(official / "glue_data" / TASKS[task][0] / f"{split}.tsv")
    assert read.texts == [texts for texts, _ in rows]
    assert all(len(texts) == len(spec.text_columns) for texts in read.texts)
    if split.startswith("test"):
        assert read.labels is None
    else:
        dtype = np.float32 if task == "stsb" else np.int64
        assert read.labels.dtype == dtype
        np.testing.assert_array_equal(read.labels, np.asarray([label for _, label in rows], dtype))
    copy = read_split(hub, spec, split)
    assert copy.source.endswith(".parquet") and copy.texts == read.texts
    assert (copy.labels is None) == (read.labels is None)
    if read.labels is not None:
        assert copy.labels.dtype == read.labels.dtype
        np.testing.assert_array_equal(copy.labels, read.labels)


def test_quote_characters_are_kept_and_sst2s_trailing_space_too(copies):
    texts = [t for task in TASKS for t in sum(read_split(copies[0], SPECS[task], "train").texts, ())]
    assert '" the film is " \'s worth a look' in texts and '"Hold the door," said the man .' in texts
    assert (
        'Why do actors say "break a leg"?' in texts
        and "'Twas brillig, and the slithy toves did gyre" in texts
    )
    assert "it 's a charming and often affecting journey . " in texts


@pytest.mark.parametrize(
    "task,lines,labels",
    [
        (
            "rte",
            ["index\tsentence1\tsentence2\tlabel", "0\ta\tb\tnot_entailment", "1\tc\td\tentailment"],
            [1, 0],
        ),
        (
            "qnli",
            ["index\tquestion\tsentence\tlabel", "0\tq?\ts\tentailment", "1\tq?\ts\tnot_entailment"],
            [0, 1],
        ),
        ("wnli", ["index\tsentence1\tsentence2\tlabel", "0\ta\tb\t1", "1\tc\td\t0"], [1, 0]),  # 1: entailment
        ("sst2", ["sentence\tlabel", "good . \t1", "bad . \t0"], [1, 0]),
        ("cola", ["gj04\t0\t*\tHim left.", "gj04\t1\t\tHe left."], [0, 1]),
    ],
)
def test_labels_map_to_the_hub_order(tmp_path, task, lines, labels):
    write_lines(tmp_path / "glue_data" / TASKS[task][0] / "train.tsv", lines)
    read = read_split(tmp_path, SPECS[task], "train")
    assert read.labels.tolist() == labels
    names = [SPECS[task].labels[i] for i in labels]
    if task == "wnli":
        assert names == ["entailment", "not_entailment"]


def test_mnli_reads_both_dev_sets_and_their_gold_label(copies):
    spec = SPECS["mnli"]
    matched, mismatched = (read_split(copies[0], spec, s) for s in ("dev_matched", "dev_mismatched"))
    assert len(matched.texts) == len(ROWS["mnli"]["dev_matched"]) != len(mismatched.texts)
    assert matched.source.endswith("dev_matched.tsv") and mismatched.source.endswith("dev_mismatched.tsv")
    line = (copies[0] / "glue_data" / "MNLI" / "dev_matched.tsv").read_text().splitlines()[2].split("\t")
    assert len(line) == 16 and line[10] != line[11] and line[-1] == "neutral"  # annotators disagree
    assert matched.labels[1] == spec.labels.index("neutral") == 1


def test_mnli_without_dev_mismatched_is_refused(tmp_path):
    write_official(tmp_path, ("mnli",))
    (tmp_path / "glue_data" / "MNLI" / "dev_mismatched.tsv").unlink()
    text = message(lambda: read_split(tmp_path, SPECS["mnli"], "train"))
    assert "MNLI needs both dev sets" in text and str(tmp_path / "glue_data/MNLI/dev_mismatched.tsv") in text


def test_official_files_win_over_a_hub_copy(tmp_path):
    write_official(tmp_path, ("rte",))
    write_hub_parquet(tmp_path, "rte", "train", [(("other", "pair"), 0)])
    assert read_split(tmp_path, SPECS["rte"], "train").texts == [t for t, _ in ROWS["rte"]["train"]]


def test_a_save_to_disk_copy_is_read(tmp_path):
    import datasets

    rows = ROWS["mnli"]["dev_mismatched"]
    columns = {"premise": [t[0] for t, _ in rows], "hypothesis": [t[1] for t, _ in rows]}
    dataset = datasets.Dataset.from_dict({**columns, "label": [label for _, label in rows]})
    dataset.save_to_disk(str(tmp_path / "glue" / "mnli" / "validation_mismatched"))
    read = read_split(tmp_path, SPECS["mnli"], "dev_mismatched")
    assert read.texts == [t for t, _ in rows] and read.labels.tolist() == [label for _, label in rows]


def test_missing_everywhere_names_both_places_and_both_ways(tmp_path):
    text = message(lambda: read_split(tmp_path, SPECS["cola"], "dev"))
    assert len(text.splitlines()) == 2
    assert str(tmp_path / "glue_data" / "CoLA" / "dev.tsv") in text
    assert f"{tmp_path}/glue/cola/validation/state.json" in text
    assert f"{tmp_path}/glue/cola/validation-*.parquet" in text
    assert f"python download_glue_data.py --data_dir {tmp_path}/glue_data --tasks all" in text
    assert "gist.github.com/W4ngatang/60c2bdb54d156a41194446737ce03e2e" in text
    assert "datasets.load_dataset('nyu-mll/glue', 'cola').save_to_disk('cola')" in text


def test_an_unknown_split_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="dev_matched, dev_mismatched"):
        read_split(tmp_path, SPECS["mnli"], "dev")


def write(tmp_path, task: str, split: str, lines: list[str]):
    """``lines`` as GLUE's ``<split>.tsv`` of ``task`` under ``tmp_path``."""
    return write_lines(tmp_path / "glue_data" / TASKS[task][0] / f"{split}.tsv", lines)


@pytest.mark.parametrize(
    "task,lines,where,says",
    [
        ("rte", ["index\tsentence1\tsentence2\tlabel", "0\ta\tb\tentailment", "1\ta b\tentailment"], 3,
         ["expected 4 columns", "got 3"]),
        ("stsb", ["index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2", "0"], 1,
         ["10 columns", "got 9 columns", "another task or format"]),
        ("rte", ["index\tquestion\tsentence\tlabel", "0\tq\ts\tentailment"], 1,
         ["'index\\tsentence1\\tsentence2\\tlabel'", "another task"]),
        ("cola", ["index\tsentence", "0\tHe left."], 1, ["4 columns", "got 2", "CoLA has no header"]),
        ("sst2", ["sentence\tlabel", "fine\t1", "odd\t2"], 3, ["label '2'", "0, 1"]),
        ("rte", ["index\tsentence1\tsentence2\tlabel", "0\ta\tb\tneutral"], 2,
         ["label 'neutral'", "entailment, not_entailment"]),
        ("stsb", [
            "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore",
            "0\tg\tf\t2012\t0\tn\tn\ta\tb\thigh",
        ], 2, ["score 'high'", "0 to 5"]),
        ("sst2", ["sentence\tlabel"], None, ["has no examples"]),
    ],
)  # fmt: skip
def test_each_mistake_in_an_official_file_is_one_data_error(tmp_path, task, lines, where, says):
    path = write(tmp_path, task, "train", lines)
    text = message(lambda: read_split(tmp_path, SPECS[task], "train"))
    assert (f"{path}:{where}:" if where else str(path)) in text
    assert all(part in text for part in says), text
    assert "download_glue_data.py" in text and len(text.splitlines()) == 1


def qqp_lines(good: int, bad: int) -> list[str]:
    """QQP's train.tsv: ``good`` rows of 6 columns, then ``bad`` rows of 4."""
    rows = [f"{i}\t{2 * i}\t{2 * i + 1}\tWhy is \"x\" {i}?\tHow is 'y'?\t{i % 2}" for i in range(good)]
    return [
        "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate",
        *rows,
        *[f"{good + i}\t1\t2\tcut" for i in range(bad)],
    ]


def test_qqp_skips_a_few_malformed_rows_with_one_warning(tmp_path):
    write(tmp_path, "qqp", "train", qqp_lines(2000, 2))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        read = read_split(tmp_path, SPECS["qqp"], "train")
    assert len(read.texts) == 2000 and read.labels.sum() == 1000
    (warning,) = caught
    assert "skipped 2 of 2002 rows" in str(warning.message) and "the first: line 2002" in str(warning.message)


def test_qqp_refuses_more_than_a_thousandth_of_malformed_rows(tmp_path):
    path = write(tmp_path, "qqp", "train", qqp_lines(1000, 2))
    text = message(lambda: read_split(tmp_path, SPECS["qqp"], "train"))
    assert str(path) in text and "2 of 1002 rows" in text and "0.1% is not QQP" in text
    write(
        tmp_path,
        "rte",
        "train",
        ["index\tsentence1\tsentence2\tlabel", *["0\ta\tb\tentailment"] * 999, "1\tcut"],
    )
    assert "expected 4 columns" in message(lambda: read_split(tmp_path, SPECS["rte"], "train"))  # QQP alone


def hub_table(tmp_path, columns: dict):
    """``columns`` as the hub's RTE train split under ``tmp_path/glue``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "glue" / "rte" / "train-00000-of-00001.parquet"
    path.parent.mkdir(parents=True)
    pq.write_table(pa.table(columns), path)
    return path


@pytest.mark.parametrize(
    "columns,says",
    [
        (
            {"premise": ["a"], "hypothesis": ["b"], "label": [0]},
            ["no column sentence1, sentence2", "premise"],
        ),
        ({"sentence1": ["a"], "sentence2": ["b"]}, ["no column label", "sentence1, sentence2, label"]),
        ({"sentence1": ["a", "c"], "sentence2": ["b", "d"], "label": [0, 2]}, ["row 1: label 2", "0 to 1"]),
        ({"sentence1": [], "sentence2": [], "label": []}, ["has no rows"]),
    ],
)
def test_each_mistake_in_a_hub_copy_is_one_data_error(tmp_path, columns, says):
    import pyarrow as pa

    if not columns.get("sentence1", True):
        columns = {name: pa.array([], pa.int64() if name == "label" else pa.string()) for name in columns}
    path = hub_table(tmp_path, columns)
    text = message(lambda: read_split(tmp_path, SPECS["rte"], "train"))
    assert str(path) in text and all(part in text for part in says), text
