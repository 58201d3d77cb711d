"""The LM tasks' missing-data messages: at most three lines, naming every path looked at and
the command that gets the files."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_lm import tinystories, wikitext

from src.errors import DataError
from tasks.lm.tokenizer import load_gpt2


def message(call) -> str:
    with pytest.raises(DataError) as missing:
        call()
    return str(missing.value)


def test_a_missing_corpus_and_tokenizer_are_three_lines_naming_the_paths(tmp_path):
    text = message(lambda: tinystories().datasets(tmp_path))
    root, gpt2 = tmp_path / "tinystories", tmp_path / "tokenizers" / "gpt2"
    assert len(text.splitlines()) <= 3
    for path in (root / "train" / "state.json", root / "train-*.parquet", root / "data" / "train-*.parquet"):
        assert str(path) in text
    assert f"{gpt2}/vocab.json + merges.txt" in text and f"{gpt2}/tokenizer.json" in text
    assert "load_dataset('roneneldan/TinyStories').save_to_disk('tinystories')" in text
    assert "task.tokenizer=bpe" in text


def test_a_missing_config_split_and_missing_bpe_files_name_their_paths(tmp_path):
    (tmp_path / "tokenizers" / "gpt2").mkdir(parents=True)
    (tmp_path / "tokenizers" / "gpt2" / "tokenizer.json").write_text("{}")  # present: the split alone
    text = message(lambda: wikitext().datasets(tmp_path))
    assert len(text.splitlines()) <= 2
    assert str(tmp_path / "wikitext103" / "wikitext-103-raw-v1" / "train-*.parquet") in text
    assert "load_dataset('Salesforce/wikitext', 'wikitext-103-raw-v1')" in text
    folder = Path(tmp_path / "elsewhere")
    alone = message(lambda: load_gpt2(folder))
    assert len(alone.splitlines()) <= 3 and f"{folder}/encoder.json + vocab.bpe" in alone
    assert f"--local-dir {folder}" in alone and "task.tokenizer=bpe" in alone
