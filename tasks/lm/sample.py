"""Sample text from a language-model run: ``python -m tasks.lm.sample <run_dir|file.pt>
[--start TEXT|FILE:path] [--num-samples N] [--max-new-tokens N] [--temperature T] [--top-k K]
[--seed S] [--checkpoint best|last] [key=value …]`` (after nanoGPT's ``sample.py``).

The run folder is read as ``python -m src.eval`` reads it (:func:`src.engine.run_eval.load_config`): its
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
import sys
from pathlib import Path

from src.command import command_parser, run_command
from src.errors import ConfigError

#: [reading] The most new tokens one sample may ask for: a book's worth of characters (about 400 KB
#: at GPT-2's 4 bytes a token), minutes of a small model on a CPU; more is a typo
#: (``--max-new-tokens 99999999999999999999`` ran for ever). nanoGPT's own default is 500.
MAX_NEW_TOKENS = 100_000
#: [reading] The most samples one command draws (each streamed; a loop of commands draws more).
MAX_SAMPLES = 1_000


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
    parser.add_argument("--checkpoint", choices=("best", "last"), default="best")
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


def main(argv: list[str] | None = None) -> int:
    """The command: the samples, streamed; one line with the error and exit status 2; or, on a
    signal, what was drawn, one line and exit status 128+signal."""
    return run_command(command_line(), sample, argv, intermixed=True)


def sample(args: argparse.Namespace) -> int:
    """The command's work: the run loaded, its samples streamed; 128+signal where one stops it
    (torch and the suite imported here, after the arguments are checked: ``--help`` stays quick)."""
    check_arguments(args)
    import signal

    from tasks.lm.sampling import STOP_SIGNALS, Stopped, Tally, load, raise_stopped, start_ids, write_samples

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
