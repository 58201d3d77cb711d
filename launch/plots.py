"""The report's PNG plots: per task × backbone, the main metric and κ over training.

Each experiment is one line (mean over its seeds, a band from the lowest to the highest seed);
κ's panels add the attention entropy beside κ(P), which a collapsed attention drives to 1.
Apart from :mod:`launch.report` because they need matplotlib, imported only when drawing.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from .records import Run, options
from .results import describe

KAPPAS = ["W_Q", "W_K", "W_V", "X", "P", "A"]


def plot(runs: list[Run], out: Path) -> list[Path]:
    """Per task × backbone: the main metric over training, and κ over training, per experiment
    (its variant, and its settings where the experiments of that task and backbone differ)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    done = [r for r in runs if r.rows and r.metric and r.status != "unreadable"]
    settings = options(runs)

    def label(run: Run) -> str:
        extra = describe(settings.get(run.experiment, {}))
        return run.attn if extra == "—" else f"{run.attn} ({extra})"

    for task, backbone in sorted({(r.task, r.backbone) for r in done}):
        group = [r for r in done if (r.task, r.backbone) == (task, backbone)]
        labels = sorted({label(r) for r in group})
        metric = group[0].metric
        fig, ax = plt.subplots(figsize=(6, 4))
        for name in labels:
            _band(ax, [r.series(metric) for r in group if label(r) == name], name)
        ax.set(xlabel="step", ylabel=metric, title=f"{task} · {backbone}")
        ax.legend(fontsize=8)
        written.append(_save(fig, out / f"curves_{task}_{backbone}.png"))

        keys = [f"kappa/{k}/median" for k in KAPPAS]
        if any(r.series("kappa/P/median", "monitor")[0] for r in group):  # κ(P) = 1 when P collapses:
            keys.insert(keys.index("kappa/P/median") + 1, "entropy/P/median")  # its entropy beside it
        monitored = [k for k in keys if any(r.series(k, "monitor")[0] for r in group)]
        if monitored:
            fig, axes = plt.subplots(1, len(monitored), figsize=(3.2 * len(monitored), 3), squeeze=False)
            for ax, k in zip(axes[0], monitored, strict=True):
                for name in labels:
                    _band(ax, [r.series(k, "monitor") for r in group if label(r) == name], name)
                what = k.split("/")[1]
                if k.startswith("kappa/"):
                    ax.set(yscale="log", xlabel="step", title=f"median κ({what})")
                else:
                    ax.set(xlabel="step", ylim=(0, 1.05), title="median entropy(P) (1 uniform, 0 one-hot)")
            axes[0][0].legend(fontsize=7)
            fig.suptitle(f"{task} · {backbone}")
            written.append(_save(fig, out / f"kappa_{task}_{backbone}.png"))
    return written


def _band(ax, series: list[tuple[list[int], list[float]]], label: str) -> None:
    """Mean over seeds, with the band between the lowest and highest seed, at their common steps."""
    series = [s for s in series if s[0]]
    if not series:
        return
    common = sorted(set.intersection(*(set(steps) for steps, _ in series)))
    per_seed = [[dict(zip(steps, values, strict=True))[s] for s in common] for steps, values in series]
    columns = list(zip(*per_seed, strict=True))
    mean = [statistics.fmean(c) for c in columns]
    (line,) = ax.plot(common, mean, label=f"{label} (n={len(series)})")
    if len(series) > 1:
        ax.fill_between(
            common, [min(c) for c in columns], [max(c) for c in columns], alpha=0.2, color=line.get_color()
        )


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path
