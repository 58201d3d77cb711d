"""Progress display, main process only: a bar on a terminal, plain log lines elsewhere.

``trainer.progress`` picks tqdm or rich; either becomes :class:`LogProgress` when stdout is not
a terminal (a SLURM job, a pipe, ``nohup``), and ``none`` always means log lines, not silence.
The log lines go through Python logging, which Hydra sends to the console and to the run
folder's ``run.log``, so that a job's log shows how far it got and how fast.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Protocol

from ..record.announce import clock

log = logging.getLogger("src.progress")


class Progress(Protocol):
    def update(self, step: int, **stats: float) -> None: ...
    def close(self) -> None: ...


class NoProgress:
    def update(self, step: int, **stats: float) -> None:
        pass

    def close(self) -> None:
        pass


class LogProgress:
    """One log line when the run has gone another ``every_fraction`` of its steps or
    ``every_s`` seconds since the last line, and at the last step: step, percent, the stats,
    elapsed time and the time left at this session's pace."""

    def __init__(
        self, total: int, start: int, description: str, every_s: float = 60.0, every_fraction: float = 0.1
    ) -> None:
        self.total, self.start, self.description = total, start, description
        self.every_s, self.every_steps = every_s, max(1, round(every_fraction * total))
        self.started = self.last_time = time.monotonic()
        self.last_step = start

    def update(self, step: int, **stats: float) -> None:
        now = time.monotonic()
        due = step - self.last_step >= self.every_steps or now - self.last_time >= self.every_s
        if not (due or step >= self.total) or step == self.last_step:
            return
        self.last_step, self.last_time = step, now
        log.info(
            progress_line(self.description, step, self.total, stats, now - self.started, step - self.start)
        )

    def close(self) -> None:
        pass


def progress_line(
    description: str, step: int, total: int, stats: dict[str, float], elapsed: float, done: int
) -> str:
    """``lra_listops step 120/1000 (12%) loss=0.5312 samples/s=812 · 0:12 elapsed, 1:28 left``."""
    shown = " ".join(f"{k}={v:.4g}" for k, v in stats.items())
    left = elapsed / done * (total - step) if done > 0 else None
    times = f"{clock(elapsed)} elapsed" + (f", {clock(left)} left" if left is not None else "")
    return f"{description} step {step}/{total} ({100 * step / max(total, 1):.0f}%) {shown} · {times}"


class TqdmProgress:
    def __init__(self, total: int, start: int, description: str) -> None:
        from tqdm.auto import tqdm

        self.bar = tqdm(total=total, initial=start, desc=description, dynamic_ncols=True, unit="step")

    def update(self, step: int, **stats: float) -> None:
        self.bar.update(step - self.bar.n)
        if stats:
            self.bar.set_postfix({k: f"{v:.4g}" for k, v in stats.items()}, refresh=False)

    def close(self) -> None:
        self.bar.close()


class RichProgress:
    def __init__(self, total: int, start: int, description: str) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            TextColumn("{task.fields[stats]}"),
        )
        self.task = self.progress.add_task(description, total=total, completed=start, stats="")
        self.progress.start()

    def update(self, step: int, **stats: float) -> None:
        fields = {"stats": " ".join(f"{k}={v:.4g}" for k, v in stats.items())} if stats else {}
        self.progress.update(self.task, completed=step, **fields)

    def close(self) -> None:
        self.progress.stop()


def on_terminal() -> bool:
    """Whether a bar can be drawn: stdout and stderr are both a terminal."""
    return sys.stdout.isatty() and sys.stderr.isatty()


def make_progress(kind: str, total: int, start: int, description: str, enabled: bool = True) -> Progress:
    """The display ``kind`` asks for, as the module docstring says; nothing off the main process."""
    if not enabled:
        return NoProgress()
    if kind == "none" or not on_terminal():
        return LogProgress(total, start, description)
    if kind == "rich":
        return RichProgress(total, start, description)
    return TqdmProgress(total, start, description)
