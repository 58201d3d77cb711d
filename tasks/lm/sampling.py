"""The work behind ``python -m tasks.lm.sample`` (:mod:`tasks.lm.sample`, whose docstring is the
account): a language-model run loaded as ``python -m src.eval`` loads it, and its samples drawn and
streamed. Kept apart from the command so that ``--help`` answers without importing torch."""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import torch
from hydra.utils import get_class, instantiate
from torch import Tensor, nn

from src.engine.loop import evaluation
from src.engine.loop.prepared import prepared
from src.errors import ConfigError

SEPARATOR = "-" * 40
#: The signals that stop sampling, after what was drawn is printed: SLURM's and the shell's.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGINT)
#: Tokens held back at most while their text ends in a partial character (a UTF-8 sequence split
#: between byte tokens): after that many, the text is printed as it decodes (with U+FFFD).
HOLD_AT_MOST = 8


@dataclass
class Loaded:
    """A language-model run ready to sample: its model (eval mode, on ``device``) and tokenizer."""

    model: nn.Module
    tokenizer: object  # tasks.lm.tokenizer.TextTokenizer
    device: torch.device
    step: int
    which: str


def load(run_dir: Path, which: str = "best", overrides: list[str] | None = None) -> Loaded:
    """The run's model with its checkpoint's weights, and its tokenizer, after the checks of
    ``python -m src.eval`` (:func:`src.engine.run_eval.load_config`); ``run_dir`` may be one checkpoint file
    instead, read as ``python -m src.eval <file.pt>`` reads it (``which`` is then unused)."""
    overrides = list(overrides or [])
    from src.engine.distributed import resolve_device
    from src.engine.run_eval import (
        carried,
        home_run,
        load_config,
        opened_file,
        print_note,
        read_file,
        recorded_best_step,
    )
    from tasks.lm.task import LanguageModelling

    if run_dir.is_file() or run_dir.suffix == ".pt":  # one checkpoint file, read as src.eval reads it
        state = read_file(run_dir)
        home = home_run(run_dir)
        recorded = load_config(home, overrides) if home else carried(run_dir, state, overrides)
    else:
        recorded = load_config(run_dir, overrides)
    cfg = recorded.cfg
    task_class = get_class(cfg.task._target_)  # a suite class: load_config checked every _target_
    if not issubclass(task_class, LanguageModelling):
        raise ConfigError(
            f"{run_dir} is a run of task {cfg.task.name}, not a language model: python -m tasks.lm.sample "
            "samples runs of lm_char, lm_tinystories, lm_wikitext103"
        )
    if run_dir.is_file():
        opened = opened_file(run_dir, state, recorded.owners)
    else:
        best_step = recorded_best_step(run_dir)
        opened = evaluation.open_checkpoint(run_dir, which, print_note, best_step, recorded.owners)
    # as evaluation builds it (the validation split sets the run's tokenizer and the model's
    # vocabulary), then the checkpoint's weights
    task, _, model = prepared(cfg, instantiate(cfg.task), split="val")
    evaluation.load_weights(model, opened)
    device = resolve_device(cfg.trainer.device, 0)  # one process: no process group to start
    return Loaded(model.to(device).eval(), task.tokenizer, device, opened.step, opened.which)


def prompt_ids(tokenizer, start: str | None) -> list[int]:
    """The prompt's token ids: ``start`` (or the file ``FILE:path`` names) encoded; without one,
    the end-of-text token, or a newline where the tokenizer has none."""
    if start is not None and start.startswith("FILE:"):
        path = Path(start.removeprefix("FILE:"))
        try:
            start = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise ConfigError(f"--start FILE:{path}: cannot read it ({type(error).__name__})") from error
    if not start:
        return [tokenizer.eot] if tokenizer.eot is not None else tokenizer.encode_batch(["\n"])[0]
    return tokenizer.encode_batch([start])[0]


@torch.no_grad()
def generate(
    model: nn.Module,
    ids: Tensor,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
    eot: int | None = None,
    on_token: Callable[[int], None] | None = None,
) -> list[int]:
    """Up to ``max_new_tokens`` new token ids after ``ids`` (1, N), drawn as the module docstring
    says; ends early, without it, at ``eot``. ``on_token(id)`` is called with each as it is drawn."""
    block = getattr(model, "block_size", None)
    new: list[int] = []
    for _ in range(max_new_tokens):
        context = ids if block is None else ids[:, -block:]
        logits = model(context)[:, -1, :].float()  # (1, V)
        if temperature == 0 or top_k == 1:
            token = logits.argmax(-1, keepdim=True)  # (1, 1)
        else:
            if top_k:
                kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, [-1]]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            token = torch.multinomial(tempered(logits, temperature), 1, generator=generator)
        if eot is not None and int(token) == eot:
            break
        new.append(int(token))
        if on_token is not None:
            on_token(new[-1])
        ids = torch.cat([ids, token], dim=1)
    return new


def tempered(logits: Tensor, temperature: float) -> Tensor:
    """``softmax(logits / temperature)`` (1, V), in float64 after subtracting the largest logit:
    every finite temperature above 0 gives probabilities (a tiny one the argmax's, ties shared),
    never the NaN that ``logits / 1e-300`` (infinite in float32) would."""
    shifted = logits.double() - logits.max(-1, keepdim=True).values.double()  # (1, V), ≤ 0
    return torch.softmax(shifted / temperature, -1)


class Printer:
    """One sample's text on ``out`` as its tokens come: each token's text printed and flushed as
    soon as the tokens since the last print decode to whole characters (a byte tokenizer splits
    a character over several tokens; :data:`HOLD_AT_MOST` of them at most are held back)."""

    def __init__(self, tokenizer, out: TextIO) -> None:
        self.tokenizer, self.out = tokenizer, out
        self.held: list[int] = []  # tokens whose text is not out yet

    def add(self, token: int) -> None:
        self.held.append(token)
        text = self.tokenizer.decode(self.held)
        if text.endswith("\ufffd") and len(self.held) < HOLD_AT_MOST:
            return  # a character split between tokens: wait for the rest
        self._write(text)

    def flush(self) -> None:
        """Print what is held, whole or not (the sample ended, or a signal stopped it)."""
        if self.held:
            self._write(self.tokenizer.decode(self.held))

    def _write(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()
        self.held = []


class Stopped(Exception):
    """A signal of :data:`STOP_SIGNALS` arrived while sampling."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def raise_stopped(signum: int, frame) -> None:
    raise Stopped(signum)


@dataclass
class Tally:
    """How far :func:`write_samples` got: samples finished, new tokens drawn in all."""

    samples: int = 0
    tokens: int = 0


def start_ids(loaded: Loaded, args: argparse.Namespace) -> list[int]:
    """The prompt's token ids (:func:`prompt_ids`); a :class:`ConfigError` where there are none."""
    start = prompt_ids(loaded.tokenizer, args.start)
    if not start:
        raise ConfigError("--start encodes to no tokens; give some text")
    return start


def write_samples(
    loaded: Loaded,
    args: argparse.Namespace,
    start: list[int],
    out: TextIO | None = None,
    tally: Tally | None = None,
) -> Tally:
    """``args.num_samples`` texts on ``out``, each the prompt ``start`` and what follows it,
    streamed (:class:`Printer`) and followed by a line of dashes (``out``: stdout where None);
    ``tally`` counts them as they go. A :class:`Stopped` (a signal) passes once what was drawn is
    printed and its line ended."""
    out, tally = out or sys.stdout, tally or Tally()
    generator = torch.Generator(loaded.device).manual_seed(args.seed)
    ids = torch.tensor([start], dtype=torch.long, device=loaded.device)  # (1, N)
    eot = getattr(loaded.tokenizer, "eot", None)
    for _ in range(args.num_samples):
        printer = Printer(loaded.tokenizer, out)

        def drawn(token: int, printer: Printer = printer) -> None:
            tally.tokens += 1
            printer.add(token)

        for token in (t for t in start if t != eot):  # the default prompt (the end token) is not text
            printer.add(token)
        try:
            generate(
                loaded.model, ids, args.max_new_tokens, args.temperature, args.top_k, generator, eot, drawn
            )
        except Stopped:
            printer.flush()
            out.write("\n")
            out.flush()
            raise
        printer.flush()
        out.write(f"\n{SEPARATOR}\n")
        out.flush()
        tally.samples += 1
    return tally
