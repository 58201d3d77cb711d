"""Issue 39, item 3: generated data carries its own checksums, and runs on other data never share
an identity. Each test names the case of the issue it reproduces (on the code path as it was: the
run, ``python -m src.eval``, the generators) and proves the damaged file refused or rebuilt."""

from __future__ import annotations

import json
import random
import re
import warnings
from pathlib import Path

import numpy as np
import pytest
from conftest import compose, recorded_fsyncs_and_renames
from smoke.lm import documents, lines

from src.engine import generated, train
from src.engine.generated import NotPrepared, ensure_generated, preparing
from src.engine.record.identity import Identity, IdentityMismatch
from src.errors import DataError

LM = [  # WikiText-103's layout, UTF-8 bytes as tokens (no tokenizer to fetch), a 0.8M-parameter GPT
    "task=lm_wikitext103",
    "task.tokenizer=bytes",
    "backbone=gpt_micro",
    "task.seq_len=16",
    "task.batch_size=4",
    "task.eval_batch_size=4",
    "trainer.num_workers=0",
    "trainer.precision=fp32",
    "trainer.max_steps=4",
    "trainer.val_every=2",
    "trainer.eval_batches=2",
    "trainer.threads=1",
]
LISTOPS = [  # the embedded default of the LRA family, 40 training rows
    "task=lra_listops_small",
    "task.generate.num_train=40",
    "task.generate.num_val=8",
    "task.generate.num_test=8",
    "task.batch_size=8",
    "task.eval_batch_size=8",
    "trainer.max_steps=2",
    "trainer.val_every=2",
    "trainer.num_workers=0",
    "trainer.threads=1",
    "trainer.test_after=null",
]


def write_wikitext(data: Path, validation: list[str] | None = None) -> None:
    """WikiText-103's parquet files (one ``text`` column) from CPython's pydoc topics."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    train, val = documents()
    folder = data / "wikitext103" / "wikitext-103-raw-v1"
    folder.mkdir(parents=True, exist_ok=True)
    splits = {"train": lines(train), "validation": validation or lines(val), "test": lines(val)}
    for split, rows in splits.items():
        pq.write_table(pa.table({"text": rows}), folder / f"{split}-00000-of-00001.parquet")


def evaluate(run: Path, capsys) -> tuple[float, str]:
    """``python -m src.eval <run> split=val`` in this process: its val/loss and what it printed."""
    from src import eval as src_eval

    src_eval.main([str(run), "split=val"])
    said = capsys.readouterr()
    return json.loads((run / "eval-val.json").read_text())["metrics"]["val/loss"], said.out + said.err


def zero_fill(path: Path) -> None:
    """The file's bytes all zero, at its own size (in place: the same inode)."""
    size = path.stat().st_size
    with open(path, "r+b") as handle:
        handle.write(b"\0" * size)


def recorded_data(run: Path) -> dict[str, str]:
    return json.loads((run / "identity.json").read_text())["config"].get("data", {})


# -- the token cache ---------------------------------------------------------------------------------


def test_a_zero_filled_validation_bin_at_its_own_size_is_rebuilt_and_eval_keeps_the_runs_number(
    tmp_path, capsys, monkeypatch
):
    """Case: a zero-filled `validation.bin` at its own size is read silently (src.eval rewrote the
    run's own eval-val.json: val/loss 5.82 → 6.22). Now the cache's content is checked against its
    manifest: the file is rebuilt (a warning names it), evaluation measures the run's data, the
    rerun of the completed run finds the same identity; and data other than the run's never goes to
    the run's own eval-val.json."""
    monkeypatch.chdir(tmp_path)
    data, run = tmp_path / "data", tmp_path / "run"
    write_wikitext(data)
    cfg = compose([*LM, f"paths.data_dir={data}"], tmp_path)
    assert train(cfg, run)["status"] == "completed"
    (cache,) = data.glob("cache/**/validation.bin")
    made = cache.read_bytes()
    loss, _ = evaluate(run, capsys)

    zero_fill(cache)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        again, _ = evaluate(run, capsys)
    assert again == loss and cache.read_bytes() == made  # rebuilt, and the run's number kept
    said = [str(w.message) for w in caught]
    assert any(f"{cache} is damaged: its content is not what was written" in line for line in said), said
    assert set(recorded_data(run)) == {
        f"cache/lm/wikitext103/bytes-utf8/{s}" for s in ("train", "validation", "test")
    }
    zero_fill(cache)
    with pytest.warns(UserWarning, match="generating again"):
        assert train(cfg, run)["status"] == "completed"  # the same data: the same identity, complete
    assert cache.read_bytes() == made

    write_wikitext(data, validation=lines(documents()[0][-8:]))  # another validation split
    own = (run / "eval-val.json").read_bytes()
    _, said = evaluate(run, capsys)
    assert (run / "eval-val.json").read_bytes() == own  # the run's own result, untouched
    (elsewhere,) = run.glob("eval-val.*.json")
    other = json.loads(elsewhere.read_text())
    assert other["metrics"]["val/loss"] != loss and other["record_identity"] != other["identity"]
    assert "data other than the run's (cache/lm/wikitext103/bytes-utf8/validation)" in said


def test_the_token_cache_is_fsynced_before_it_is_renamed_into_place_and_the_marker_comes_last(
    tmp_path, monkeypatch
):
    """Case: the token cache is renamed into place without an fsync. Now every file is on disk
    before the rename that puts it in place, the array before its manifest, the manifest before the
    marker that says the cache is complete."""
    from tasks.lm.cache import cached_tokens
    from tasks.lm.tokenizer import ByteTokenizer

    events = recorded_fsyncs_and_renames(monkeypatch, lambda src, dst: f"{src} -> {dst}")
    base = tmp_path / "validation"
    tokens = cached_tokens(base, lambda: [["some text ", "and more"]], ByteTokenizer(), False, {"files": 1})
    assert tokens.tolist() == list(b"some text and more")

    def index(kind: str, final: str) -> int:  # the event that wrote (fsync) or placed (rename) ``final``
        for i, (what, path) in enumerate(events):
            if what == kind and (
                path.endswith(f"-> {final}")
                if kind == "rename"
                else Path(path).name.lstrip(".").startswith(Path(final).name)  # its temporary file
            ):
                return i
        raise AssertionError(f"no {kind} of {final}: {events}")

    order = []
    for name in ("validation.bin", "validation.manifest.json", "validation.json"):
        final = str(tmp_path / name)
        assert index("fsync", final) < index("rename", final), (name, events)
        order.append(index("rename", final))
    assert order == sorted(order)  # the array, its manifest, then the marker
    manifest = json.loads(generated.manifest_path(base.with_suffix(".json")).read_text())
    assert manifest["files"]["validation.bin"]["rows"] == 18  # tokens


# -- ListOps ------------------------------------------------------------------------------------


def listops_folder(data: Path) -> Path:
    return data / "listops_small"


def cut(path: Path, rows: int) -> None:
    """The TSV cut to its header and its first ``rows`` rows."""
    kept = path.read_text().splitlines(keepends=True)[: rows + 1]
    path.write_text("".join(kept))


def test_a_listops_train_file_cut_to_10_of_its_40_rows_is_regenerated_before_a_run_trains_on_it(tmp_path):
    """Case: a ListOps `basic_train.tsv` cut to 10 of its 40 rows trains to `completed` under the
    identity of runs on the full data, so the report pools them. Now the run finds the file is not
    what its manifest says, generates it again (all 40 rows) and trains on it: the identity it
    shares with seed 0 is the identity of the full data."""
    from launch.analysis.records import read_runs

    data = tmp_path / "data"
    first = compose([*LISTOPS, f"paths.data_dir={data}", "seed=0"], tmp_path)
    assert train(first, tmp_path / "seed0")["status"] == "completed"
    tsv = listops_folder(data) / "basic_train.tsv"
    full = tsv.read_bytes()
    assert len(full.splitlines()) == 41
    cut(tsv, 10)
    second = compose([*LISTOPS, f"paths.data_dir={data}", "seed=1"], tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert train(second, tmp_path / "seed1")["status"] == "completed"
    assert tsv.read_bytes() == full  # trained on all 40 rows
    said = [str(w.message) for w in caught]
    assert any(re.search(r"basic_train.tsv is damaged: .* 11 rows where 41 were written", m) for m in said)
    assert recorded_data(tmp_path / "seed0") == recorded_data(tmp_path / "seed1") != {}
    runs = read_runs([tmp_path / "seed0", tmp_path / "seed1"])
    assert len({r.experiment for r in runs}) == 1  # the same data: one experiment, two seeds


def test_the_users_own_listops_cut_short_is_another_identity_and_its_record_is_not_resumed(tmp_path):
    """Case: a ListOps `basic_train.tsv` cut to 10 of its 40 rows trains under the identity of
    runs on the full data (the user's own copy: files there without generator.json, never
    overwritten). Now their content is hashed into the identity: a run on the cut file is another
    experiment in the report, and rerunning the completed run's command on it refuses in one line
    naming the data, where it said "complete" before."""
    from launch.analysis.records import read_runs

    data = tmp_path / "data"
    generated_cfg = compose([*LISTOPS, f"paths.data_dir={data}"], tmp_path)
    instantiate_task(generated_cfg).prepare_data(data)
    folder = listops_folder(data)
    for made in ("generator.json", "generator.manifest.json"):
        (folder / made).unlink(missing_ok=True)  # the user's own copy from here on
    full = compose([*LISTOPS, f"paths.data_dir={data}", "seed=0"], tmp_path)
    assert train(full, tmp_path / "seed0")["status"] == "completed"
    cut(folder / "basic_train.tsv", 10)
    assert train(compose([*LISTOPS, f"paths.data_dir={data}", "seed=1"], tmp_path), tmp_path / "seed1")
    assert len((folder / "basic_train.tsv").read_text().splitlines()) == 11  # the user's, left as it is
    runs = read_runs([tmp_path / "seed0", tmp_path / "seed1"])
    assert len({r.experiment for r in runs}) == 2  # never pooled
    with pytest.raises(IdentityMismatch) as refused:
        train(full, tmp_path / "seed0")
    message = str(refused.value)
    assert "data.listops_small/generator: " in message and "\n" not in message
    assert "the files the run read are not those the record was made on" in message


def instantiate_task(cfg):
    from hydra.utils import instantiate

    return instantiate(cfg.task)


def test_a_torn_generated_listops_file_is_regenerated_and_a_read_error_names_it_as_generated(tmp_path):
    """Case: a torn generated ListOps file gives the same error on every run and is never
    regenerated, nor named as generated data that can be deleted. Now the next use finds it torn
    (its manifest) and generates it again; a file torn after that check is named as generated data
    that deleting makes again."""
    data = tmp_path / "data"
    task = instantiate_task(compose([*LISTOPS, f"paths.data_dir={data}"], tmp_path))
    task.datasets(data)
    val = listops_folder(data) / "basic_val.tsv"
    made = val.read_bytes()
    val.write_bytes(made[: made.index(b"\t", len(made) // 2)])  # torn in a row, before its target
    with pytest.warns(UserWarning, match="basic_val.tsv is damaged"):
        train_set, val_set = task.datasets(data)
    assert val.read_bytes() == made and len(val_set) == 8 and len(train_set) == 40
    val.write_bytes(made[: made.index(b"\t", len(made) // 2)])
    with pytest.raises(DataError, match=r"holds generated data \(generator.json\): delete the folder"):
        task.load(listops_folder(data), "val")  # what datasets() reads once the check has passed


# -- the check itself ----------------------------------------------------------------------------


def test_every_generated_set_has_a_manifest_that_matches_its_files(tmp_path):
    """Item 3: every generated artefact carries a manifest with sizes, row counts and a content hash
    (ListOps, glue_tiny, COCO shapes, a WordPiece, a BPE tokenizer, token caches); the identity of a
    run names each by its marker's path below the data folder."""
    from tasks.detection.shapes import ShapesSpec, ensure_coco_shapes
    from tasks.glue.generate import GlueTinySpec, ensure_glue_tiny
    from tasks.lra.listops import ListOpsSpec
    from tasks.lra.tasks import ensure_listops
    from tasks.mlm.wordpiece import cached_wordpiece

    with generated.reading(tmp_path) as read:
        ensure_listops(tmp_path / "listops", ListOpsSpec(num_train=20, num_val=4, num_test=4))
        ensure_glue_tiny(
            tmp_path / "glue_tiny", GlueTinySpec(corpus_docs=20, sst2_train=10, rte_train=10, dev=4, test=4)
        )
        ensure_coco_shapes(
            tmp_path / "shapes", ShapesSpec(num_train=3, num_val=2, img_size=32, min_size=8, max_size=12)
        )
        texts = ["the cat sat on the mat", "a dog ran"] * 20
        cached_wordpiece(tmp_path / "wp" / "tokenizer.json", lambda: texts, 40, {"files": "t"})
    assert set(read) == {"listops/generator", "glue_tiny/generator", "shapes/generator", "wp/trained"}
    for marker in tmp_path.glob("*/*.json"):
        if marker.name.endswith(".manifest.json") or not generated.manifest_path(marker).is_file():
            continue
        manifest = json.loads(generated.manifest_path(marker).read_text())
        assert manifest["hash"] == read[f"{marker.parent.name}/{marker.stem}"]
        for name, entry in manifest["files"].items():
            assert generated.digest_file(marker.parent / name) == entry, name
    listops = json.loads((tmp_path / "listops" / "generator.manifest.json").read_text())["files"]
    assert {k: v["rows"] for k, v in listops.items()} == {
        "basic_train.tsv": 21,
        "basic_val.tsv": 5,
        "basic_test.tsv": 5,
    }
    shapes = json.loads((tmp_path / "shapes" / "generator.manifest.json").read_text())["files"]
    assert (
        len([n for n in shapes if n.endswith(".jpg")]) == 5 and "annotations/instances_val2017.json" in shapes
    )


class Writer:
    """A generator that writes ``data.bin`` through :func:`hashed_output` in pieces of random sizes."""

    def __init__(self, folder: Path, size: int, seed: int) -> None:
        self.folder, self.calls = folder, 0
        self.payload = np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()
        self.rng = random.Random(seed)

    def __call__(self) -> None:
        self.calls += 1
        with generated.hashed_output(self.folder / "data.bin", itemsize=1) as out:
            at = 0
            while at < len(self.payload):
                step = self.rng.choice([1, 7, 4095, 4096, 4097, 10_000])
                out.write(self.payload[at : at + step])
                at += step


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of 4 KiB and a whole-file check up to 16 KiB: the sampled path on a 200 KB file."""
    monkeypatch.setattr(generated, "BLOCK_BYTES", 4096)
    monkeypatch.setattr(generated, "FULL_CHECK_BYTES", 16_384)
    monkeypatch.delenv("VERIFY_DATA", raising=False)


def test_a_stream_hashed_as_written_is_the_file_read_back(tmp_path, small_blocks):
    """The token cache's digest is computed as it is written (never read back): over 300 random
    sizes and cuts, the streamed digest equals the file's read back, blocks included."""
    rng = random.Random(0)
    for trial in range(300):
        size = rng.choice([0, 1, 4095, 4096, 4097, rng.randrange(1, 60_000)])
        written: dict = {}
        token = generated._WRITTEN.set(written)
        try:
            Writer(tmp_path, size, trial)()
        finally:
            generated._WRITTEN.reset(token)
        ((_, entry),) = written.items()
        entry.pop("_stat")
        assert entry == generated.digest_file(tmp_path / "data.bin", itemsize=1), (trial, size)
        assert ("blocks" in entry) == (size > 16_384)


def test_a_large_file_is_checked_in_sampled_blocks_that_find_zeros_and_a_full_check_finds_one_block(
    tmp_path, small_blocks, monkeypatch
):
    """Case: a zero-filled file at its own size (beyond the size hashed whole at each use). A use
    reads at most 34 of its 49 blocks and finds the zeros; one changed block is found by a full check
    (VERIFY_DATA=full)."""
    make = Writer(tmp_path, 200_000, 1)
    marker = tmp_path / "data.json"
    ensure = lambda: ensure_generated(marker, {"v": 1}, make, outputs=(tmp_path / "data.bin",))  # noqa: E731
    ensure()
    reads = []
    block_digest = generated._block_digest
    monkeypatch.setattr(generated, "_block_digest", lambda block: reads.append(1) or block_digest(block))
    generated._VERIFIED.clear()
    ensure()
    assert make.calls == 1 and 0 < len(reads) <= generated.SAMPLED_BLOCKS + 2 < 49
    zero_fill(tmp_path / "data.bin")
    with pytest.warns(UserWarning, match="data.bin is damaged: its content is not what was written"):
        ensure()
    assert make.calls == 2 and (tmp_path / "data.bin").read_bytes() == make.payload
    with open(tmp_path / "data.bin", "r+b") as handle:  # one byte of one block
        handle.seek(123_456)
        handle.write(b"\xff" if make.payload[123_456] != 255 else b"\0")
    monkeypatch.setenv("VERIFY_DATA", "full")
    with pytest.warns(UserWarning, match="data.bin is damaged"):
        ensure()
    assert make.calls == 3 and (tmp_path / "data.bin").read_bytes() == make.payload


def test_a_marker_without_its_manifest_is_made_again_and_a_check_says_why(tmp_path):
    """Data made before manifests existed (a marker, no manifest) is generated once more, to record
    its checksums; a check (launch.cluster.prepare --check) builds nothing and says the file is damaged."""
    calls = []

    def make() -> None:
        calls.append(1)
        (tmp_path / "rows.tsv").write_text("a\tb\n1\t2\n")

    ensure = lambda: ensure_generated(tmp_path / "generator.json", {"v": 1}, make)  # noqa: E731
    ensure()
    generated.manifest_path(tmp_path / "generator.json").unlink()
    with pytest.warns(UserWarning, match="no checksums"):
        ensure()
    assert len(calls) == 2 and generated.manifest_path(tmp_path / "generator.json").is_file()
    (tmp_path / "rows.tsv").write_text("a\tb\n1\t3\n")  # the same size, one value changed
    with preparing(check=True), pytest.raises(NotPrepared, match=r"rows.tsv is damaged: its content"):
        ensure()
    assert len(calls) == 2


# -- the identity ----------------------------------------------------------------------------------


def test_the_data_read_joins_the_identity_and_a_run_without_generated_data_keeps_its_own(tmp_path):
    """Item 3: the manifest's hash is part of the run identity, so runs on other data never pool;
    a run that reads no generated data keeps the identity it had (no ``data`` key)."""
    cfg = compose(["trainer.max_steps=20"], tmp_path)
    plain = Identity.of(cfg)
    assert Identity.of(cfg, {}).hash == plain.hash and "data" not in plain.config
    one = Identity.of(cfg, {"listops_small/generator": "a" * 16})
    other = Identity.of(cfg, {"listops_small/generator": "b" * 16})
    assert len({plain.hash, one.hash, other.hash}) == 3
    assert one.differences(other) == {"data.listops_small/generator": ("a" * 16, "b" * 16)}
    assert one.without("data").hash == plain.hash
    with pytest.raises(IdentityMismatch, match="made before runs recorded it"):
        one.check_same(plain, tmp_path / "run")  # a record from before data joined the identity
