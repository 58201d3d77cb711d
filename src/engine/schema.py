"""The trainer group's schema: Hydra checks each option's type when it composes the config.

``trainer.max_steps=abc`` then fails before anything runs, naming the key and the type it
wanted; :func:`check_values` adds the checks a type cannot express (ranges, choices).
"""

from __future__ import annotations

from dataclasses import dataclass

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig

from src import resolvers  # noqa: F401  ${cpus_at_most:…} (trainer.num_workers) and the others
from src.errors import ConfigError

CHOICES = {
    "precision": ("fp32", "bf16"),
    "progress": ("tqdm", "rich", "none"),
    "nonfinite": ("stop", "skip"),
    "resume": ("auto", "never", "restart"),
}


@dataclass
class TrainerSchema:
    max_steps: int | None = None
    max_epochs: int | None = None
    accumulate: int = 1
    val_every: int = 100
    val_every_epochs: float | None = None
    eval_batches: int | None = None
    log_every: int = 10
    monitor_every: int = 100
    checkpoint_every: int = 100
    clip_grad: float | None = None
    precision: str = "fp32"
    compile: bool = False
    ema: float | None = None
    device: str = "auto"
    num_workers: int = 0
    threads: int | None = None
    flush_denormal: bool = True
    progress: str = "tqdm"
    nonfinite: str = "stop"
    nonfinite_limit_consecutive: int = 10
    nonfinite_limit_total: int | None = None
    resume: str = "auto"
    collapse_entropy: float | None = 0.05
    test_after: str | None = None


ConfigStore.instance().store(group="trainer", name="schema", node=TrainerSchema)


def check_values(cfg: DictConfig) -> None:
    """Ranges and choices of the trainer's options, and the seed; one message per mistake."""
    t = cfg.trainer
    if not isinstance(cfg.seed, int) or isinstance(cfg.seed, bool):
        raise ConfigError(f"seed={cfg.seed!r} must be an integer")
    if not (t.max_steps or t.max_epochs):
        raise ConfigError("a run needs a length: set trainer.max_steps or trainer.max_epochs (≥ 1)")
    for key in ("max_steps", "max_epochs"):
        if t[key] is not None and t[key] < 1:
            raise ConfigError(f"trainer.{key}={t[key]} must be at least 1 (or null)")
    for key in ("accumulate", "log_every", "checkpoint_every", "nonfinite_limit_consecutive"):
        if t[key] < 1:
            raise ConfigError(f"trainer.{key}={t[key]} must be at least 1")
    for key in ("val_every", "monitor_every", "num_workers"):
        if t[key] < 0:
            raise ConfigError(f"trainer.{key}={t[key]} must be 0 or more")
    if t.nonfinite_limit_total is not None and t.nonfinite_limit_total < 1:
        raise ConfigError(
            f"trainer.nonfinite_limit_total={t.nonfinite_limit_total} must be at least 1 (or null)"
        )
    for key, allowed in CHOICES.items():
        if t[key] not in allowed:
            raise ConfigError(f"trainer.{key}={t[key]!r} is not one of {', '.join(allowed)}")
    if t.get("test_after") not in (None, "best", "last"):
        raise ConfigError(f"trainer.test_after={t.test_after!r} is not one of best, last, null")
