"""Evaluate a run's checkpoint on a split: ``python -m src.eval <run_dir> [split=test]
[checkpoint=best|last] [key=value …]``.

The task and model are built from the run's resolved config (``config.yaml`` of its record, else
Hydra's ``.hydra/config.yaml``) exactly as training built them, the checkpoint's weights loaded
(``best.pt`` by default; ``last.pt``, with a note, for a run that has none), and the split
evaluated by the code the loop validates with (:mod:`src.engine.evaluation`). The result goes to
``<run_dir>/eval-<split>.json`` and one printed line; the record itself is never rewritten.
``key=value`` items override the run's config for this evaluation only (``trainer.device=cpu``,
``paths.data_dir=…``, ``trainer.eval_batches=null``). Bad input ends with one line and exit 2.

Detection runs are refused: mmengine trains and validates them (COCO mAP on val2017, in their
record), and COCO's test-dev labels are not public.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

import torch
from hydra.utils import get_class, instantiate
from omegaconf import DictConfig, OmegaConf

from src import attention
from src.engine import evaluation
from src.engine.experiment import processes
from src.engine.task import Task
from src.errors import ConfigError, message_of
from src.run import user_error

log = logging.getLogger(__name__)

OPTIONS = {"split": "val", "checkpoint": "best"}  # this command's own items, and their defaults
CONFIGS = ("config.yaml", ".hydra/config.yaml")  # the record's resolved config, then Hydra's


def parse(argv: list[str] | None) -> tuple[Path, dict[str, str], list[str]]:
    """``(run_dir, {"split", "checkpoint"}, config overrides)`` from the command line."""
    parser = argparse.ArgumentParser(
        prog="python -m src.eval", description="Evaluate a run's checkpoint on a split (see src/eval.py)."
    )
    parser.add_argument("run_dir", type=Path, help="the run folder (holds config.yaml and checkpoints/)")
    parser.add_argument(
        "items",
        nargs="*",
        default=[],
        metavar="key=value",
        help="split=val|test, checkpoint=best|last, or a key of the run's config",
    )
    args = parser.parse_args(argv)
    options, overrides = dict(OPTIONS), []
    for item in args.items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"{item!r} is not key=value (e.g. split=test, trainer.device=cpu)")
        if key in OPTIONS:
            options[key] = value
        else:
            overrides.append(item)
    return args.run_dir, options, overrides


def load_config(run_dir: Path, overrides: list[str]) -> DictConfig:
    """The run's resolved config with ``overrides`` (dotted keys the config has) applied."""
    if not run_dir.is_dir():
        raise ConfigError(f"no run folder {run_dir}")
    found = [run_dir / name for name in CONFIGS if (run_dir / name).is_file()]
    if not found:
        raise ConfigError(
            f"{run_dir} holds no run record (no {' or '.join(CONFIGS)}): give the folder of one run, "
            "e.g. outputs/runs/<task>/<backbone>/<variant>/seed=<n>/<overrides>"
        )
    cfg = OmegaConf.load(found[0])
    cfg.pop("hydra", None)
    for item in overrides:
        key = item.partition("=")[0]
        if OmegaConf.select(cfg, key, default=KeyError) is KeyError:
            raise ConfigError(f"{key} is not a key of the run's config ({found[0]}); check its spelling")
        cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist([item]))
    return cfg


def refuse_other_loops(cfg: DictConfig) -> None:
    """A task that trains outside the shared loop (detection, in mmengine) is not evaluated here."""
    task_class = get_class(cfg.task._target_)
    if task_class.fit is not Task.fit:
        raise ConfigError(
            f"task {cfg.task.name} trains and validates in its own loop (mmengine for detection): its "
            "val2017 COCO mAP is in the run's metrics.jsonl and summary.json, and COCO's test-dev labels "
            "are not public; python -m src.eval evaluates runs of the shared loop"
        )


def evaluate_run(run_dir: Path, split: str, which: str, overrides: list[str]) -> tuple[dict[str, Any], Path]:
    """Evaluate the run's ``which`` checkpoint on ``split``; the result and where it was written."""
    cfg = load_config(run_dir, overrides)
    refuse_other_loops(cfg)
    task = instantiate(cfg.task)
    task.check_split(split)
    which, path = evaluation.find_checkpoint(
        run_dir, which, note=lambda line: print(f"note: {line}"), best_step=recorded_best_step(run_dir)
    )
    with processes(cfg) as dist:
        dataset = task.eval_dataset(Path(cfg.paths.data_dir), split)  # before the model: LM's vocabulary
        model = task.build_model(cfg.backbone)
        attention.apply(model, attention.variant_from_config(cfg.attn))
        model.to(dist.device)
        autocast = torch.autocast(
            dist.device.type, dtype=torch.bfloat16, enabled=cfg.trainer.precision == "bf16"
        )
        batches = cfg.trainer.eval_batches
        result = evaluation.evaluate_checkpoint(
            task, model, dataset, split, which, path, dist, autocast, batches
        )
        written = evaluation.write_result(run_dir, result) if dist.main else None
    return result, written


def recorded_best_step(run_dir: Path) -> int | None:
    """The step of the best validation ``summary.json`` records (None without one)."""
    try:
        return (json.loads((run_dir / "summary.json").read_text()).get("best") or {}).get("step")
    except (OSError, ValueError, AttributeError):
        return None


def main(argv: list[str] | None = None) -> None:
    """The command: one line with the result, or one line with the error and exit status 2."""
    try:
        run_dir, options, overrides = parse(argv)
        result, written = evaluate_run(run_dir, options["split"], options["checkpoint"], overrides)
    except Exception as error:
        cause = user_error(error)  # Hydra's instantiate wraps what a task's constructor raises
        if cause is None:
            raise
        print(f"error: {message_of(cause)}", file=sys.stderr)
        sys.exit(2)
    if written is not None:
        print(evaluation.result_line(result, written))


if __name__ == "__main__":
    main()
