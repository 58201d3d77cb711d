"""The report's files for other programs: ``results.csv``/``results.json`` (one row per run and one
per experiment, each experiment that is not the baseline with its effect against it) and
``claims.csv``/``claims.json`` (one row per claim, task and reading: the Claims section's
verdicts). Every row says what produced it: the host, commit and torch build of the runs'
records. :mod:`launch.analysis.readme_table` rebuilds the README's verdict table from committed
``claims.csv`` files alone.
"""

from __future__ import annotations

import csv
import io
import json
import statistics
from pathlib import Path
from typing import Any

from .records import Run, options, variant_options
from .results import describe, experiments, not_attn, one_split
from .verdicts import Verdict

FIELDS = (
    "kind task backbone attn options settings seed seeds steps epochs wall_s status error metric split "
    "final checkpoint best best_split mean std n note effect ci_low ci_high n_paired margin verdict "
    "verdict_holm host commit torch experiment run_dir"
).split()
TYPES = {"seed": int, "steps": int, "n": int, "n_paired": int, "seeds": list} | dict.fromkeys(
    ("epochs", "wall_s", "final", "best", "mean", "std", "effect", "ci_low", "ci_high", "margin"), float
)  # the rest are strings: what the csv needs to read back as the json holds it


def export_rows(runs: list[Run], compared: list[Verdict]) -> list[dict[str, Any]]:
    """Every run (``kind=run``), then every experiment of completed runs (``kind=group``), as rows
    with the :data:`FIELDS` keys, None where a key does not apply (*error*: why a run did not
    complete, or cannot be read). *options*: the variant's
    non-default options; *settings*: what else tells the experiment apart. A run's *final* is its
    test number where it has one, else its final validation value (*split*, *checkpoint* say
    which); *best* its best validation value. A group's *mean*, *std* (None for one seed), *n* and
    *seeds* are over one split (*split*; *note* when some seeds had test numbers and some not).
    A group that is not the baseline's carries its comparison with it (``compared``,
    :func:`launch.analysis.report.comparisons`): *effect*, *ci_low*, *ci_high* (95%),
    *n_paired*, *margin* (δ, None where none is given), *verdict* and *verdict_holm*. *host*,
    *commit* and *torch*: what trained the run (its record's sessions; a group's, its runs'
    distinct values), so that a committed results file says what produced its numbers."""
    settings = options(r for r in runs if r.status != "debug")  # debug runs tell no experiment apart
    by_experiment = {v.experiment: v for v in compared}
    rows = []
    for r in sorted(runs, key=lambda r: (r.task, r.backbone, r.attn, r.experiment, r.seed, r.name)):
        number = r.reported if r.status in ("completed", "disagrees") else None
        best = r.best.get(r.metric or "")
        rows.append(
            {
                **_common(r, settings),
                "kind": "run",
                "seed": r.seed,
                "wall_s": r.wall_s,
                "status": r.status,
                "error": r.error if r.status != "completed" else None,
                "metric": number.key if number else r.metric,
                "split": number.split if number else None,
                "final": number.value if number else None,
                "checkpoint": number.checkpoint if number else None,
                "best": best,
                "best_split": "val" if best is not None else None,
                "run_dir": r.name,
                **made_by([r]),
            }
        )
    groups, _ = experiments(runs)
    for members in groups.values():
        split, key, values, note = one_split(members)
        rows.append(
            {
                **_common(members[0], settings),
                "kind": "group",
                "seeds": [r.seed for r in members],
                "metric": key,
                "split": split,
                "mean": statistics.fmean(values),
                "std": statistics.stdev(values) if len(values) > 1 else None,
                "n": len(values),
                "note": note or None,
                **effect_keys(by_experiment.get(members[0].experiment)),
                **made_by(members),
            }
        )
    return [{k: row.get(k) for k in FIELDS} for row in rows]


def made_by(runs: list[Run]) -> dict[str, str | None]:
    """``host``, ``commit`` and ``torch`` of ``runs`` (:attr:`Run.provenance`): each the distinct
    values, space-separated, None where no run's record says."""
    made = {}
    for key in ("host", "commit", "torch"):
        values = dict.fromkeys(v for r in runs for v in r.provenance.get(key, "").split())
        made[key] = " ".join(values) or None
    return made


def effect_keys(v: Verdict | None) -> dict[str, Any]:
    """A comparison's keys of an export row (none for the baseline, or a row without one)."""
    if v is None:
        return {}
    return {
        "effect": v.effect,
        "ci_low": v.low,
        "ci_high": v.high,
        "n_paired": v.n,
        "margin": v.margin,
        "verdict": v.verdict,
        "verdict_holm": v.adjusted,
    }


def _common(run: Run, settings: dict) -> dict[str, Any]:
    """The keys a run shares with its group: what the experiment is and how long it ran."""
    return {
        "task": run.task,
        "backbone": run.backbone,
        "attn": run.attn,
        "options": variant_options(run.attn, run.attn_options) or None,
        "settings": describe(not_attn(settings.get(run.experiment, {}))).replace("—", "") or None,
        "steps": run.steps,
        "epochs": run.epochs,
        "experiment": run.experiment,
    }


def exports(rows: list[dict[str, Any]], claim_rows: list[dict[str, Any]] | None = None) -> dict[str, bytes]:
    """``results.csv`` and ``results.json``'s content: the same rows (:func:`export_rows`); in the
    csv a None is an empty cell and a group's seeds are space-separated. With ``claim_rows``
    (:func:`claim_export_rows`), ``claims.csv`` and ``claims.json`` too."""
    files = {"results": (FIELDS, rows)} | (
        {"claims": (CLAIM_FIELDS, claim_rows)} if claim_rows is not None else {}
    )
    out = {}
    for name, (fields, table) in files.items():
        text = io.StringIO(newline="")
        writer = csv.DictWriter(text, fieldnames=fields)
        writer.writeheader()
        for row in table:
            cells = {k: " ".join(map(str, v)) if isinstance(v, list) else v for k, v in row.items()}
            writer.writerow({k: "" if v is None else v for k, v in cells.items()})
        out[f"{name}.csv"] = text.getvalue().encode()
        out[f"{name}.json"] = (json.dumps(table, indent=1) + "\n").encode()
    return out


# -- claims.csv: the Claims section's rows -----------------------------------------------------

CLAIM_FIELDS = (
    "claim source statement variant measure kind task reading role stage n metric budget baseline "
    "value effect ci_low ci_high margin verdict verdict_holm mde seeds_for_margin tested_at not_counted "
    "host commit torch"
).split()
CLAIM_TYPES = {"n": int, "seeds_for_margin": int} | dict.fromkeys(
    ("baseline", "value", "effect", "ci_low", "ci_high", "margin", "mde", "tested_at"), float
)


def claim_export_rows(found: list[Verdict], runs: list[Run]) -> list[dict[str, Any]]:
    """One row per claim verdict (:func:`launch.analysis.verdicts.verdicts`), with the
    :data:`CLAIM_FIELDS` keys: what the claim says and of which reading (*role*: primary or
    exploratory, *stage*: confirm), the paired seeds *n*, the means, the effect with its 95%
    interval in the measure's own units (κ in log10), δ, the verdict unadjusted and Holm-adjusted,
    the MDE at the level it is tested at (*tested_at*, one-sided), the seeds δ would need, the runs
    left out, and what trained the runs of both arms."""
    by_experiment: dict[str, list[Run]] = {}
    for r in runs:
        by_experiment.setdefault(r.experiment, []).append(r)
    rows = []
    for v in found:
        if v.claim is None:
            continue
        arms = by_experiment.get(v.experiment, []) + by_experiment.get(v.baseline_experiment, [])
        rows.append(
            {
                "claim": v.claim.key,
                "source": v.claim.source,
                "statement": v.claim.statement,
                "variant": v.claim.variant,
                "measure": v.claim.measure,
                "kind": v.claim.kind,
                "task": v.task,
                "reading": v.reading,
                "role": v.role or None,
                "stage": v.stage or None,
                "n": v.n,
                "metric": v.metric or None,
                "budget": v.budget or None,
                "baseline": v.baseline,
                "value": v.value,
                "effect": v.effect,
                "ci_low": v.low,
                "ci_high": v.high,
                "margin": v.margin,
                "verdict": v.verdict,
                "verdict_holm": v.adjusted or None,
                "mde": v.detectable,
                "seeds_for_margin": v.seeds_for_margin,
                "tested_at": v.tested_at.side if v.test is not None else None,
                "not_counted": v.not_counted or None,
                **made_by(arms),
            }
        )
    return [{k: row.get(k) for k in CLAIM_FIELDS} for row in rows]


def read_exports_csv(path: Path) -> list[dict[str, Any]]:
    """``results.csv`` (or ``claims.csv``) read back into the rows its json holds (types from
    :data:`TYPES` or :data:`CLAIM_TYPES`)."""
    types = CLAIM_TYPES if path.name.startswith("claims") else TYPES

    def typed(key: str, text: str) -> Any:
        if text == "":
            return None
        kind = types.get(key, str)
        return [int(s) for s in text.split()] if kind is list else kind(text)

    with open(path, newline="") as f:
        return [{k: typed(k, v) for k, v in row.items()} for row in csv.DictReader(f)]
