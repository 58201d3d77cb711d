"""Sample text from a language-model run: ``python -m src.sample <run_dir|file.pt>
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
draws: the same command prints the same text (on the same device). Samples go to stdout, separated
by a line of dashes; notes to stderr.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from hydra.utils import get_class, instantiate
from torch import Tensor, nn

from src.engine.loop import evaluation
from src.engine.loop.model import build_model
from src.errors import ConfigError, message_of

SEPARATOR = "-" * 40


class Parser(argparse.ArgumentParser):
    """argparse whose usage errors are one :class:`ConfigError` (one line, exit status 2)."""

    def error(self, message: str):  # type: ignore[override]
        raise ConfigError(f"{message} (python -m src.sample --help)")


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = Parser(prog="python -m src.sample", description="Sample text from a language-model run.")
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
    args = parser.parse_intermixed_args(argv)
    for name in ("num_samples", "max_new_tokens"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')}={getattr(args, name)} must be at least 1")
    if args.temperature < 0 or args.top_k < 0:
        raise ConfigError("--temperature and --top-k must not be negative")
    for item in args.items:
        if "=" not in item or item.startswith("="):
            raise ConfigError(f"{item!r} is not key=value (e.g. trainer.device=cpu)")
    return args


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
            f"{run_dir} is a run of task {cfg.task.name}, not a language model: python -m src.sample "
            "samples runs of lm_char, lm_tinystories, lm_wikitext103"
        )
    if run_dir.is_file():
        opened = opened_file(run_dir, state, recorded.owners)
    else:
        best_step = recorded_best_step(run_dir)
        opened = evaluation.open_checkpoint(run_dir, which, print_note, best_step, recorded.owners)
    task = instantiate(cfg.task)
    task.datasets(Path(cfg.paths.data_dir))  # the run's tokenizer (and the model's vocabulary)
    model = build_model(cfg, task)  # as training built it, before the checkpoint's weights
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
) -> list[int]:
    """Up to ``max_new_tokens`` new token ids after ``ids`` (1, N), drawn as the module docstring
    says; ends early, without it, at ``eot``."""
    block = getattr(model, "block_size", None)
    new: list[int] = []
    for _ in range(max_new_tokens):
        context = ids if block is None else ids[:, -block:]
        logits = model(context)[:, -1, :].float()  # (1, V)
        if temperature == 0 or top_k == 1:
            token = logits.argmax(-1, keepdim=True)  # (1, 1)
        else:
            logits = logits / temperature
            if top_k:
                kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, [-1]]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            token = torch.multinomial(torch.softmax(logits, -1), 1, generator=generator)
        if eot is not None and int(token) == eot:
            break
        new.append(int(token))
        ids = torch.cat([ids, token], dim=1)
    return new


def samples(loaded: Loaded, args: argparse.Namespace) -> list[str]:
    """``args.num_samples`` texts, each the prompt and what follows it."""
    start = prompt_ids(loaded.tokenizer, args.start)
    if not start:
        raise ConfigError("--start encodes to no tokens; give some text")
    generator = torch.Generator(loaded.device).manual_seed(args.seed)
    ids = torch.tensor([start], dtype=torch.long, device=loaded.device)  # (1, N)
    eot = getattr(loaded.tokenizer, "eot", None)
    texts = []
    for _ in range(args.num_samples):
        new = generate(loaded.model, ids, args.max_new_tokens, args.temperature, args.top_k, generator, eot)
        shown = [t for t in start if t != eot]  # the default prompt (the end token) is not text
        texts.append(loaded.tokenizer.decode(shown + new))
    return texts


def main(argv: list[str] | None = None) -> None:
    """The command: the samples, or one line with the error and exit status 2."""
    from src.run import user_error

    try:
        args = parse(argv)
        loaded = load(args.run_dir, args.checkpoint, args.items)
        texts = samples(loaded, args)
    except Exception as error:
        cause = user_error(error)
        if cause is None:
            raise
        print(f"error: {message_of(cause)}", file=sys.stderr)
        sys.exit(2)
    print(f"note: {loaded.which}.pt, step {loaded.step}, on {loaded.device}", file=sys.stderr, flush=True)
    for text in texts:
        print(text)
        print(SEPARATOR)


if __name__ == "__main__":
    main()
