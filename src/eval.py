"""Evaluate a run's checkpoint on a split: ``python -m src.eval <run_dir|file.pt> [split=test]
[checkpoint=best|last] [key=value …]``.

A run folder is data, perhaps sent by someone else, so nothing is built from it unchecked: its
resolved config (the record's ``config.yaml``) may name only the classes the suite's own configs
build (:mod:`src.engine.record.safe_config`), it must be the configuration its ``identity.json``
describes (a hand-edited file is refused), and its data folder is the absolute one the run read,
wherever the command runs from. Then the task and model are built exactly as training built them,
the checkpoint's weights loaded (``best.pt`` by default; ``last.pt``, with a note, where there is
none or it is unreadable, which is set aside as resume does), provided the checkpoint was written
by this record (its identity: a ``best.pt`` copied from another run is refused), and the split
evaluated by the code the loop validates with (:mod:`src.engine.loop.evaluation`). The result goes to
``<run_dir>/eval-<split>.json`` and one printed line; the record itself is never rewritten.

``key=value`` items override the run's config for this evaluation only (``trainer.device=cpu``,
``paths.data_dir=…``, ``trainer.eval_batches=null``), and the result records them. One that
changes what is measured (another data folder, ``task.val_fraction``) changes the evaluation's
identity: its result goes to ``eval-<split>.<identity>.json`` beside the run's own, which the
report does not use. Bad input ends with one line and exit 2.

``python -m src.eval <file.pt> [split=…] [run=<run_dir>] [key=value …]`` evaluates one checkpoint
file (as timm's ``validate.py --checkpoint``), exactly that file, with no fallback:

* in a run folder (``<run>/checkpoints/best.pt``): that run's config, and the file must carry its
  identity; ``best.pt``/``last.pt`` give the result ``checkpoint=best|last`` gives, in the same
  ``eval-<split>.json``; another file (``previous.pt``, a kept copy) goes to
  ``eval-<split>.<file stem>.json`` beside it, which the report does not use;
* copied elsewhere: the config it carries (checkpoints carry their run's resolved config), checked
  as a record's is (only the suite's ``_target_`` keys, and it must be the config its identity names),
  or the config of the run folder ``run=`` names (whose identity the file must carry). A file that
  carries none (written before checkpoints carried it) and no ``run=``: refused, saying to pass
  ``run=``. The result goes beside the file: ``<file stem>.eval-<split>.json``.

Detection runs are refused: mmengine trains and validates them (COCO mAP on val2017, in their
record), and COCO's test-dev labels are not public.

When the run logged to W&B (its config's ``logger=wandb``, or ``logger=wandb`` on this command
line), the result is also added to that W&B run's summary (``eval/<split>/<metric>``): the run is
resumed by the id its ``identity.json`` holds, so the runs table shows training and evaluation
side by side (:func:`src.engine.run_eval.send_to_wandb`); ``logger=none`` sends nothing.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from src.command import command_parser, run_command
from src.errors import ConfigError

# this command's own items, and their defaults
OPTIONS = {"split": "val", "checkpoint": None, "run": None, "logger": ""}


def command_line() -> argparse.ArgumentParser:
    """The command line (see the module's docstring)."""
    parser = command_parser(__spec__.name, __doc__)
    parser.add_argument(
        "run_dir", type=Path, help="the run folder (holds config.yaml and checkpoints/), or a checkpoint file"
    )
    parser.add_argument(
        "items",
        nargs="*",
        default=[],
        metavar="key=value",
        help="split=val|test, checkpoint=best|last, run=<run_dir> (a file's run), logger=wandb|none, "
        "or a key of its config",
    )
    return parser


def options_of(args: argparse.Namespace) -> tuple[Path, dict[str, str], list[str]]:
    """``(run_dir, {"split", "checkpoint", …}, config overrides)`` from the parsed command line."""
    options, overrides = dict(OPTIONS), []
    for item in args.items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"{item!r} is not key=value (e.g. split=test, trainer.device=cpu)")
        if key in OPTIONS:
            if key == "logger" and value not in ("wandb", "none"):
                raise ConfigError(f"logger={value}: no such logger (logger=wandb or logger=none)")
            options[key] = value
        else:
            overrides.append(item)
    return args.run_dir, options, overrides


def main(argv: list[str] | None = None) -> int:
    """The command: one line with the result, or one line with the error and exit status 2."""
    return run_command(command_line(), evaluate, argv)


def evaluate(args: argparse.Namespace) -> None:
    """The command's work: a run folder's checkpoint, or one checkpoint file, evaluated (torch and
    the suite imported here, after the command line parsed: ``--help`` stays quick)."""
    from src.engine.loop import evaluation
    from src.engine.run_eval import evaluate_file, evaluate_run

    target, options, overrides = options_of(args)
    run = Path(options["run"]) if options["run"] else None
    if target.is_dir() or (not target.exists() and target.suffix != ".pt"):
        if run is not None:
            raise ConfigError(f"run={run} names the run of a checkpoint file; {target} is a folder")
        result, written = evaluate_run(
            target, options["split"], options["checkpoint"] or "best", overrides, options["logger"]
        )
    elif options["checkpoint"] is not None:
        raise ConfigError(f"checkpoint= picks a file of a run folder; {target} is already one file")
    else:
        result, written = evaluate_file(target, options["split"], run, overrides)
    if written is not None:
        print(evaluation.result_line(result, written))


if __name__ == "__main__":
    raise SystemExit(main())
