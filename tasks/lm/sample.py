"""Sample text from a language-model run: ``python -m tasks.lm.sample <run_dir|file.pt>
[--start TEXT|FILE:path] [--num-samples N] [--max-new-tokens N] [--temperature T] [--top-k K]
[--seed S] [--checkpoint best|last] [key=value …]`` (after nanoGPT's ``sample.py``).

The run folder is read as ``python -m src.eval`` reads it (:func:`src.eval.load_config`): its
config may name only the suite's own classes, it must be the configuration its identity names, and
the checkpoint must carry that identity; a checkpoint file is read as ``python -m src.eval
<file.pt>`` reads it (its run folder's config, or the config it carries). The task must be a causal
language model (:class:`tasks.lm.task.LanguageModelling`); another run is refused in one line. The
task, its tokenizer (the run's: bytes, its trained BPE, or GPT-2's files under the run's data
folder) and the model are built as training built them, the variant applied, the checkpoint's
weights loaded.

Decoding: each new token is drawn from the softmax of the last position's logits divided by
``temperature``, kept to the ``top_k`` most likely where given; ``--temperature 0`` or
``--top-k 1`` is greedy (the argmax). The context is cut to the model's ``block_size``. A sample
ends after ``max_new_tokens`` tokens, or earlier at the tokenizer's end-of-text token where it has
one (GPT-2's and the trained BPE's ``<|endoftext|>``; the byte tokenizer has none), which is not
printed. The start defaults to the end-of-text token, or a newline for bytes. ``--seed`` fixes the
draws: the same command prints the same text (on the same device). The softmax is taken in
float64 after subtracting the largest logit, so that any finite temperature above 0, however
small (``1e-300``), draws from the limit it tends to (the argmax) instead of dividing by zero.

Samples go to stdout as they are drawn (each token's text flushed as soon as it decodes to whole
characters), separated by a line of dashes; notes to stderr. ``--max-new-tokens`` and
``--num-samples`` have ceilings (:data:`MAX_NEW_TOKENS`, :data:`MAX_SAMPLES`); SIGTERM, SIGUSR1,
SIGUSR2 or SIGINT stop the sampling at the next token, after what was drawn is printed, with one
line on stderr and exit status 128+signal. Bad input (a value out of range, a NaN temperature, a
``--start`` that is not UTF-8) is one ``error:`` line and exit status 2, before the model is read.
"""

from __future__ import annotations

import argparse
import math
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import torch
from hydra.utils import get_class, instantiate
from torch import Tensor, nn

from src.command import command_parser, run_command
from src.engine.loop import evaluation
from src.engine.loop.prepared import prepared
from src.errors import ConfigError

SEPARATOR = "-" * 40
#: [reading] The most new tokens one sample may ask for: a book's worth of characters (about 400 KB
#: at GPT-2's 4 bytes a token), minutes of a small model on a CPU; more is a typo
#: (``--max-new-tokens 99999999999999999999`` ran for ever). nanoGPT's own default is 500.
MAX_NEW_TOKENS = 100_000
#: [reading] The most samples one command draws (each streamed; a loop of commands draws more).
MAX_SAMPLES = 1_000
#: The signals that stop sampling, after what was drawn is printed: SLURM's and the shell's.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGINT)
#: Tokens held back at most while their text ends in a partial character (a UTF-8 sequence split
#: between byte tokens): after that many, the text is printed as it decodes (with U+FFFD).
HOLD_AT_MOST = 8


class Parser(argparse.ArgumentParser):
    """argparse whose usage errors are one :class:`ConfigError` (one line, exit status 2)."""

    def error(self, message: str):  # type: ignore[override]
        raise ConfigError(f"{message} ({self.prog} --help)")


def command_line() -> Parser:
    """The command line (see the module's docstring)."""
    parser = command_parser(__spec__.name, __doc__, Parser)
    parser.add_argument(
        "run_dir", type=Path, help="the run folder of a language-model run, or a checkpoint file"
    )
    parser.add_argument("items", nargs="*", metavar="key=value", help="a key of the run's config")
    parser.add_argument("--start", default=None, help="the prompt, or FILE:path to read it from a file")
    parser.add_argument("--num-samples", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=200)
    parser.add_argument("--temperature", type=float, default=0.8, help="0: greedy")
    parser.add_argument("--top-k", type=int, default=200, help="keep the k most likely (0: all)")
    parser.add_argument("--seed", type=int, default=1337)
    parser.add_argument("--checkpoint", choices=evaluation.CHECKPOINTS, default="best")
    return parser


def check_arguments(args: argparse.Namespace) -> None:
    """A :class:`ConfigError` for a count, temperature, seed or text the command cannot use."""
    for name, ceiling in (("num_samples", MAX_SAMPLES), ("max_new_tokens", MAX_NEW_TOKENS)):
        value = getattr(args, name)
        if value < 1:
            raise ConfigError(f"--{name.replace('_', '-')}={value} must be at least 1")
        if value > ceiling:
            raise ConfigError(
                f"--{name.replace('_', '-')}={value} is more than the {ceiling:,} one command draws: "
                "ask for fewer (and run the command again for more)"
            )
    if not math.isfinite(args.temperature) or args.temperature < 0:
        raise ConfigError(f"--temperature {args.temperature}: give a finite number, at least 0 (0: greedy)")
    if args.top_k < 0:
        raise ConfigError(f"--top-k {args.top_k} must not be negative (0: all)")
    if not 0 <= args.seed < 2**64:
        raise ConfigError(f"--seed {args.seed}: give an integer from 0 to 2**64 - 1")
    for what, text in (("--start", args.start or ""), *(("key=value", item) for item in args.items)):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # bytes that are not UTF-8 arrive as lone surrogates
            raise ConfigError(
                f"{what} holds bytes that are not UTF-8 text ({text.encode('utf-8', 'backslashreplace')!r}): "
                "give UTF-8 text, or FILE:path to a UTF-8 file"
            ) from None
    for item in args.items:
        if "=" not in item or item.startswith("="):
            raise ConfigError(f"{item!r} is not key=value (e.g. trainer.device=cpu)")


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
    ``python -m src.eval`` (:func:`src.eval.load_config`); ``run_dir`` may be one checkpoint file
    instead, read as ``python -m src.eval <file.pt>`` reads it (``which`` is then unused)."""
    overrides = list(overrides or [])
    from src.engine.distributed import resolve_device
    from src.eval import (
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


def main(argv: list[str] | None = None) -> int:
    """The command: the samples, streamed; one line with the error and exit status 2; or, on a
    signal, what was drawn, one line and exit status 128+signal."""
    return run_command(command_line(), sample, argv, intermixed=True)


def sample(args: argparse.Namespace) -> int:
    """The command's work: the run loaded, its samples streamed; 128+signal where one stops it."""
    check_arguments(args)
    loaded = load(args.run_dir, args.checkpoint, args.items)
    start = start_ids(loaded, args)
    print(f"note: {loaded.which}.pt, step {loaded.step}, on {loaded.device}", file=sys.stderr, flush=True)
    tally = Tally()
    previous = {signum: signal.signal(signum, raise_stopped) for signum in STOP_SIGNALS}
    try:
        write_samples(loaded, args, start, tally=tally)
    except Stopped as stop:
        print(
            f"stopped by {stop} after {tally.samples} of {args.num_samples} samples and {tally.tokens} new "
            "tokens in all: what was drawn is printed above",
            file=sys.stderr,
            flush=True,
        )
        return 128 + stop.signum
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
