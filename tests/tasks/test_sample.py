"""``python -m src.sample RUN``: text from a language-model run, read as ``python -m src.eval``
reads it; seeded draws repeat, greedy decoding is the argmax, lengths are as asked, and a run of
another task is refused in one line."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from conftest import compose
from torch import nn

from src.engine import train
from src.sample import SEPARATOR, generate, load
from src.sample import main as sample_main

LM = [
    "task=lm_char",
    "task.seq_len=32",
    "task.batch_size=4",
    "task.eval_batch_size=8",
    "trainer.eval_batches=1",
]
SHORT = ["trainer.max_steps=3", "trainer.val_every=3", "trainer.monitor_every=0", "trainer.threads=1"]


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("sample")
    train(compose([*LM, *SHORT], root), root / "run")
    return root / "run"


def sample_cli(capsys, *args) -> tuple[int, list[str], str]:
    """(exit status, the samples printed, stderr) of ``python -m src.sample <args>`` in this process."""
    try:
        sample_main([str(a) for a in args])
        code = 0
    except SystemExit as exit_:
        code = exit_.code
    out = capsys.readouterr()
    return code, out.out.split(f"\n{SEPARATOR}\n")[:-1], out.err


def test_a_fixed_seed_prints_the_same_text_and_another_seed_other_text(lm_run, capsys):
    args = [lm_run, "--start", "The ", "--num-samples", "2", "--max-new-tokens", "24", "--temperature", "1.5"]
    code, first, err = sample_cli(capsys, *args, "--seed", "5")
    assert code == 0, err
    assert len(first) == 2 and all(text.startswith("The ") for text in first) and first[0] != first[1]
    assert sample_cli(capsys, *args, "--seed", "5")[1] == first
    assert sample_cli(capsys, *args, "--seed", "6")[1] != first


def test_temperature_0_and_top_k_1_are_the_argmax_decoded_by_hand(lm_run, capsys):
    loaded = load(lm_run)
    ids = loaded.tokenizer.encode_batch(["def "])[0]
    with torch.no_grad():
        for _ in range(12):
            logits = loaded.model(torch.tensor([ids[-loaded.model.block_size :]]))  # (1, N, V)
            ids.append(int(logits[0, -1].argmax()))
    by_hand = loaded.tokenizer.decode(ids)
    common = [lm_run, "--start", "def ", "--max-new-tokens", "12"]
    assert sample_cli(capsys, *common, "--temperature", "0")[1] == [by_hand]
    assert sample_cli(capsys, *common, "--top-k", "1", "--seed", "9")[1] == [by_hand]


class Always(nn.Module):
    """A model whose next token is always ``token``."""

    def __init__(self, token: int, vocab: int = 10) -> None:
        super().__init__()
        self.token, self.vocab = token, vocab

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # (B, N) -> (B, N, V)
        logits = torch.zeros(*ids.shape, self.vocab)
        logits[..., self.token] = 10.0
        return logits


def test_a_sample_has_max_new_tokens_or_ends_at_the_end_token(lm_run):
    loaded = load(lm_run)
    start = torch.tensor([[65, 66]])
    g = torch.Generator().manual_seed(0)
    assert len(generate(loaded.model, start, 40, 1.0, 200, g)) == 40  # past block_size=32: cropped
    assert generate(Always(7), start, 5, 1.0, None, g, eot=None) == [7] * 5
    assert generate(Always(7), start, 5, 1.0, None, g, eot=7) == []  # ends at the end token, unprinted


def test_a_run_that_is_not_a_language_model_and_bad_options_are_one_line(lm_run, tmp_path, capsys):
    digits = compose(["trainer.max_steps=1", "trainer.monitor_every=0", "trainer.eval_batches=1"], tmp_path)
    train(digits, tmp_path / "d")
    code, out, err = sample_cli(capsys, tmp_path / "d")
    assert code == 2 and out == [] and err.count("\n") == 1 and "not a language model" in err
    for bad in (["--max-new-tokens", "0"], ["--nope"], ["--start", f"FILE:{tmp_path / 'absent.txt'}"]):
        code, _, err = sample_cli(capsys, lm_run, *bad)
        assert code == 2 and err.count("\n") == 1 and err.startswith("error: "), bad
    code, _, err = sample_cli(capsys, tmp_path / "nothing")
    assert code == 2 and err.count("\n") == 1 and "no run folder" in err


def test_a_checkpoint_file_samples_as_its_run_does(lm_run, tmp_path, capsys):
    copy = tmp_path / "best.pt"
    shutil.copy(lm_run / "checkpoints" / "best.pt", copy)  # carries its run's config
    args = ["--start", "The ", "--max-new-tokens", "16", "--seed", "3"]
    code, from_file, err = sample_cli(capsys, copy, *args)
    assert code == 0, err
    assert from_file == sample_cli(capsys, lm_run, *args)[1]
