"""``python -m tasks.lm.sample RUN``: text from a language-model run, read as ``python -m src.eval``
reads it; seeded draws repeat, greedy decoding is the argmax, lengths are as asked, and a run of
another task is refused in one line."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import ROOT, compose, main_in_process, one_error_line
from torch import nn

from src.engine import train
from tasks.lm.sample import main as sample_main
from tasks.lm.sampling import SEPARATOR, generate, load

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


def sample(capsys, *args) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of ``python -m tasks.lm.sample <args>`` in this process."""
    return main_in_process(sample_main, capsys, *args)


def sample_cli(capsys, *args) -> tuple[int, list[str], str]:
    """(exit status, the samples printed, stderr) of ``python -m tasks.lm.sample <args>`` in this process."""
    code, out, err = sample(capsys, *args)
    return code, out.split(f"\n{SEPARATOR}\n")[:-1], err


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


# -- issue 39: ceilings, streaming, a signal, and the minor cases ----------------------------


def test_max_new_tokens_has_a_ceiling(tmp_path, capsys):
    """tasks.lm.sample --max-new-tokens 99999999999999999999 ran for ever: now one line, exit 2, before
    any run folder is read (here there is none); so does --num-samples beyond its own."""
    code, out, err = sample(capsys, tmp_path / "no-run", "--max-new-tokens", "99999999999999999999")
    assert code == 2 and out == "" and "is more than the 100,000 one command draws" in one_error_line(err)
    code, out, err = sample(capsys, tmp_path / "no-run", "--num-samples", "1000001")
    assert code == 2 and "is more than the 1,000 one command draws" in one_error_line(err)


def test_a_nan_temperature_is_one_line_and_a_tiny_one_is_the_argmax(lm_run, capsys):
    """tasks.lm.sample --temperature nan or 1e-300 were tracebacks: nan (and inf) are now one line and
    exit 2; 1e-300 draws the limit it tends to, the greedy text, whatever the seed."""
    for bad in ("nan", "inf", "-1"):
        code, out, err = sample(capsys, lm_run, "--temperature", bad)
        assert code == 2 and out == "" and "--temperature" in one_error_line(err)
    common = [lm_run, "--start", "The ", "--max-new-tokens", "20"]
    code, greedy, err = sample(capsys, *common, "--temperature", "0")
    assert code == 0, err
    for seed in ("1", "2"):
        code, tiny, err = sample(capsys, *common, "--temperature", "1e-300", "--seed", seed)
        assert code == 0, err
        assert tiny == greedy


def test_a_start_that_is_not_utf8_is_one_line(lm_run, capsys):
    """Invalid UTF-8 in --start was a traceback: one line, exit 2 (argv's bytes 0xff arrive as a
    lone surrogate, as Python decodes them); the same bytes through a real argv too."""
    code, out, err = sample(capsys, lm_run, "--start", "caf\udcff")
    assert code == 2 and out == "" and "--start holds bytes that are not UTF-8" in one_error_line(err)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "tasks.lm.sample", str(lm_run), "--start", b"caf\xff"],
        cwd=ROOT, env=env, capture_output=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2 and b"not UTF-8" in done.stderr and done.stdout == b""


def test_samples_stream_and_a_signal_keeps_what_was_drawn(lm_run):
    """tasks.lm.sample printed nothing until the end and lost everything on SIGTERM: its text now comes
    as it is drawn, and SIGTERM ends it with that text printed, one line and status 143."""
    import select
    import signal

    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    args = [str(lm_run), "--start", "The ", "--max-new-tokens", "100000", "--temperature", "1.0"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "tasks.lm.sample", *args],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        early = b""
        deadline = time.monotonic() + 90
        while len(early) < 40 and time.monotonic() < deadline:  # the prompt and some drawn text
            ready, _, _ = select.select([proc.stdout], [], [], deadline - time.monotonic())
            if not ready:
                break
            early += os.read(proc.stdout.fileno(), 4096)
        assert len(early) >= 40, "nothing streamed"
        assert proc.poll() is None  # 100,000 tokens: still drawing
        proc.send_signal(signal.SIGTERM)
        rest, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM
    text = (early + rest).decode("utf-8", errors="replace")
    assert text.startswith("The ") and text.endswith("\n")
    stopped = err.decode().strip().splitlines()[-1]
    assert stopped.startswith("stopped by SIGTERM after 0 of 1 samples and ")
    drawn = int(stopped.split("samples and ")[1].split()[0])
    assert 0 < drawn < 100_000 and len(text) > len("The ") + 1  # some drawn, and printed


def test_streamed_text_is_the_text_decoded_at_once():
    """The streaming printer on a byte tokenizer: thousands of random texts with 1- to 4-byte
    characters, fed a byte at a time, print exactly what decoding all the bytes at once gives."""
    import io
    import random

    from tasks.lm.sampling import Printer
    from tasks.lm.tokenizer import ByteTokenizer

    rng = random.Random(0)
    alphabet = "aZ \n0é€ßж中😀𝄞"
    tokenizer = ByteTokenizer()
    for _ in range(3000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        ids = list(text.encode("utf-8"))
        out = io.StringIO()
        printer = Printer(tokenizer, out)
        for token in ids:
            printer.add(token)
        printer.flush()
        assert out.getvalue() == text == tokenizer.decode(ids)
    out = io.StringIO()
    printer = Printer(tokenizer, out)
    printer.add(0xE2)  # the first byte of €: held, not printed as U+FFFD
    assert out.getvalue() == ""
    printer.add(0x82)
    printer.add(0xAC)
    assert out.getvalue() == "€"
