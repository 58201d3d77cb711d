"""The report's comparisons in W&B: ``launch.analysis.report … --to-wandb``.

Each completed run of an experiment that the report compared with its baseline gets that
comparison in its own W&B run's summary (resumed by the id in its ``identity.json``, as
``python -m src.eval`` adds its numbers), under ``vs/<baseline>/…``: the effect, its 95% interval,
the paired seeds, δ and the verdict unadjusted and Holm-adjusted, in the units results.csv uses. A
W&B runs table can then sort and filter every run by its experiment's answer. A run whose record
names no W&B run (trained with ``logger=none``) is counted and left alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from src.engine.record.tracking import add_to_summary

from .exports import effect_keys
from .records import Run, run_config
from .verdicts import Verdict


def comparison_summary(v: Verdict) -> dict[str, Any]:
    """The summary keys of one comparison (None values left out: W&B keeps the last it was sent)."""
    prefix = f"vs/{(v.baseline_label or 'standard').replace(' ', '_')}"
    keys = {**effect_keys(v), "metric": v.metric}
    return {f"{prefix}/{k}": value for k, value in keys.items() if value not in (None, "")}


def send_comparisons(runs: list[Run], compared: list[Verdict]) -> tuple[int, int]:
    """Send each compared experiment's summary to its completed runs' W&B runs; ``(sent, without
    a W&B run)``."""
    by_experiment = {v.experiment: v for v in compared if v.claim is None}
    sent = skipped = 0
    for run in runs:
        v = by_experiment.get(run.experiment)
        if v is None or run.status != "completed":
            continue
        config, _, _ = run_config(Path(run.name))
        logged = isinstance(config.get("logger"), dict) and config["logger"].get("name") == "wandb"
        if not logged or not add_to_summary(Path(run.name), OmegaConf.create(config), comparison_summary(v)):
            skipped += 1
            continue
        sent += 1
    return sent, skipped
