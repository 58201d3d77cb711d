"""Evaluate a run's checkpoint on a split: ``python -m src.eval <run_dir> [split=test]
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

Detection runs are refused: mmengine trains and validates them (COCO mAP on val2017, in their
record), and COCO's test-dev labels are not public.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from hydra.utils import get_class, instantiate
from omegaconf import DictConfig, OmegaConf

from src.engine.experiment import processes
from src.engine.loop import evaluation
from src.engine.loop.model import build_model
from src.engine.record.files import RunRecord
from src.engine.record.identity import Identity
from src.engine.record.safe_config import check_buildable
from src.engine.schema import check_values
from src.engine.task import Task
from src.errors import ConfigError, message_of
from src.run import user_error

log = logging.getLogger(__name__)

OPTIONS = {"split": "val", "checkpoint": "best"}  # this command's own items, and their defaults
CONFIG = "config.yaml"  # the record's resolved config


@dataclass
class Recorded:
    """What an evaluation builds from: the record's config with the record's data folder and the
    command line's overrides, the hash of that configuration's identity, the record's identity
    hash, and the overrides as given."""

    cfg: DictConfig
    identity: str
    record_identity: str
    overrides: list[str]
    owners: set[str]  # the identity hashes the record's checkpoints may carry


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


def load_config(run_dir: Path, overrides: list[str]) -> Recorded:
    """The run's recorded config, checked before anything is built from it: it names only what the
    suite's configs build (:func:`check_buildable`: a run folder is data), and it is the
    configuration the record's ``identity.json`` describes, whose absolute data folder it reads
    (not ``./data`` from wherever the command runs). Then ``overrides`` (dotted keys the config
    has), checked the same way."""
    if not run_dir.is_dir():
        raise ConfigError(f"no run folder {run_dir}")
    path = run_dir / CONFIG
    if not path.is_file():
        raise ConfigError(
            f"{run_dir} holds no run record (no {CONFIG}): give the folder of one run, "
            "e.g. outputs/runs/<task>/<backbone>/<variant>/seed=<n>"
        )
    tree = read_tree(path)
    tree.pop("hydra", None)
    check_buildable(tree, path)
    recorded, meta = RunRecord(run_dir, enabled=False).recorded_identity()
    cfg = OmegaConf.create(tree)
    owners = {recorded.hash} if recorded is not None else set()  # what the record's checkpoints may carry
    if meta:
        if meta.get("hash") not in (recorded.hash, raw_hash(meta.get("config"))):
            raise ConfigError(
                f"{run_dir / 'identity.json'} is damaged: its hash is not its config's; refused"
            )
        owners.add(meta["hash"])  # as written, before a class in it moved (identity.MOVED_TARGETS)
        data_dir = (recorded.config.get("paths") or {}).get("data_dir")
        if data_dir is not None:
            cfg.paths.data_dir = data_dir  # absolute, as the run read it
        differs = recorded.differences(Identity.of(cfg))
        if differs:
            listed = "; ".join(f"{k}: {_show(a)} → {_show(b)}" for k, (a, b) in list(differs.items())[:6])
            raise ConfigError(
                f"{path} is not the configuration its record ran (identity.json → config.yaml: {listed}): "
                "the file was edited or replaced; refused. To evaluate other settings, pass them as key=value"
            )
    else:
        log.warning(
            "%s has no identity.json (a record older than identities): its data folder is read as given",
            run_dir,
        )
    record_identity = recorded.hash if recorded is not None else Identity.of(cfg).hash
    for item in overrides:
        key = item.partition("=")[0]
        if OmegaConf.select(cfg, key, default=KeyError) is KeyError:
            raise ConfigError(f"{key} is not a key of the run's config ({path}); check its spelling")
        cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist([item]))
    check_buildable(OmegaConf.to_container(cfg, resolve=False), "the command line's overrides")
    cfg.paths.data_dir = os.path.abspath(str(cfg.paths.data_dir))
    check_values(cfg)
    return Recorded(cfg, Identity.of(cfg).hash, record_identity, list(overrides), owners or {record_identity})


def raw_hash(config: Any) -> str:
    """The hash :class:`Identity` gave ``config`` when it was written, before any class it names
    moved (the identity compares the moved class's new path)."""
    text = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def read_tree(path: Path) -> dict[str, Any]:
    """A YAML file as a plain mapping, unresolved; one :class:`ConfigError` when it is not one."""
    try:
        tree = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    except Exception as error:  # noqa: BLE001  YAML's and OmegaConf's parse errors
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ConfigError(f"{path} is not a readable config ({first})") from error
    if not isinstance(tree, dict):
        raise ConfigError(f"{path} is not a config (a mapping of keys), it holds a {type(tree).__name__}")
    return tree


def _show(value: Any) -> str:
    return json.dumps(value, default=str)


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
    recorded = load_config(run_dir, overrides)
    cfg = recorded.cfg
    refuse_other_loops(cfg)
    task = instantiate(cfg.task)
    task.check_split(split)
    opened = evaluation.open_checkpoint(
        run_dir,
        which,
        note=print_note,
        best_step=recorded_best_step(run_dir),
        identity=recorded.owners,
    )
    if recorded.identity != recorded.record_identity:
        beside = evaluation.result_path(run_dir, split, recorded.identity).name
        print_note(
            f"{' '.join(overrides)} change what is measured: the result goes to {beside}, beside the "
            "run's own, and the report does not use it"
        )
    with processes(cfg) as dist:
        data_dir = Path(cfg.paths.data_dir)
        dataset = task.eval_dataset(data_dir, split)  # before the model: LM's vocabulary
        model = build_model(cfg, task)  # as training built it, before the checkpoint's weights
        autocast = torch.autocast(
            dist.device.type, dtype=torch.bfloat16, enabled=cfg.trainer.precision == "bf16"
        )
        batches = cfg.trainer.eval_batches
        result = evaluation.evaluate_checkpoint(task, model, dataset, split, opened, dist, autocast, batches)
        result.update(
            identity=recorded.identity,
            record_identity=recorded.record_identity,
            overrides=recorded.overrides,
            data_dir=str(data_dir),
        )
        written = evaluation.write_result(run_dir, result) if dist.main else None
    return result, written


def print_note(line: str) -> None:
    print(f"note: {line}", file=sys.stderr)


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
