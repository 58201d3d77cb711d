"""Language-modelling data: the readers of the Hugging Face layouts, the tokenizers and the
memory-mapped token cache, the windows, and the metrics the loop records."""

from __future__ import annotations

import json
import math
import pickle
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import CONF, compose, run_cli
from smoke.lm import documents, lines, write_gpt2_format_bpe, write_parquet, write_save_to_disk

from src.engine import train
from src.engine.generated import file_lock
from src.engine.record import checkpoint
from src.engine.record.files import read_metrics
from src.errors import ConfigError, DataError
from tasks.lm import CharCorpus, TinyStories, WikiText103
from tasks.lm.cache import TokenWindows, cached_tokens, unigram_entropy
from tasks.lm.corpora import HubDataset, find_split, pydoc_topics_text
from tasks.lm.tokenizer import ByteTokenizer

SMALL = {"input": "causal_lm", "seq_len": 16, "batch_size": 4, "eval_batch_size": 4}


def tinystories(**kw) -> TinyStories:
    return TinyStories(**{"name": "lm_tinystories", "folder": "tinystories", **SMALL, **kw})


def wikitext(**kw) -> WikiText103:
    return WikiText103(**{"name": "lm_wikitext103", "folder": "wikitext103", **SMALL, **kw})


@pytest.fixture(scope="module")
def hub_copies(tmp_path_factory) -> Path:
    """TinyStories in the save_to_disk layout, WikiText-103 as the hub's parquet files, and a
    BPE in GPT-2's file format, all from the same documents."""
    root = tmp_path_factory.mktemp("data")
    train, val = documents()
    write_save_to_disk(root / "tinystories", {"train": train, "validation": val})
    write_parquet(
        root / "wikitext103" / "wikitext-103-raw-v1", {"train": lines(train), "validation": lines(val)}
    )
    write_gpt2_format_bpe(root / "tokenizers" / "gpt2", train)
    return root


def test_wikitext_test_split_is_tokenised_by_the_same_cache_and_tinystories_has_none(hub_copies, tmp_path):
    train, val = documents()
    wiki = tmp_path / "wikitext103" / "wikitext-103-raw-v1"
    write_parquet(wiki, {"train": lines(train), "validation": lines(val), "test": lines(val)})
    (tmp_path / "tokenizers").symlink_to(hub_copies / "tokenizers")
    task = wikitext()
    test, valid = task.eval_dataset(tmp_path, "test"), task.eval_dataset(tmp_path, "val")
    np.testing.assert_array_equal(np.asarray(test.tokens), np.asarray(valid.tokens))  # same rows, same ids
    assert len(list((tmp_path / "cache" / "lm" / "wikitext103").glob("*/test.bin"))) == 1
    assert task.eval_splits == ("val", "test") and tinystories().eval_splits == ("val",)
    with pytest.raises(ConfigError, match="no 'test' split.*its splits are val"):
        tinystories().eval_dataset(hub_copies, "test")


def split_documents(tokens: np.ndarray, eot: int) -> list[np.ndarray]:
    ends = np.flatnonzero(tokens == eot)
    assert ends[-1] == len(tokens) - 1  # every document is followed by the separator
    return [piece[:-1] for piece in np.split(tokens, ends[:-1] + 1)]


def test_the_bpe_cache_round_trips_and_is_reused(hub_copies):
    task = tinystories()
    train, val = task.datasets(hub_copies)
    tok = task.tokenizer
    assert tok.name == "gpt2" and tok.vocab_size == 512
    cached = Path(train.tokens.filename)
    assert cached.is_relative_to(hub_copies / "cache" / "lm" / "tinystories")
    train_docs, val_docs = documents()
    for windows, docs in ((train, train_docs), (val, val_docs)):
        pieces = split_documents(np.asarray(windows.tokens), tok.eot)
        assert [tok.decode(p.tolist()) for p in pieces] == docs
    stamp = cached.stat().st_mtime_ns
    again = tinystories()
    again_train, _ = again.datasets(hub_copies)
    assert cached.stat().st_mtime_ns == stamp  # read back, not rebuilt
    np.testing.assert_array_equal(np.asarray(again_train.tokens), np.asarray(train.tokens))


def test_both_layouts_give_the_same_rows_and_tokens(hub_copies, tmp_path):
    dataset = HubDataset("WikiText-103", "Salesforce/wikitext", "wikitext-103-raw-v1")
    expected = lines(documents()[1])
    write_save_to_disk(tmp_path / "wikitext103", {"train": lines(documents()[0]), "validation": expected})
    parquet = find_split(hub_copies / "wikitext103", "validation", dataset)
    arrow = find_split(tmp_path / "wikitext103", "validation", dataset)
    assert (parquet.kind, arrow.kind) == ("parquet", "arrow")
    for source in (parquet, arrow):
        assert [row for batch in source.batches(batch_size=7) for row in batch] == expected
    (tmp_path / "tokenizers").symlink_to(hub_copies / "tokenizers")
    from_parquet, from_arrow = wikitext().datasets(hub_copies)[1], wikitext().datasets(tmp_path)[1]
    np.testing.assert_array_equal(np.asarray(from_parquet.tokens), np.asarray(from_arrow.tokens))
    tok = load_tok(hub_copies)
    assert tok.decode(np.asarray(from_arrow.tokens).tolist()) == "".join(
        expected
    )  # rows joined, no separator


def load_tok(data_dir: Path):
    from tasks.lm.tokenizer import load_gpt2

    return load_gpt2(data_dir / "tokenizers" / "gpt2")


def test_missing_data_names_the_files_and_how_to_get_them(tmp_path):
    with pytest.raises(DataError) as missing:
        tinystories().datasets(tmp_path)
    message = str(missing.value)
    for piece in (
        f"{tmp_path}/tinystories/train/state.json",
        f"{tmp_path}/tinystories/data/train-*.parquet",
        "load_dataset('roneneldan/TinyStories').save_to_disk('tinystories')",
        f"{tmp_path}/tokenizers/gpt2/vocab.json + merges.txt",  # one message for all that is missing
    ):
        assert piece in message
    train, val = documents()
    write_save_to_disk(tmp_path / "tinystories", {"train": train, "validation": val})
    with pytest.raises(DataError) as no_bpe:
        tinystories().datasets(tmp_path)
    for piece in ("vocab.json + merges.txt", "encoder.json + vocab.bpe", "No package", "task.tokenizer=bpe"):
        assert piece in str(no_bpe.value)
    with pytest.raises(DataError, match="wikitext-103-raw-v1/train-\\*.parquet"):
        wikitext().datasets(tmp_path)


def test_the_offline_bpe_is_trained_once_and_round_trips(hub_copies, tmp_path):
    (tmp_path / "tinystories").symlink_to(hub_copies / "tinystories")
    task = tinystories(tokenizer="bpe", bpe_vocab_size=300)
    _, val = task.datasets(tmp_path)
    saved = tmp_path / "cache" / "lm" / "tinystories" / "bpe-300" / "tokenizer.json"
    assert task.tokenizer.vocab_size == 300 and saved.is_file()
    pieces = split_documents(np.asarray(val.tokens), task.tokenizer.eot)
    assert [task.tokenizer.decode(p.tolist()) for p in pieces] == documents()[1]
    stamp = saved.stat().st_mtime_ns
    again = tinystories(tokenizer="bpe", bpe_vocab_size=300)
    again.datasets(tmp_path)
    assert saved.stat().st_mtime_ns == stamp and again.tokenizer.fingerprint == task.tokenizer.fingerprint


def test_the_char_corpus_is_the_pydoc_text_as_bytes_in_three_parts(tmp_path):
    """Train, test and validation tile the text in that order; validation is the same last 10%
    with or without the test split (null: the older two-way split, training up to validation)."""
    task = CharCorpus(name="lm_char", **SMALL)
    train, val = task.datasets(tmp_path)
    test = task.eval_dataset(tmp_path, "test")
    text = pydoc_topics_text()
    assert len(text) > 400_000 and task.eval_splits == ("val", "test")
    joined = np.concatenate([train.tokens, test.tokens, val.tokens])
    assert task.tokenizer.decode(joined.tolist()) == text and task.tokenizer.vocab_size == 256
    assert len(val.tokens) == pytest.approx(0.1 * len(joined), rel=0.05)
    assert len(test.tokens) == pytest.approx(0.1 * len(joined), rel=0.05)
    two_way = CharCorpus(name="lm_char", test_fraction=None, **SMALL)
    two_train, two_val = two_way.datasets(tmp_path)
    assert np.array_equal(two_val.tokens, val.tokens) and two_way.eval_splits == ("val",)
    assert np.array_equal(two_train.tokens, np.concatenate([train.tokens, test.tokens]))
    with pytest.raises(ConfigError, match="no 'test' split"):
        two_way.eval_dataset(tmp_path, "test")
    with pytest.raises(ConfigError, match=r"task.test_fraction=0.9: .* must be in \[0, 0.9\)"):
        CharCorpus(name="lm_char", test_fraction=0.9, **SMALL)
    (tmp_path / "own.txt").write_text("abcabcabc " * 20)
    own = CharCorpus(name="lm_char", text_file="own.txt", test_fraction=0, **SMALL)
    own_train, _ = own.datasets(tmp_path)
    assert bytes(own_train.tokens.tolist()) == ("abcabcabc " * 20)[:180].encode()


def test_your_text_is_labelled_by_its_name_and_gets_its_own_bpe(tmp_path):
    """task.text_file=my_corpus.txt names the run ``lm_char-my_corpus`` (the embedded corpus stays
    ``lm_char``; a hub task on another copy ``lm_tinystories-<folder>``), and a BPE trained on one
    text is trained again, not reused, when the text under the same name changes."""
    assert compose(["task=lm_char"], tmp_path).task.name == "lm_char"
    assert (
        compose(["task=lm_char", "task.text_file=my corpus.txt"], tmp_path).task.name == "lm_char-my_corpus"
    )
    assert compose(["task=lm_tinystories"], tmp_path).task.name == "lm_tinystories"
    mine = compose(["task=lm_tinystories", "task.folder=stories/mine"], tmp_path).task.name
    assert mine == "lm_tinystories-mine"
    own = tmp_path / "own.txt"
    bpe = dict(SMALL, tokenizer="bpe", bpe_vocab_size=300, test_fraction=0)
    vocabularies = []
    for text in ("the cat sat on the mat. " * 60, "quick brown foxes jump. " * 60):
        own.write_text(text)
        task = CharCorpus(name="lm_char-own", text_file="own.txt", **bpe)
        train, _ = task.datasets(tmp_path)
        assert task.tokenizer.decode(train.tokens.tolist()) == text[: int(len(text) * 0.9)]
        vocabularies.append(task.tokenizer.fingerprint)
    assert vocabularies[0] != vocabularies[1]


def test_windows_tile_the_tokens_and_survive_pickling(tmp_path):
    tokens = np.arange(103, dtype=np.uint16)
    path = tmp_path / "t.bin"
    tokens.tofile(path)
    windows = TokenWindows(np.memmap(path, dtype=np.uint16, mode="r", shape=(103,)), seq_len=10)
    assert len(windows) == 10
    items = [windows[i] for i in range(len(windows))]
    assert all(w.dtype == torch.int64 and w.shape == (11,) for w in items)
    assert torch.equal(torch.cat([w[:-1] for w in items]), torch.arange(100))
    assert all(items[i][-1] == items[i + 1][0] for i in range(9))  # each target is the next input
    copy = pickle.loads(pickle.dumps(windows))
    assert copy._tokens is None and torch.equal(copy[9], items[9])  # reopened, not copied
    with pytest.raises(IndexError):
        windows[10]


def test_the_cache_is_built_once_under_a_lock_and_rebuilt_when_its_source_changes(tmp_path):
    calls, results = [], []

    def batches():
        calls.append(1)
        yield ["abc", "dé"]

    base = tmp_path / "cache" / "train"
    base.parent.mkdir()
    with file_lock(base.with_suffix(".lock")):  # another run is tokenising
        waiting = threading.Thread(
            target=lambda: results.append(cached_tokens(base, batches, ByteTokenizer(), False, "v1"))
        )
        waiting.start()
        waiting.join(0.5)
        assert waiting.is_alive() and not calls
    waiting.join(10)
    again = cached_tokens(base, batches, ByteTokenizer(), False, "v1")
    assert calls == [1] and bytes(results[0].tolist()) == bytes(again.tolist()) == "abcdé".encode()
    assert isinstance(again, np.memmap) and again.dtype == np.uint16
    with pytest.warns(UserWarning, match=r"\{'source': 'v1'\}, now \{'source': 'v2'\}: generating again"):
        cached_tokens(base, batches, ByteTokenizer(), False, "v2")  # the copy on disk changed
    assert calls == [1, 1]


def test_unigram_entropy():
    assert unigram_entropy(np.arange(8).repeat(3), 16) == pytest.approx(math.log(8))
    assert unigram_entropy(np.zeros(5, dtype=np.int64), 4) == 0.0


def test_the_record_holds_perplexity_tokens_per_second_and_a_fixed_evaluation(tmp_path):
    overrides = [
        "task=lm_char",
        "backbone=gpt_micro",
        "attn=standard",
        "task.seq_len=32",
        "task.batch_size=4",
        "task.eval_batch_size=8",
        "trainer.max_steps=4",
        "trainer.val_every=4",
        "trainer.log_every=2",
        "trainer.monitor_every=0",
        "trainer.eval_batches=3",
    ]
    cfg = compose(overrides, tmp_path)
    summary = train(cfg, tmp_path / "run")
    final = summary["final"]
    assert summary["metric"] == "val/loss" and final["val/ppl"] == pytest.approx(math.exp(final["val/loss"]))
    rows = read_metrics(tmp_path / "run")
    logged = [r for r in rows if r["split"] == "train"]
    assert logged and all(r["tokens_per_s"] == pytest.approx(32 * r["throughput"]) for r in logged)

    # The recorded loss is the mean over exactly the first 3 validation batches of 8 windows.
    task = CharCorpus(name="lm_char", input="causal_lm", seq_len=32, batch_size=4, eval_batch_size=8)
    _, val = task.datasets(tmp_path)
    model = task.build_model(cfg.backbone)
    model.load_state_dict(checkpoint.load(tmp_path / "run" / "checkpoints" / "last.pt")["model"])
    batch = torch.stack([val[i] for i in range(24)])
    with torch.no_grad():
        loss = F.cross_entropy(model.eval()(batch[:, :-1]).flatten(0, 1), batch[:, 1:].flatten())
    assert final["val/loss"] == pytest.approx(loss.item(), rel=1e-5)


def test_the_paper_sweep_covers_the_papers_rows_with_every_variant():
    """``experiment=paper/lm``: every point composes into a compatible run (training it is
    the slow experiment test); the grid holds P3's and P4's rows and all six variants."""
    import itertools

    from omegaconf import OmegaConf

    from src import attention
    from src.engine.experiment import check_compatible

    params = OmegaConf.load(CONF / "experiment" / "paper" / "lm.yaml").hydra.sweeper.params
    axes = {key: str(value).split(",") for key, value in params.items() if key != "attn"}
    assert params.attn == "glob(*,exclude=compose)" and len(axes["seed"]) == 3  # every file of conf/attn/
    swept = {p.stem for p in (CONF / "attn").glob("*.yaml")} - {"compose"}
    assert sorted(swept) == sorted(attention.VARIANTS)
    rows = set(itertools.product(axes["task"], axes["backbone"]))
    assert {
        ("lm_tinystories", "gpt2_small"),
        ("lm_tinystories", "gpt_472m"),
        ("lm_wikitext103", "gpt_472m"),
    } <= rows
    for task, backbone in rows:
        cfg = compose(["experiment=paper/lm", f"task={task}", f"backbone={backbone}"], Path("unused"))
        check_compatible(cfg)
        assert (cfg.task.name, cfg.backbone.name, cfg.sweep_name) == (task, backbone, "paper_lm")


@pytest.mark.slow
@pytest.mark.minutes(2)
def test_the_embedded_lm_task_learns_well_below_the_unigram_entropy(tmp_path):
    """`python -m src.run task=lm_char`: validation loss at least 1 nat per byte below the
    entropy of the training bytes' frequencies (3.27 nats with CPython 3.11's topics)."""
    result = run_cli(["task=lm_char"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    (path,) = (tmp_path / "outputs" / "runs" / "lm_char").glob("**/summary.json")
    summary = json.loads(path.read_text())
    train_windows, _ = CharCorpus(name="lm_char", **SMALL).datasets(tmp_path)
    entropy = unigram_entropy(train_windows.tokens, 256)
    assert entropy > 3.0
    assert summary["final"]["val/loss"] < entropy - 1.0
