"""The run record: the files every run leaves in its folder, and W&B beside them.

``config.yaml`` (resolved), ``metrics.jsonl`` (one JSON object per logged step, with
``step`` and ``split``), ``summary.json`` (what the run was and what it reached). The files
are the record of truth; W&B, when on, receives the same numbers, and its failures are
reported once and never stop training.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import warnings
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf


class RunRecord:
    """Writes ``config.yaml``, ``metrics.jsonl`` and ``summary.json`` in ``run_dir``."""

    def __init__(self, run_dir: Path, enabled: bool = True) -> None:
        self.dir, self.enabled = Path(run_dir), enabled
        self.metrics_path = self.dir / "metrics.jsonl"
        self.checkpoint = self.dir / "checkpoints" / "last.pt"

    def write_config(self, cfg: DictConfig) -> None:
        if self.enabled:
            self.dir.mkdir(parents=True, exist_ok=True)
            OmegaConf.save(cfg, self.dir / "config.yaml", resolve=True)

    def log(self, step: int, split: str, metrics: dict[str, float]) -> None:
        if self.enabled:
            row = {"step": step, "split": split, **{k: _jsonable(v) for k, v in metrics.items()}}
            with open(self.metrics_path, "a") as f:
                f.write(json.dumps(row) + "\n")

    def truncate_after(self, step: int) -> None:
        """Drop rows logged after ``step``: a resumed run logs them again."""
        if not self.enabled or not self.metrics_path.exists():
            return
        rows = [line for line in self.metrics_path.read_text().splitlines() if line.strip()]
        kept = [line for line in rows if json.loads(line)["step"] <= step]
        tmp = self.metrics_path.with_suffix(".tmp")
        tmp.write_text("".join(line + "\n" for line in kept))
        os.replace(tmp, self.metrics_path)

    def write_summary(self, summary: dict[str, Any]) -> None:
        if self.enabled:
            tmp = self.dir / "summary.json.tmp"
            tmp.write_text(json.dumps(summary, indent=2, default=_jsonable) + "\n")
            os.replace(tmp, self.dir / "summary.json")


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The rows of a run's ``metrics.jsonl``."""
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def git_revision() -> str | None:
    """The suite's git commit (with ``-dirty`` for uncommitted changes), if known."""
    root = Path(__file__).resolve().parents[2]
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if rev.returncode != 0:
        return None
    return rev.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def _jsonable(v: Any) -> Any:
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)  # JSON has no inf/nan
    return v


class WandbLogger:
    """W&B, best effort: project, group, name and tags from the config; offline without a key.

    Mode: ``logger.mode`` if set, else ``WANDB_MODE`` from the environment, else ``online``
    when an API key is configured and ``offline`` when none is. Every call is guarded: a
    failure is reported once as a warning and W&B is switched off for the rest of the run.
    """

    def __init__(self, cfg: DictConfig, run_dir: Path, config: dict[str, Any]) -> None:
        self.run = None
        try:
            import wandb

            mode = (
                cfg.get("mode")
                or os.environ.get("WANDB_MODE")
                or ("online" if _has_wandb_key() else "offline")
            )
            run_id = hashlib.sha1(str(Path(run_dir).resolve()).encode()).hexdigest()[
                :16
            ]  # resumes with the run
            self.run = wandb.init(
                project=cfg.project,
                entity=cfg.get("entity"),
                group=cfg.group,
                name=cfg.run_name,
                tags=list(cfg.tags),
                config=config,
                dir=str(run_dir),
                mode=mode,
                id=run_id,
                resume="allow",
                settings=wandb.Settings(init_timeout=float(cfg.get("init_timeout", 60))),
            )
        except Exception as e:  # noqa: BLE001  W&B must never stop training
            self._fail("init", e)

    def log(self, metrics: dict[str, float], step: int) -> None:
        if self.run is not None:
            try:
                self.run.log(metrics, step=step)
            except Exception as e:  # noqa: BLE001
                self._fail("log", e)

    def finish(self, summary: dict[str, Any] | None = None) -> None:
        if self.run is not None:
            try:
                if summary:
                    self.run.summary.update(
                        {k: v for k, v in summary.items() if isinstance(v, (int, float, str))}
                    )
                self.run.finish()
            except Exception as e:  # noqa: BLE001
                self._fail("finish", e)

    def _fail(self, what: str, error: Exception) -> None:
        warnings.warn(
            f"W&B {what} failed ({type(error).__name__}: {error}); training goes on, "
            "the run folder keeps the record",
            stacklevel=3,
        )
        self.run = None


def _has_wandb_key() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    netrc = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    return netrc.exists() and "api.wandb.ai" in netrc.read_text(errors="ignore")
