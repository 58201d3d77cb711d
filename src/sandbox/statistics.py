"""P5's statistics of one sandbox run, read from its record after the fact: one flat dict.

What :func:`run_statistics` returns is meant for the run's ``summary.json`` and the report:

* ``stages/…``: the stages of the validation accuracy (:mod:`src.sandbox.stages`): plateaus,
  plateaus left, rises, the first plateau and the first rise in steps, and whether either is
  censored;
* ``cluster/<layer>/…``: each head's focus and each layer's clustering at the last snapshot,
  and ``cluster/<layer>/emerged``, the step its clustering ended its first rise (``None``:
  never, or still rising) (:mod:`src.sandbox.clustering`).

Everything is read from ``metrics.jsonl`` and ``sandbox/snapshots/``, which a resumed run writes
as an uninterrupted one does, so the two give the same statistics (tests/sandbox/
test_sandbox_resume.py).
"""

from __future__ import annotations

from pathlib import Path

from src.engine.record.files import read_metrics

from .clustering import clustering_series
from .stages import accuracy_stages, emergence

Value = float | int | bool | None


def run_statistics(run_dir: Path, test_size: int, metric: str = "val/acc") -> dict[str, Value]:
    """The run's P5 statistics (see the module docstring); ``test_size``: the examples behind
    each validation accuracy (``task.test_size``), the noise floor of the stages."""
    run_dir = Path(run_dir)
    rows = [r for r in read_metrics(run_dir) if r.get("split") == "val" and r.get(metric) is not None]
    out: dict[str, Value] = {}
    if rows:
        out.update(accuracy_stages([r["step"] for r in rows], [r[metric] for r in rows], test_size).summary())
    steps, series = clustering_series(run_dir / "sandbox")
    for key, values in series.items():
        out[key] = values[-1]
        if key.endswith("/clustering"):
            out[key.removesuffix("/clustering") + "/emerged"] = emergence(steps, values)
    return out
