"""The files of a run folder checked for the shape the report reads: ``summary.json``, the rows of
``metrics.jsonl`` and the ``eval-<split>.json`` evaluations (:mod:`launch.analysis.records` reads them).

A run folder is data: a value of the wrong type (a summary that is a list, a row whose step is
text, an evaluation of another configuration) is a :class:`DamagedRecord` naming the file and what
is wrong, which makes its run ``unreadable`` in the report (an evaluation is left out with a
warning instead), never a traceback later.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Collection
from pathlib import Path
from typing import Any

from src.engine.record.bounded import read_bytes


class DamagedRecord(ValueError):
    """A file of a run folder the report cannot use; its message names the file and what is wrong."""


def one_line(text: str, limit: int = 300) -> str:
    """``text`` on one line (its whitespace runs as one space), cut to ``limit`` characters."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


# -- the shape of what the report reads ------------------------------------------------------------

#: summary.json's keys the report reads, and their types (each may be missing or null)
SUMMARY_TYPES: dict[str, tuple[type, ...]] = {
    **dict.fromkeys(("status", "metric", "metric_mode", "error"), (str,)),
    **dict.fromkeys(("steps", "steps_per_epoch"), (int,)),
    "wall_s": (int, float),
    **dict.fromkeys(("final", "best"), (dict,)),
}


KINDS = {str: "a string", int: "an integer", float: "a number", dict: "an object"}


def is_number(value: Any) -> bool:
    """A finite int or float (not a bool, not a string)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return isinstance(value, int) or math.isfinite(value)


def is_step(value: Any) -> bool:
    """An int (not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool)


def read_summary(path: Path) -> dict[str, Any] | None:
    """``summary.json`` (None: there is none), or a :class:`DamagedRecord` where it is not a JSON
    object with the types :data:`SUMMARY_TYPES` names and numbers as its ``final`` and ``best``."""
    if not path.exists() and not path.is_symlink():
        return None
    data = read_bytes(path, within=path.parent)  # a regular file of the folder, within its limit
    try:
        summary = json.loads(data)
    except ValueError as error:
        raise DamagedRecord(f"{path} is not valid JSON ({error})") from error
    if not isinstance(summary, dict):
        raise DamagedRecord(f"{path} is not a JSON object (it holds {one_line(json.dumps(summary), 40)})")
    for key, types in SUMMARY_TYPES.items():
        value = summary.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, types)):
            raise DamagedRecord(
                f"{path}: its {key!r} is {one_line(json.dumps(value), 40)}, not {KINDS[types[-1]]}"
            )
    for key in ("final", "best"):
        for name, value in (summary.get(key) or {}).items():
            wanted = is_step if name == "step" else is_number
            if value is not None and not wanted(value):
                raise DamagedRecord(
                    f"{path}: {key}.{name} is {one_line(json.dumps(value), 40)}, not a number"
                )
    return summary


def checked_rows(rows: list[dict[str, Any]], path: Path) -> list[dict[str, Any]]:
    """``rows`` (``metrics.jsonl``'s) where each has an integer ``step``, a ``split`` name and
    numbers (or null) as its values; else a :class:`DamagedRecord` naming the first that has not."""
    for number, row in enumerate(rows, start=1):
        problem = row_problem(row)
        if problem:
            raise DamagedRecord(f"{path}: row {number} (step {row.get('step')!r}) {problem}")
    return rows


def row_problem(row: dict[str, Any]) -> str | None:
    """What is wrong with one row of ``metrics.jsonl`` for the report, or None."""
    if not is_step(row["step"]):
        return "has a step that is not an integer"
    if not isinstance(row.get("split", ""), str):
        return "has a split that is not a name"
    for key, value in row.items():
        if key in ("step", "split", "nonfinite") or value is None or isinstance(value, bool):
            continue
        if not is_number(value):
            return f"has {key} = {one_line(repr(value), 40)}, not a number"
    return None


# -- the ranges of the metrics the report averages ------------------------------------------------

#: What each metric can be, by its name without the split (``val/acc_mm``: ``acc_mm``), in the
#: units the suite records it in: accuracies, F1 and COCO APs as fractions in [0, 1] (the report
#: prints them in %), correlations in [-1, 1], a loss at least 0, a perplexity at least 1.
#: [reading] This module's: what the suite's tasks log (tasks/*/task.py, mmdet's COCO metrics).
RANGES: tuple[tuple[str, float, float], ...] = (
    ("acc", 0.0, 1.0),
    ("f1", 0.0, 1.0),
    ("mAP", 0.0, 1.0),
    ("matthews", -1.0, 1.0),
    ("pearson", -1.0, 1.0),
    ("spearman", -1.0, 1.0),
    ("loss", 0.0, math.inf),
    ("ppl", 1.0, math.inf),
    ("perplexity", 1.0, math.inf),
)


def metric_range(key: str) -> tuple[float, float] | None:
    """``(low, high)`` a metric can take (:data:`RANGES`), None where its name says nothing: an
    accuracy is ``acc…``, a COCO AP holds ``mAP``, the others are their names exactly."""
    name = key.rsplit("/", 1)[-1]
    for word, low, high in RANGES:
        if name == word or (word == "acc" and name.startswith("acc")) or (word == "mAP" and word in name):
            return low, high
    return None


def checked_metric(key: str) -> bool:
    """Whether a summary's ``final``/``best`` value of ``key`` is range-checked whatever the main
    metric: every known range but COCO's APs by object size and IoU, which are -1 where the set
    has no object of that size (COCO's own mark); the main metric is checked whatever it is."""
    return metric_range(key) is not None and "mAP" not in key


def out_of_range(key: str, value: float) -> str | None:
    """``"is -5.0, outside [0, 1]…"`` where ``value`` cannot be a ``key`` (:func:`metric_range`),
    else None."""
    bounds = metric_range(key)
    if bounds is None or not is_number(value) or bounds[0] <= value <= bounds[1]:
        return None
    low, high = bounds
    shown = f"[{low:g}, {high:g}]" if math.isfinite(high) else f"at least {low:g}"
    percent = " (the suite records it as a fraction: a percentage?)" if high == 1 and 1 < value <= 100 else ""
    return f"is {value!r}, outside {shown}, what it can be{percent}: its numbers are not used"


# -- evaluations -----------------------------------------------------------------------------------


def read_evals(
    folder: Path, summary: dict[str, Any], identities: Collection[str]
) -> dict[str, dict[str, Any]]:
    """``{split: record}`` of the folder's ``eval-<split>.json`` files that measured the record's own
    configuration: each names the configuration it evaluated (``identity``), and it must be the
    record's (one of ``identities``: ``identity.json``'s hash, else its config's). One that names
    none (written before evaluations did), names another, is damaged, or measured a checkpoint the
    record no longer names (:func:`stale_eval`) is left out with a warning naming it and the
    command that measures it again. ``eval-<split>.<hash>.json``, an evaluation with overrides that
    change what is measured, never stands for its split."""
    evals = {}
    for path in sorted(folder.glob("eval-*.json")):
        split = path.name.removeprefix("eval-").removesuffix(".json")
        if "." in split:  # eval-<split>.<hash>.json: another configuration's, beside the run's own
            continue
        try:
            record = json.loads(read_bytes(path, within=folder))
            evals[split] = checked_eval(record, split, summary, identities)
        except ValueError as error:  # damaged, refused (RefusedFile), or not the record's
            warnings.warn(
                f"{path} is left out ({error}); its run is reported on validation: rerun "
                f"`python -m src.eval {folder} split={split}`",
                stacklevel=2,
            )
    return evals


def checked_eval(
    record: Any, split: str, summary: dict[str, Any], identities: Collection[str]
) -> dict[str, Any]:
    """``record`` (an ``eval-<split>.json``) where the report may use it for ``split``, else a
    ``ValueError`` saying why not."""
    if not isinstance(record, dict):
        raise ValueError(f"not a JSON object but a {type(record).__name__}")
    metrics, metric = record.get("metrics"), record.get("metric")
    if not isinstance(metrics, dict) or not isinstance(metric, str) or metric not in metrics:
        raise ValueError("no 'metrics' holding its 'metric'")
    if not is_number(metrics[metric]):
        raise ValueError(f"its {metric} is {one_line(repr(metrics[metric]), 40)}, not a number")
    problem = out_of_range(metric, metrics[metric])
    if problem:
        raise ValueError(f"its {metric} {problem}")
    if record.get("split", split) != split:
        raise ValueError(f"it is of split {record['split']!r}, not {split!r}")
    if "identity" not in record:
        raise ValueError("it does not name the configuration it measured: written before evaluations did")
    if record["identity"] not in identities:
        raise ValueError(
            f"it measured another configuration (identity {record['identity']!r}) than the record's "
            f"({' or '.join(sorted(identities))})"
        )
    stale_eval(record, summary)
    return record


def stale_eval(record: dict[str, Any], summary: dict[str, Any]) -> None:
    """A ``ValueError`` when the evaluated checkpoint's step is not the one ``summary`` names for it
    (``best``: the best validation's step; ``last``: the steps trained): the run went on since."""
    which, step = record.get("checkpoint"), record.get("checkpoint_step")
    expected = {"best": (summary.get("best") or {}).get("step"), "last": summary.get("steps")}.get(which)
    if expected is not None and step != expected:
        raise ValueError(f"it measured the {which} checkpoint at step {step}, the record's at {expected}")
