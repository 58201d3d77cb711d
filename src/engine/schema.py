"""The trainer group's schema: Hydra checks each option's type when it composes the config.

The schema states types only; every value, defaults included, is ``conf/trainer/default.yaml``'s.
``trainer.max_steps=abc`` then fails before anything runs, naming the key and the type it
wanted; an option no trainer file gives a value is refused by :func:`check_stated`, naming it;
:func:`check_values` adds, once and before the record opens, the checks a type cannot
express: the range of every numeric option a run has (:data:`RANGES`: the trainer's, the task's
batch sizes and validation fraction, the optimizer's and the schedule's), the choices, and that no
number in the config is NaN or infinite.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from src import resolvers  # noqa: F401  ${cpus_at_most:…} (trainer.num_workers) and the others
from src.errors import ConfigError

from .record.identity import flatten

CHOICES = {
    "precision": ("fp32", "bf16"),
    "progress": ("tqdm", "rich", "none"),
    "nonfinite": ("stop", "skip"),
    "resume": ("auto", "never", "restart"),
}


@dataclass
class TrainerSchema:
    """The type of every trainer option; the values, defaults included, are conf/trainer/default.yaml's
    (each stated once). ``MISSING``: a trainer file that leaves an option out is refused by
    :func:`check_stated`, naming it, rather than running on a value stated nowhere."""

    max_steps: int | None = MISSING
    max_epochs: int | None = MISSING
    accumulate: int = MISSING
    val_every: int = MISSING
    val_every_epochs: float | None = MISSING
    val_at_start: bool | None = MISSING
    eval_batches: int | None = MISSING
    log_every: int = MISSING
    monitor_every: int = MISSING
    checkpoint_every: int = MISSING
    checkpoints: bool = MISSING
    clip_grad: float | None = MISSING
    precision: str = MISSING
    compile: bool = MISSING
    ema: float | None = MISSING
    device: str = MISSING
    num_workers: int = MISSING
    threads: int | None = MISSING
    flush_denormal: bool = MISSING
    progress: str = MISSING
    nonfinite: str = MISSING
    nonfinite_limit_consecutive: int = MISSING
    nonfinite_limit_total: int | None = MISSING
    resume: str = MISSING
    collapse_entropy: float | None = MISSING
    test_after: str | None = MISSING


ConfigStore.instance().store(group="trainer", name="schema", node=TrainerSchema)


@dataclass(frozen=True)
class Range:
    """The values a numeric option may take: from ``low`` to ``high`` (None: unbounded), each end
    open or closed, an integer or any real number, and whether null (off) is allowed."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    integer: bool = False
    nullable: bool = False

    def admits(self, value: object) -> bool:
        if value is None:
            return self.nullable
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return False
        if self.integer and value != int(value):
            return False
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)

    def __str__(self) -> str:
        low, high = (_number(v) for v in (self.low, self.high))
        if self.integer and self.low is not None and self.high is not None:
            text = f"an integer from {low} to {high}"
        elif self.low is not None and self.high is not None:
            text = f"in {'(' if self.low_open else '['}{low}, {high}{')' if self.high_open else ']'}"
        elif self.low is not None:
            text = f"{'greater than' if self.low_open else 'at least'} {low}"
        else:
            text = "an integer" if self.integer else "a finite number"
        return text + (" (or null)" if self.nullable else "")


def _number(value: float | None) -> str:
    return str(int(value)) if value is not None and value == int(value) else str(value)


AT_LEAST_1 = Range(1, integer=True)
AT_LEAST_0 = Range(0, integer=True)
POSITIVE = Range(0, low_open=True)
#: Every numeric option a run of any task has, and its range, checked before the record opens
#: (an option a task does not have is skipped): a value out of range either fails later in a
#: traceback (a batch of 0) or, worse, trains wrong and says "completed" (a negative clipping norm
#: flips the gradient, an EMA decay over 1 diverges, ``eval_batches=-1`` never validates).
RANGES: dict[str, Range] = {
    "seed": Range(0, 2**32 - 1, integer=True),  # NumPy's seeds
    "task.batch_size": AT_LEAST_1,
    "task.eval_batch_size": AT_LEAST_1,
    "task.val_fraction": Range(0, 1, low_open=True, high_open=True),
    "task.test_fraction": Range(0, 1, high_open=True, nullable=True),
    "optim.lr": POSITIVE,
    "optim.weight_decay": Range(0),
    "optim.momentum": Range(0, 1, high_open=True),
    "sched.lr_min": Range(0),
    "sched.warmup_lr_init": Range(0),
    "sched.warmup_steps": Range(0, integer=True, nullable=True),
    "sched.warmup_epochs": Range(0, nullable=True),
    "trainer.max_steps": Range(1, integer=True, nullable=True),
    "trainer.max_epochs": Range(1, integer=True, nullable=True),
    "trainer.accumulate": AT_LEAST_1,
    "trainer.log_every": AT_LEAST_1,
    "trainer.checkpoint_every": AT_LEAST_1,
    "trainer.nonfinite_limit_consecutive": AT_LEAST_1,
    "trainer.nonfinite_limit_total": Range(1, integer=True, nullable=True),
    "trainer.val_every": AT_LEAST_0,
    "trainer.monitor_every": AT_LEAST_0,
    "trainer.num_workers": AT_LEAST_0,
    "trainer.val_every_epochs": Range(0, low_open=True, nullable=True),
    "trainer.eval_batches": Range(1, integer=True, nullable=True),
    "trainer.clip_grad": Range(0, low_open=True, nullable=True),
    "trainer.ema": Range(0, 1, low_open=True, high_open=True, nullable=True),
    "trainer.threads": Range(1, integer=True, nullable=True),
    "trainer.collapse_entropy": Range(0, nullable=True),
}
ABSENT = object()


def check_stated(cfg: DictConfig) -> None:
    """Every trainer option has a value: :class:`TrainerSchema` states types only, so an option
    the trainer file leaves out is ``???`` until here, where it is one :class:`ConfigError`."""
    missing = sorted(OmegaConf.missing_keys(cfg.trainer))  # full paths: trainer.log_every
    if missing:
        raise ConfigError(
            f"{', '.join(missing)}: no value; conf/trainer/default.yaml states each trainer option's "
            "default (a trainer file of your own: begin its defaults list with `default`), or set it"
        )


def check_values(cfg: DictConfig) -> None:
    """Ranges and choices of the run's options (:data:`RANGES`, :data:`CHOICES`), and that no
    number anywhere in the config is NaN or infinite; one :class:`ConfigError` per mistake."""
    check_stated(cfg)
    t = cfg.trainer
    if not isinstance(cfg.seed, int) or isinstance(cfg.seed, bool):
        raise ConfigError(f"seed={cfg.seed!r} must be an integer")
    if not (t.max_steps or t.max_epochs):
        raise ConfigError("a run needs a length: set trainer.max_steps or trainer.max_epochs (≥ 1)")
    for key, allowed in RANGES.items():
        value = OmegaConf.select(cfg, key, default=ABSENT)
        if value is not ABSENT and not allowed.admits(value):
            raise ConfigError(f"{key}={value!r} must be {allowed}")
    for key, allowed in CHOICES.items():
        if t[key] not in allowed:
            raise ConfigError(f"trainer.{key}={t[key]!r} is not one of {', '.join(allowed)}")
    if t.get("test_after") not in (None, "best", "last"):
        raise ConfigError(f"trainer.test_after={t.test_after!r} is not one of best, last, null")
    if cfg.get("stage") not in (None, "confirm"):
        raise ConfigError(f"stage={cfg.stage!r} is not one of confirm, null (an exploratory run)")
    plain = OmegaConf.to_container(cfg, resolve=False)  # values as given: an interpolation is
    plain.pop("hydra", None)  # checked where it points, and resolving here would fail first on a
    # task and backbone that do not fit (check_compatible names them)
    for key, value in flatten(plain).items():
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{key}={value} is not a finite number")
