"""Which ``conf/reading/`` file a run was trained under, from what the run records.

A reading is a config-group file that selects a variant (``override /attn: <variant>``) and sets
some of its options. A run records its variant and all its options, not the file's name, so a
run is matched to the file whose variant is the run's and whose every option has the run's
value (:func:`matching`). Claims name their *primary* reading by file (:mod:`launch.analysis.claims`).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import yaml

from .records import Run

READINGS = Path(__file__).resolve().parents[2] / "conf" / "reading"


@functools.cache
def reading_files() -> dict[str, tuple[str, dict[str, Any]]]:
    """``{name: (variant, options the file sets)}`` for every file in ``conf/reading/``."""
    out = {}
    for path in sorted(READINGS.glob("*.yaml")):
        text = yaml.safe_load(path.read_text()) or {}
        variant = next(
            (
                d["override /attn"]
                for d in text.get("defaults", [])
                if isinstance(d, dict) and "override /attn" in d
            ),
            None,
        )
        if variant is not None:
            out[path.stem] = (variant, dict(text.get("attn") or {}))
    return out


def matching(run: Run) -> str | None:
    """The reading file ``run`` was trained under: its variant, and every option the file sets at
    the run's value (the most specific where several match; None where none does)."""
    return match(run.attn, run.attn_options or (run.identity.config.get("attn") or {}))


def match(variant: str, options: dict[str, Any]) -> str | None:
    """The reading file of ``variant`` whose every option has the value in ``options`` (the most
    specific where several do; None where none does)."""
    found = [
        (len(settings), name)
        for name, (of, settings) in reading_files().items()
        if of == variant and all(_same(options.get(k), v) for k, v in settings.items())
    ]
    return max(found)[1] if found else None


def _same(recorded: Any, given: Any) -> bool:
    if isinstance(given, (int, float)) and isinstance(recorded, (int, float)):
        return float(recorded) == float(given)
    return recorded == given
