"""Where a session's numbers go: one object that every loop writes its rows through.

The shared :class:`src.engine.loop.trainer.Trainer` and detection's mmengine hook
(:mod:`tasks.detection.record`) both log through a :class:`Recorder`, which writes each row into
the record (:class:`src.engine.record.files.RunRecord`, main process only) and sends the same numbers
to W&B (:mod:`.tracking`, when ``logger=wandb``). At the end of the session the pipeline
(:func:`src.engine.experiment.train`) writes the summary through it and closes W&B, whatever
happened; for a failure it asks it how far the session got.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from .announce import announce, start_line
from .files import RunRecord
from .session import Session
from .tracking import WandbLogger, in_sweep, main_metric, run_config, run_name, run_tags


class Recorder:
    """The rows, summary and W&B run of ``session``; W&B only when ``cfg.logger`` names it.

    Use it as a context manager: leaving the block closes the W&B run (a no-op once
    :meth:`finish` closed it with the summary)."""

    def __init__(self, session: Session, cfg: DictConfig | None = None) -> None:
        self.session, self.record, self.cfg = session, session.record, cfg
        self.wandb: WandbLogger | None = None
        self.loop_step: int | None = None  # the step the loop has reached (trained_to)

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        """Open the record's W&B run (``logger=wandb``, main process), continued where the record
        was; the loops call it as training begins, so that a session that fails while it builds
        leaves no W&B run behind. A second call does nothing."""
        cfg = self.cfg
        if self.wandb is not None or cfg is None or cfg.logger.name != "wandb" or not self.record.enabled:
            return
        opening = self.session.opening
        self.wandb = WandbLogger(
            cfg.logger,
            self.record.dir,
            run_config(cfg, OmegaConf.to_container(cfg, resolve=True), sweep=in_sweep()),
            run_id=opening.wandb_id,
            logged_through=opening.logged_through,
            name=run_name(cfg),
            tags=run_tags(cfg),
            metric=main_metric(cfg.task),
            job_type="train",
        )

    def begin(self, step: int, total: int | None = None, batch: str | None = None) -> None:
        """Say what trains, from which step, with which batch and where (main process); the loops
        call it once they know the step they start from."""
        if self.cfg is not None and self.record.enabled:
            announce(start_line(self.cfg, self.record.dir, self.session.kind, step, total, batch))

    def trained_to(self, step: int) -> None:
        """The loop has reached ``step`` (resumed at it or finished it): how far this session got,
        should it fail. A loop that does not say (detection's) is measured by its last row."""
        self.loop_step = step

    def log(self, step: int, split: str, metrics: dict[str, float]) -> None:
        """One row at ``step``: into ``metrics.jsonl`` (main process) and to W&B."""
        self.record.log(step, split, metrics)
        if self.wandb is not None:
            self.wandb.log(metrics, step=step)

    def saved(self, path: Path, step: int, metadata: dict[str, Any]) -> None:
        """The loop wrote the checkpoint ``path`` at ``step``: log it to W&B as a model artifact
        (with ``metadata``) when ``logger.log_checkpoints`` asks for it."""
        if self.wandb is not None and self.cfg is not None and self.cfg.logger.get("log_checkpoints"):
            self.wandb.log_checkpoint(path, step, metadata)

    def finish(self, summary: dict[str, Any]) -> dict[str, Any]:
        """Write ``summary.json``, save the record's files to the W&B run, close it with the final
        metrics; returns ``summary``."""
        self.record.write_summary(summary)
        if self.wandb is not None:
            self.wandb.save_record(self.record.dir)
            self.wandb.finish(wandb_summary(summary))
        return summary

    def close(self) -> None:
        if self.wandb is not None:
            self.wandb.finish()

    def steps(self) -> int:
        """How far this session got, for a failure's record: the loop's step when this session
        trained (wrote rows or a checkpoint), else the record's last logged step."""
        if self.loop_step is not None and self.record.touched:
            return self.loop_step
        return recorded_steps(self.record)


def wandb_summary(summary: dict[str, Any]) -> dict[str, Any]:
    """What the W&B run's summary gets: the final metrics (``final/<key>``), which way the main one
    is better, and how the run went: ``best`` (the best validation, with its ``step``), ``steps``,
    ``status``, ``wall_s``. The main metric's own key holds its best by ``define_metric``."""
    kept = {k: summary[k] for k in ("best", "steps", "status", "wall_s", "metric") if k in summary}
    return {
        **{f"final/{k}": v for k, v in summary["final"].items()},
        "metric_mode": summary["metric_mode"],
        **kept,
    }


def recorded_steps(record: RunRecord) -> int:
    """How far the record got: its last logged step (0 when it has none or cannot be read)."""
    try:
        return record.last_logged_step() or 0
    except Exception:  # noqa: BLE001
        return 0


def is_better(value: float | None, best: float | None, mode: str) -> bool:
    """Whether ``value`` beats ``best`` (``mode`` max or min); a NaN or missing value never does."""
    if value is None or not math.isfinite(value):
        return False
    if best is None or not math.isfinite(best):
        return True
    return value > best if mode == "max" else value < best


def kept_best(best: dict[str, float], metrics: dict[str, float], step: int, metric: str, mode: str) -> dict:
    """The best validation after one at ``step``: ``{**metrics, "step": step}`` when its
    ``metric`` beats ``best``'s (``mode`` max or min), else ``best``."""
    return {**metrics, "step": step} if is_better(metrics.get(metric), best.get(metric), mode) else best
