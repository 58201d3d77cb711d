"""W&B beside the run record: the same numbers, best effort.

The files are the record of truth; W&B receives the same numbers, and its failures are
reported once and never stop training. A W&B run belongs to one record: its id is drawn when
the record starts (``identity.json``'s ``wandb_id``), so a folder deleted and run again, or
restarted with ``trainer.resume=restart``, gets a new W&B run; a resumed record continues its
own. Steps that the record had already logged before a resume (the session that was killed
got past its last checkpoint) were already sent: they are not sent again.

A training run has ``job_type`` ``train``; with ``logger.log_checkpoints`` each ``best.pt`` and
``last.pt`` the loop writes is logged as a version of the run's ``model-<run id>`` artifact
(aliases ``best`` / ``latest`` and ``step-N``, the step, metric and identity in its metadata;
:meth:`WandbLogger.log_checkpoint`). ``python -m src.eval`` resumes the evaluated run to add its
results to the run's summary (``eval/<split>/<metric>``), where the runs table compares them.
A single run's config has ``sweep_name`` None; a multirun's jobs keep their sweep's.

When training ends, the record's own files (:data:`SENT_FILES`: ``config.yaml``, ``metrics.jsonl``,
``summary.json``, and ``eval-test.json`` where ``trainer.test_after`` wrote it) go to the run's Files
tab, under ``record/`` (:meth:`WandbLogger.save_record`): the files a W&B user looks for beside the
run, final, without an artifact's versions (which the checkpoints use, being many and large). They are
copied into the run's own folder, not linked, so that an offline run synced later, or from another
machine, carries them; ``record/`` keeps them apart from W&B's own ``config.yaml``.
"""

from __future__ import annotations

import os
import secrets
import shutil
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hydra.utils import get_class
from omegaconf import DictConfig

from src.attention import config as attention
from src.errors import ConfigError

#: The record's files a W&B run gets at the end of training (those that exist), under ``record/``.
SENT_FILES = ("config.yaml", "metrics.jsonl", "summary.json", "eval-test.json")


def new_run_id() -> str:
    """A fresh W&B run id (W&B's own alphabet: lowercase letters and digits); under a W&B sweep
    agent (``WANDB_SWEEP_ID``), the id the agent chose (``WANDB_RUN_ID``), so the sweep holds the
    run (:mod:`launch.wandb_sweep`)."""
    if os.environ.get("WANDB_SWEEP_ID") and os.environ.get("WANDB_RUN_ID"):
        return os.environ["WANDB_RUN_ID"]
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
    return "".join(secrets.choice(alphabet) for _ in range(12))


def main_metric(task: DictConfig) -> tuple[str, str]:
    """``(metric, mode)`` of the task config ``task``: ``task.metric`` when set, else its class's
    default, and the class's ``metric_mode`` (``max`` or ``min``; LM tasks minimise). Read from the
    config because the W&B run opens before the loop hands over the task object."""
    cls = get_class(task._target_) if task.get("_target_") else None
    metric = task.get("metric") or getattr(cls, "metric", "val/acc")
    return str(metric), str(getattr(cls, "metric_mode", "max"))


def changed_options(attn: Mapping[str, Any] | DictConfig) -> dict[str, Any]:
    """The options of ``attn`` that differ from its variant's defaults, flat
    (``{"mode": "svd"}``; for a composition ``{"spectral.mode": "svd"}``), in config order."""
    return attention.changed_options(attention.attn_name(attn), attention.attn_options(attn))


def variant_label(attn: Mapping[str, Any] | DictConfig) -> str:
    """``spectral``, ``spectral(mode=svd,lam=1)`` or ``cond_init+spectral(spectral.lam=1)``: the
    variant and the options that differ from its defaults; two option sets never share it."""
    changed = changed_options(attn)
    inner = ",".join(f"{k}={v}" for k, v in changed.items())
    return attention.attn_name(attn) + (f"({inner})" if inner else "")


def run_name(cfg: DictConfig) -> str:
    """The W&B run's name: ``logger.run_name`` when set, else ``<variant label>-seed<seed>``."""
    return cfg.logger.get("run_name") or f"{variant_label(cfg.attn)}-seed{cfg.seed}"


def run_tags(cfg: DictConfig) -> list[str]:
    """Plain tags to filter by: the variant's parts (and the composition's name), the task, the
    backbone, then ``logger.tags``. No ``=``: ``wandb sync --replace-tags old=new`` could not
    rename them; the options and the seed are config keys (:func:`run_config`) instead."""
    parts = attention.part_names(cfg.attn)
    names = [*parts, *([attention.attn_name(cfg.attn)] if len(parts) > 1 else [])]
    tags = [*names, cfg.task.name, cfg.backbone.name, *[str(t) for t in cfg.logger.get("tags") or []]]
    bad = [t for t in tags if "=" in t]
    if bad:
        raise ConfigError(
            f"logger.tags: {bad[0]!r} has '=', which W&B cannot rename (wandb sync --replace-tags "
            "old=new); write it without '=', e.g. with '-'"
        )
    return list(dict.fromkeys(tags))


def in_sweep() -> bool:
    """Whether this process runs one job of a sweep: a Hydra multirun (``-m``) or a W&B sweep's
    agent (``WANDB_SWEEP_ID``)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if os.environ.get("WANDB_SWEEP_ID"):
        return True
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def run_config(cfg: DictConfig, resolved: dict[str, Any], sweep: bool = False) -> dict[str, Any]:
    """The W&B config: the resolved config ``resolved`` plus flat keys a workspace groups and
    filters by (``variant``, ``variant_options``, ``variant_label``, ``task_name``,
    ``backbone_name``; ``seed`` is already a top-level key). ``sweep_name`` is the sweep's for a
    job of a multirun (``sweep``) and None for a single run, which belongs to no sweep (the
    config's default ``sweep`` names only the multirun folder)."""
    changed = changed_options(cfg.attn)
    return {
        **resolved,
        "sweep_name": resolved.get("sweep_name") if sweep else None,
        "variant": attention.attn_name(cfg.attn),
        "variant_options": ",".join(f"{k}={v}" for k, v in changed.items()) or "defaults",
        "variant_label": variant_label(cfg.attn),
        "task_name": cfg.task.name,
        "backbone_name": cfg.backbone.name,
    }


def eval_summary(result: dict[str, Any]) -> dict[str, Any]:
    """What an evaluation (``python -m src.eval``'s ``result``) adds to the evaluated run's W&B
    summary: each metric under ``eval/`` (``eval/test/acc``) and which checkpoint gave them
    (``eval/<split>/checkpoint``, ``eval/<split>/checkpoint_step``)."""
    split = result["split"]
    return {
        **{f"eval/{k}": v for k, v in result["metrics"].items()},
        f"eval/{split}/checkpoint": result["checkpoint"],
        f"eval/{split}/checkpoint_step": result["checkpoint_step"],
    }


def add_to_summary(run_dir: Path, cfg: DictConfig, summary: dict[str, Any]) -> bool:
    """Add ``summary`` to the W&B run ``run_dir`` logged to (``identity.json``'s ``wandb_id``),
    resumed with ``resume="allow"`` and no job type or config, so that the run keeps its own:
    an evaluation's numbers (``python -m src.eval``) or the report's comparison of the run's
    experiment (``launch.analysis.report --to-wandb``) sit beside the training's in the runs
    table. Offline, the resumed run is one more offline folder of the same id, which ``wandb
    sync`` merges into the run. Best effort, as in training; False where the record names no
    W&B run."""
    from .files import RunRecord

    _, meta = RunRecord(run_dir, enabled=False).recorded_identity()
    wandb_id = (meta or {}).get("wandb_id")
    if not wandb_id:
        return False
    logger = WandbLogger(cfg.logger, run_dir, None, run_id=wandb_id, name=run_name(cfg), tags=run_tags(cfg))
    logger.finish(summary)
    return True


class WandbLogger:
    """W&B, best effort: project, group, name and tags from the config; offline without a key.

    Mode: ``logger.mode`` if set, else ``WANDB_MODE`` from the environment, else ``online``
    when an API key is configured and ``offline`` when none is. Every call is guarded: a
    failure is reported once as a warning and W&B is switched off for the rest of the run.
    ``logged_through``: the last step this W&B run already holds; steps up to it are not sent.
    ``name`` and ``tags`` default to ``cfg.run_name`` and ``cfg.tags``; ``metric`` (``(key, mode)``)
    is defined with ``summary=mode``, so that the run's summary holds its best value, not its last.
    ``job_type``: ``train`` for a training run; None when resuming a run to add to it (evaluation),
    so that the run keeps its own. ``config`` None leaves a resumed run's config as it was.
    """

    def __init__(
        self,
        cfg: DictConfig,
        run_dir: Path,
        config: dict[str, Any],
        run_id: str | None = None,
        logged_through: int | None = None,
        name: str | None = None,
        tags: list[str] | None = None,
        metric: tuple[str, str] | None = None,
        job_type: str | None = None,
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
                name=name or cfg.get("run_name"),
                tags=list(cfg.get("tags") or []) if tags is None else tags,
                config=config,
                job_type=job_type,
                dir=str(run_dir),
                mode=mode,
                id=run_id or new_run_id(),
                resume="allow",
                settings=wandb.Settings(init_timeout=float(cfg.get("init_timeout", 60))),
            )
            if metric is not None:
                self.run.define_metric(metric[0], summary=metric[1])
        except Exception as e:  # noqa: BLE001  W&B must never stop training
            self._fail("init", e)

    def log(self, metrics: dict[str, float], step: int) -> None:
        if self.run is None or (self.logged_through is not None and step <= self.logged_through):
            return
        try:
            self.run.log(metrics, step=step)
        except Exception as e:  # noqa: BLE001
            self._fail("log", e)

    def log_checkpoint(self, path: Path, step: int, metadata: dict[str, Any]) -> None:
        """Log the checkpoint file ``path`` (``best.pt`` or ``last.pt``, just written at ``step``) as
        a version of the run's ``model-<run id>`` artifact, type ``model``, as Lightning's W&B
        logger names them: ``last.pt`` with aliases ``latest`` and ``step-<step>``, ``best.pt`` with
        ``best`` and ``best-step-<step>`` (an alias names one version: both files are saved at
        some steps), ``metadata`` with the file's name and step. W&B moves each alias to the
        newest version that has it, and gives ``latest`` to every version it logs: the loop saves
        ``best.pt`` before ``last.pt`` at a step, so ``latest`` ends on ``last.pt``. The file is
        copied into W&B's staging area at once, since the loop overwrites it."""
        if self.run is None:
            return
        try:
            import wandb

            file = Path(path).name
            aliases = ["best", f"best-step-{step}"] if file == "best.pt" else ["latest", f"step-{step}"]
            meta = {**metadata, "file": file, "step": step}
            artifact = wandb.Artifact(f"model-{self.run.id}", type="model", metadata=meta)
            artifact.add_file(str(path), name=file)
            self.run.log_artifact(artifact, aliases=aliases)
        except Exception as e:  # noqa: BLE001
            self._fail("log_artifact", e)

    def save_record(self, run_dir: Path, names: tuple[str, ...] = SENT_FILES) -> list[str]:
        """Copy the record's final files ``names`` (those ``run_dir`` has) into the W&B run's folder
        under ``record/`` and save them there with ``policy="end"``: uploaded as the run finishes
        (an offline run holds them in its ``files/record/``). Returns the names saved; a failure
        is one warning, and the run is still closed with its summary."""
        if self.run is None:
            return []
        saved = []
        try:
            base = Path(self.run.dir)
            (base / "record").mkdir(parents=True, exist_ok=True)
            for name in names:
                source = Path(run_dir) / name
                if source.is_file():
                    copy = base / "record" / name
                    shutil.copyfile(source, copy)
                    self.run.save(str(copy), base_path=str(base), policy="end")
                    saved.append(name)
        except Exception as e:  # noqa: BLE001  W&B never stops a run; the record has the files
            warnings.warn(
                f"W&B save of the record's files failed ({type(e).__name__}: {e}); the run folder has them",
                stacklevel=2,
            )
        return saved

    def finish(self, summary: dict[str, Any] | None = None) -> None:
        """Close the W&B run (with ``summary``); a second call does nothing."""
        if self.run is not None:
            try:
                if summary:
                    self.run.summary.update(
                        {k: v for k, v in summary.items() if isinstance(v, (int, float, str, dict))}
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
