"""Seed sets' test-accuracy curves and what P5 reads from them; no torch, so the report can import it.

:class:`Curves` is what ``python -m src.sandbox.seeds`` writes (``curves.json``): every seed's
test accuracy and loss after every epoch. From it: the first epoch a seed *learns* (test
accuracy ≥ :data:`SUCCESS`), the share of seeds that learned by each epoch (never-learners in
the denominator), each seed's stages, and the success-by-epoch figure.
"""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

from src.engine.record import atomic
from src.errors import ConfigError, SuiteError


@dataclass
class Curves:
    """Every seed's test accuracy and loss after every epoch (``acc[s][e]``: seed ``seeds[s]``
    after epoch ``e + 1``), with what trained them."""

    seeds: list[int]
    overrides: list[str]
    epochs: int
    steps_per_epoch: int
    test_size: int
    acc: list[list[float]] = field(default_factory=list)
    loss: list[list[float]] = field(default_factory=list)
    seconds: float = 0.0
    attn: dict = field(default_factory=dict)  # the composed ``cfg.attn`` (its variant and options)
    # P5's clustering head every ``probe_every`` epochs (``[s][j]``: after epoch ``(j + 1) × probe_every``):
    # the last attention layer's η² by the partial sum, and its heads' largest focus
    # (src/sandbox/clustering.py); empty where the set was trained without probes
    probe_every: int = 0
    clustering: list[list[float]] = field(default_factory=list)
    focus: list[list[float]] = field(default_factory=list)
    # a set fine-tuned from another's final weights (``--init-from``, P5's curriculum): that
    # set's folder and its seeds' final test accuracy there (the initialization's own success)
    init_from: str | None = None
    init_acc: list[float] | None = None

    @property
    def variant(self) -> str:
        """The attention variant the seeds trained with (a file without ``attn``: its ``attn=``
        override, else ``standard``)."""
        given = [o.split("=", 1)[1] for o in self.overrides if o.startswith("attn=")]
        return self.attn.get("variant") or (given[-1] if given else "standard")

    def save(self, path: Path) -> None:
        atomic.write_text(Path(path), json.dumps(asdict(self)))

    def truncated(self, epochs: int) -> Curves:
        """The same seeds read only to ``epochs`` (a common budget for sets trained longer)."""
        if not 1 <= epochs <= self.epochs:
            raise ConfigError(f"--epochs {epochs}: these seeds trained {self.epochs} epochs")
        probes = epochs // self.probe_every if self.probe_every else 0
        return replace(
            self,
            epochs=epochs,
            acc=[a[:epochs] for a in self.acc],
            loss=[v[:epochs] for v in self.loss],
            clustering=[row[:probes] for row in self.clustering],
            focus=[row[:probes] for row in self.focus],
        )

    def probe_epochs(self) -> list[int]:
        """The epochs the clustering probes were taken after."""
        taken = len(self.clustering[0]) if self.clustering else 0
        return [(j + 1) * self.probe_every for j in range(taken)]

    @classmethod
    def load(cls, path: Path) -> Curves:
        """The set in ``path`` (a ``curves.json``), read as data and checked for the shape the readers
        use (:func:`shape_problem`); one :class:`ConfigError` naming the file and what is wrong
        where it is torn, of another shape, not a regular file or larger than its limit
        (:mod:`src.engine.record.bounded`)."""
        from src.engine.record.bounded import read_bytes

        path = Path(path)
        try:
            tree = json.loads(read_bytes(path, within=path.parent))
        except ValueError as error:  # torn, not UTF-8, or refused (RefusedFile)
            if isinstance(error, SuiteError):  # not a regular file, or too large: its line says so
                raise ConfigError(str(error)) from None
            raise ConfigError(f"{path} is torn or damaged (not JSON: {error}): move the set aside") from None
        problem = shape_problem(tree)
        if problem:
            raise ConfigError(f"{path} is not a seed set's curves.json ({problem}): move it aside")
        return cls(**tree)


REQUIRED = ("seeds", "overrides", "epochs", "steps_per_epoch", "test_size")


def _count(value: object, low: int = 0) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _table(value: object, rows: int, length: int | None, accuracy: bool) -> str | None:
    """What is wrong with a per-seed table (``rows`` lists of ``length`` numbers, accuracies in [0, 1]
    where ``accuracy``), or None."""
    if not isinstance(value, list) or len(value) != rows:
        return f"not {rows} rows, one per seed"
    for i, row in enumerate(value):
        if not isinstance(row, list) or (length is not None and len(row) != length):
            return f"row {i} is not {length} values" if length is not None else f"row {i} is not a list"
        for x in row:
            if not _number(x) or (accuracy and not 0 <= x <= 1):
                return f"row {i} holds {x!r}, not {'an accuracy in [0, 1]' if accuracy else 'a number'}"
    return None


def shape_problem(tree: object) -> str | None:
    """What keeps ``tree`` (a parsed ``curves.json``) from being a :class:`Curves` the readers can
    use, or None: its keys, their types, one row per seed of one value per epoch, accuracies in
    [0, 1] (a fraction of the test set)."""
    if not isinstance(tree, dict):
        return f"a JSON {type(tree).__name__}, not an object"
    known = {f.name for f in fields(Curves)}
    unknown, missing = sorted(set(tree) - known), [k for k in REQUIRED if k not in tree]
    if unknown or missing:
        return f"unknown keys {unknown}" if unknown else f"no {', '.join(missing)}"
    seeds = tree["seeds"]
    if (
        not isinstance(seeds, list)
        or not seeds
        or not all(_count(s) for s in seeds)
        or len(set(seeds)) < len(seeds)
    ):
        return "its seeds are not distinct integers"
    if not isinstance(tree["overrides"], list) or not all(isinstance(o, str) for o in tree["overrides"]):
        return "its overrides are not a list of strings"
    for key, low in (("epochs", 1), ("steps_per_epoch", 1), ("test_size", 1), ("probe_every", 0)):
        if key in tree and not _count(tree[key], low):
            return f"its {key} is {tree[key]!r}, not an integer of at least {low}"
    epochs, n = tree["epochs"], len(seeds)
    problem = _table(tree.get("acc"), n, epochs, accuracy=True)
    if problem:
        return f"acc: {problem}"
    for key in ("loss", "clustering", "focus"):
        if tree.get(key):
            problem = _table(tree[key], n, epochs if key == "loss" else None, accuracy=False)
            if problem:
                return f"{key}: {problem}"
    probes = {len(row) for row in tree.get("clustering") or []} | {
        len(row) for row in tree.get("focus") or []
    }
    every = tree.get("probe_every", 0)
    if probes and (len(probes) > 1 or not every or max(probes) > epochs // every):
        return f"its probes are not one per {every} epochs of {epochs}"
    if tree.get("init_acc") is not None:
        problem = _table([tree["init_acc"]], 1, n, accuracy=True)
        if problem:
            return "init_acc: not one accuracy in [0, 1] per seed"
    if not _number(tree.get("seconds", 0.0)) or not isinstance(tree.get("attn", {}), dict):
        return "its seconds are not a number, or its attn not an object"
    if tree.get("init_from") is not None and not isinstance(tree["init_from"], str):
        return "its init_from is not a folder's name"
    return None


SUCCESS = 0.95  # P5's "learned": test accuracy at least this


def first_success(acc: Sequence[float], threshold: float = SUCCESS) -> int | None:
    """The first epoch (1-based) whose test accuracy is at least ``threshold``; None: never (censored)."""
    return next((e + 1 for e, a in enumerate(acc) if a >= threshold), None)


def success_by_epoch(curves: Curves, threshold: float = SUCCESS) -> list[float]:
    """The fraction of seeds that have reached ``threshold`` by each epoch (``[e]``: by epoch
    ``e + 1``): the empirical distribution of the first success, the never-learners counted
    in the denominator (censored at the last epoch, never dropped)."""
    firsts = [first_success(a, threshold) for a in curves.acc]
    return [sum(f is not None and f <= e for f in firsts) / len(firsts) for e in range(1, curves.epochs + 1)]


STAGE_EVERY = 5  # epochs between the points the stages are read at


def seed_table(curves: Curves, threshold: float = SUCCESS, every: int = STAGE_EVERY) -> list[dict]:
    """Per seed: its first success, its final accuracy, and its stages (src/sandbox/stages.py),
    in epochs. [reading] The stages are read from every ``every``-th epoch (5: the cadence
    their prices were calibrated at, seed 11 validated every 5 epochs); read every epoch, the
    same rule cuts a 1,000-point curve into tens of plateaus, the epoch-to-epoch moves of a
    fixed test set being smaller than its sampling floor but not noise."""
    from .stages import accuracy_stages

    rows = []
    for seed, acc in zip(curves.seeds, curves.acc, strict=True):
        epochs = list(range(every, len(acc) + 1, every)) or [len(acc)]
        found = accuracy_stages(epochs, [acc[e - 1] for e in epochs], curves.test_size)
        rows.append(
            {
                "seed": seed,
                "first_success": first_success(acc, threshold),
                "final": acc[-1],
                **{k.removeprefix("stages/"): v for k, v in found.summary().items()},
            }
        )
    return rows


def draw_success(named: dict[str, Curves], path: Path | io.BytesIO, threshold: float = SUCCESS) -> None:
    """The success-by-epoch curve of each named set of seeds, in one figure (P5's way), as a PNG
    to ``path`` (a file name or a buffer)."""
    import matplotlib

    matplotlib.use("Agg")
    import textwrap

    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.6 + 0.3 * len(named)), constrained_layout=True)
    for name, curves in named.items():
        rate = success_by_epoch(curves, threshold)
        label = f"{name}: {rate[-1]:.0%} of {len(curves.seeds)} seeds"
        ax.step(range(1, curves.epochs + 1), rate, where="post", label=textwrap.fill(label, 70))
    ax.set(xlabel="epoch", ylabel=f"seeds at ≥ {threshold:.0%} test accuracy", ylim=(0, 1))
    ax.grid(alpha=0.3)
    fig.legend(loc="outside lower center", fontsize="small", ncols=1)
    fig.savefig(path, dpi=110, format="png")
    plt.close(fig)


def draw_clustering(named: dict[str, Curves], path: Path | io.BytesIO, threshold: float = SUCCESS) -> None:
    """P5's clustering head over training, one panel per set with probes: each seed's η² (the
    last attention layer's output grouped by the partial sum), coloured by whether the seed
    learned, with each group's median; a dot where each learner learned. A PNG to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    probed = {name: c for name, c in named.items() if c.probe_epochs()}
    fig, axes = plt.subplots(
        1,
        max(1, len(probed)),
        figsize=(4.2 * max(1, len(probed)), 3.4),
        squeeze=False,
        constrained_layout=True,
    )
    for ax, (name, curves) in zip(axes[0], probed.items(), strict=False):
        epochs = curves.probe_epochs()
        groups: dict[bool, list[list[float]]] = {True: [], False: []}
        for acc, series in zip(curves.acc, curves.clustering, strict=True):
            learned = first_success(acc, threshold)
            colour = "tab:blue" if learned else "tab:gray"
            ax.plot(epochs, series, color=colour, alpha=0.25, lw=0.7)
            if learned:
                ax.plot(
                    learned,
                    series[min(len(series), max(1, learned // curves.probe_every)) - 1],
                    ".",
                    color=colour,
                )
            groups[learned is not None].append(series)
        for learned, rows in groups.items():
            if rows:
                median = [sorted(col)[len(col) // 2] for col in zip(*rows, strict=True)]
                label = f"{'learned' if learned else 'never learned'} ({len(rows)}), median"
                ax.plot(epochs, median, color="tab:blue" if learned else "black", lw=2, label=label)
        ax.set(title=name[:60], xlabel="epoch", ylabel="clustering η² (partial sum)", ylim=(0, 1.02))
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small", loc="lower right")
    fig.savefig(path, dpi=110, format="png")
    plt.close(fig)
