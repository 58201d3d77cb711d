"""Progress display: tqdm, rich, or nothing; rank 0 only."""

from __future__ import annotations

from typing import Protocol


class Progress(Protocol):
    def update(self, step: int, **stats: float) -> None: ...
    def close(self) -> None: ...


class NoProgress:
    def update(self, step: int, **stats: float) -> None:
        pass

    def close(self) -> None:
        pass


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


def make_progress(kind: str, total: int, start: int, description: str, enabled: bool = True) -> Progress:
    if not enabled or kind == "none":
        return NoProgress()
    if kind == "rich":
        return RichProgress(total, start, description)
    return TqdmProgress(total, start, description)
