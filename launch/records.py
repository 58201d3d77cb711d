"""Reading runs back: the run folders the suite writes, or the same numbers from W&B.

A run folder is a folder with the suite's ``config.yaml`` or Hydra's ``.hydra/config.yaml``.
Its status: ``completed`` (a summary says so), ``failed`` (a summary with the error line),
or ``incomplete`` (no summary: killed, timed out, still running, or died before its first
write), so the report can list every run that did not finish instead of dropping it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf


@dataclass
class Run:
    """One run as the report sees it."""

    name: str
    task: str
    backbone: str
    attn: str
    seed: int
    status: str  # completed | failed | incomplete
    metric: str | None = None
    final: dict[str, float] = field(default_factory=dict)
    rows: list[dict[str, Any]] = field(default_factory=list)  # metrics.jsonl
    error: str | None = None
    steps_per_epoch: int | None = None

    @property
    def key(self) -> tuple[str, str, str]:
        return self.task, self.backbone, self.attn

    def series(self, key: str, split: str = "val") -> tuple[list[int], list[float]]:
        """``(steps, values)`` of one logged quantity."""
        points = [(r["step"], r[key]) for r in self.rows if r.get("split") == split and key in r]
        return [s for s, _ in points], [float(v) for _, v in points]


def find_run_dirs(roots: Iterable[Path]) -> list[Path]:
    """Every run folder under ``roots`` (a root may itself be one): a folder with Hydra's
    ``.hydra/config.yaml``, or with the suite's ``config.yaml`` beside its metrics."""
    found = set()
    for root in map(Path, roots):
        found.update(p.parent.parent for p in root.glob("**/.hydra/config.yaml"))
        found.update(p.parent for p in root.glob("**/config.yaml") if (p.parent / "metrics.jsonl").exists())
    return sorted(found)


def read_run(folder: Path) -> Run:
    """A run folder as a :class:`Run` (whatever state it was left in)."""
    config_path = (
        folder / "config.yaml" if (folder / "config.yaml").exists() else folder / ".hydra" / "config.yaml"
    )
    cfg = OmegaConf.load(config_path)
    run = Run(
        name=str(folder),
        task=str(OmegaConf.select(cfg, "task.name")),
        backbone=str(OmegaConf.select(cfg, "backbone.name")),
        attn=str(OmegaConf.select(cfg, "attn.variant")),
        seed=int(OmegaConf.select(cfg, "seed", default=0)),
        status="incomplete",
    )
    metrics = folder / "metrics.jsonl"
    if metrics.exists():
        run.rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    summary_path = folder / "summary.json"
    if summary_path.exists():
        summary = json.loads(summary_path.read_text())
        run.status = summary.get("status", "completed")
        run.metric, run.final = summary.get("metric"), summary.get("final") or {}
        run.error, run.steps_per_epoch = summary.get("error"), summary.get("steps_per_epoch")
    else:
        last = max((r["step"] for r in run.rows), default=0)
        run.error = f"no summary.json: killed, timed out or still running (last logged step {last})"
    return run


def read_runs(roots: Iterable[Path]) -> list[Run]:
    return [read_run(folder) for folder in find_run_dirs(roots)]


def read_wandb(path: str, api: Any = None) -> list[Run]:
    """The runs of a W&B project ``ENTITY/PROJECT``, as :class:`Run` s (needs network and a key)."""
    if api is None:
        import wandb

        api = wandb.Api()
    runs = []
    for r in api.runs(path):
        cfg = r.config
        final = {k.removeprefix("final/"): v for k, v in r.summary.items() if k.startswith("final/")}
        rows = []
        for row in r.scan_history():
            step = row.get("_step")
            split = (
                "monitor"
                if any(k.startswith("kappa/") for k in row)
                else ("val" if any(k.startswith("val") for k in row) else "train")
            )
            rows.append(
                {"step": step, "split": split, **{k: v for k, v in row.items() if not k.startswith("_")}}
            )
        state = {"finished": "completed", "failed": "failed", "crashed": "failed"}.get(r.state, "incomplete")
        runs.append(
            Run(
                name=f"wandb:{path}/{r.id}",
                task=cfg["task"]["name"],
                backbone=cfg["backbone"]["name"],
                attn=cfg["attn"]["variant"],
                seed=int(cfg.get("seed", 0)),
                status=state if final or state != "completed" else "incomplete",
                metric=cfg["task"].get("metric"),
                final=final,
                rows=rows,
                error=None if state == "completed" else f"W&B state {r.state}",
            )
        )
    return runs
