"""W&B beside the run record: the same numbers, best effort.

The files are the record of truth; W&B receives the same numbers, and its failures are
reported once and never stop training. A W&B run belongs to one record: its id is drawn when
the record starts (``identity.json``'s ``wandb_id``), so a folder deleted and run again, or
restarted with ``trainer.resume=restart``, gets a new W&B run; a resumed record continues its
own. Steps that the record had already logged before a resume (the session that was killed
got past its last checkpoint) were already sent: they are not sent again.
"""

from __future__ import annotations

import os
import secrets
import warnings
from pathlib import Path
from typing import Any

from omegaconf import DictConfig


def new_run_id() -> str:
    """A fresh W&B run id (W&B's own alphabet: lowercase letters and digits)."""
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
    return "".join(secrets.choice(alphabet) for _ in range(12))


class WandbLogger:
    """W&B, best effort: project, group, name and tags from the config; offline without a key.

    Mode: ``logger.mode`` if set, else ``WANDB_MODE`` from the environment, else ``online``
    when an API key is configured and ``offline`` when none is. Every call is guarded: a
    failure is reported once as a warning and W&B is switched off for the rest of the run.
    ``logged_through``: the last step this W&B run already holds; steps up to it are not sent.
    """

    def __init__(
        self,
        cfg: DictConfig,
        run_dir: Path,
        config: dict[str, Any],
        run_id: str | None = None,
        logged_through: int | None = None,
    ) -> None:
        self.run, self.logged_through = None, logged_through
        try:
            import wandb

            mode = (
                cfg.get("mode")
                or os.environ.get("WANDB_MODE")
                or ("online" if _has_wandb_key() else "offline")
            )
            self.run = wandb.init(
                project=cfg.project,
                entity=cfg.get("entity"),
                group=cfg.group,
                name=cfg.run_name,
                tags=list(cfg.tags),
                config=config,
                dir=str(run_dir),
                mode=mode,
                id=run_id or new_run_id(),
                resume="allow",
                settings=wandb.Settings(init_timeout=float(cfg.get("init_timeout", 60))),
            )
        except Exception as e:  # noqa: BLE001  W&B must never stop training
            self._fail("init", e)

    def log(self, metrics: dict[str, float], step: int) -> None:
        if self.run is None or (self.logged_through is not None and step <= self.logged_through):
            return
        try:
            self.run.log(metrics, step=step)
        except Exception as e:  # noqa: BLE001
            self._fail("log", e)

    def finish(self, summary: dict[str, Any] | None = None) -> None:
        """Close the W&B run (with ``summary``); a second call does nothing."""
        if self.run is not None:
            try:
                if summary:
                    self.run.summary.update(
                        {k: v for k, v in summary.items() if isinstance(v, (int, float, str))}
                    )
                self.run.finish()
            except Exception as e:  # noqa: BLE001
                self._fail("finish", e)
            self.run = None

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
