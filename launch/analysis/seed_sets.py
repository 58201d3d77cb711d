"""Seed sets side by side: ``python -m launch.analysis.seed_sets DIR [DIR …] [--baseline DIR] [--out FIG]``.

Each ``DIR`` holds a ``curves.json`` written by ``python -m src.sandbox.seeds`` (the test
accuracy of every seed after every epoch). For each set, one row:

* **learned**: the share of seeds at ≥ 95% test accuracy by the last epoch, with its exact
  (Clopper–Pearson) 95% interval; a seed that never gets there counts in the denominator;
* **epochs to learn**: the Kaplan–Meier median of the first epoch at ≥ 95%, the never-learners
  right-censored at the last epoch (:func:`launch.analysis.time_to_quality.km_median`), with its 95%
  interval and the number censored; "not reached" when fewer than half the seeds learn;
* **against the baseline** (the first set, or ``--baseline``), paired by seed, which both sets
  must share: the seeds that learned first in each (a seed learns first when it gets there and
  the other does not, or gets there at an earlier epoch),
  the exact sign test's one-sided p-values, and the verdict *faster* / *slower* at 2.5% a side,
  *equivalent* when TOST puts the share of those seeds that learned first here inside
  ``0.5 ± margin`` (:data:`launch.analysis.stats.SHARE_MARGIN`, ``--margin``; 5% each side), else
  *inconclusive*, raw and after Holm over the sets compared (the same rule as every verdict,
  docs/methods.md#verdicts).

The figure (``--out``) draws each set's success-by-epoch curve (:func:`src.sandbox.curves.draw_success`).
"""

from __future__ import annotations

import argparse
import io
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from scipy.stats import binomtest

from launch.analysis import verdict_row
from launch.analysis.stats import SHARE_MARGIN, share_tests
from launch.analysis.time_to_quality import Median, km_median
from launch.analysis.verdict_row import Verdict, adjust, known_test
from src.command import command_parser, run_command
from src.errors import ConfigError
from src.sandbox.curves import SUCCESS, Curves, draw_clustering, draw_success, first_success


@dataclass(frozen=True)
class Row:
    """One seed set's success and its epochs to learn; and, for a set that is not the baseline, its
    paired comparison with it (``versus``, the suite's one verdict row,
    :class:`launch.analysis.verdict_row.Verdict` of measure ``learns_first``)."""

    name: str
    seeds: int
    learned: int
    low: float
    high: float
    median: Median
    faster: int | None = None  # seeds that learned first here, against the baseline
    slower: int | None = None
    versus: Verdict | None = None  # the sign test against the baseline (None: the baseline)

    @property
    def p_faster(self) -> float | None:
        return None if self.versus is None else self.versus.p_for

    @property
    def p_slower(self) -> float | None:
        return None if self.versus is None else self.versus.p_against

    @property
    def p_equivalent(self) -> float | None:
        return None if self.versus is None else self.versus.p_equivalent

    @property
    def verdict(self) -> str:
        """*faster*, *slower*, *equivalent* or *inconclusive* ("" for the baseline)."""
        return "" if self.versus is None else self.versus.verdict

    @property
    def adjusted(self) -> str:
        """The verdict after Holm over the sets compared ("" for the baseline)."""
        return "" if self.versus is None else self.versus.adjusted


def arrivals(curves: Curves, threshold: float = SUCCESS) -> list[tuple[float, bool]]:
    """Per seed, ``(epoch, learned)``: the first epoch at ``threshold``, or the last, censored."""
    out = []
    for acc in curves.acc:
        first = first_success(acc, threshold)
        out.append((float(first), True) if first is not None else (float(curves.epochs), False))
    return out


def compare(
    named: dict[str, Curves], baseline: str, threshold: float = SUCCESS, margin: float | None = SHARE_MARGIN
) -> list[Row]:
    """One :class:`Row` per set, the baseline first; the others paired with it by seed (``margin``:
    the sign test's, None for no equivalence)."""
    base = named[baseline]
    rows: list[Row] = []
    for name, curves in named.items():
        seeds = arrivals(curves, threshold)
        learned = sum(r for _, r in seeds)
        interval = binomtest(learned, len(seeds)).proportion_ci(0.95, method="exact")
        median = km_median([e for e, _ in seeds], [r for _, r in seeds])
        row = Row(name, len(seeds), learned, interval.low, interval.high, median)
        if name != baseline:
            if curves.seeds != base.seeds or curves.epochs != base.epochs:
                raise ConfigError(
                    f"{name} and the baseline {baseline} must hold the same seeds and epochs to be "
                    f"paired: {len(curves.seeds)} seeds × {curves.epochs} epochs against "
                    f"{len(base.seeds)} × {base.epochs}"
                )
            paired = list(zip(arrivals(base, threshold), seeds, strict=True))
            first = [r[1] and (not b[1] or r[0] < b[0]) for b, r in paired]
            later = [b[1] and (not r[1] or b[0] < r[0]) for b, r in paired]
            faster, slower = sum(first), sum(later)
            p_faster, p_slower, p_eq = 1.0, 1.0, None  # no discordant seed: nothing to test
            if faster + slower:
                p_faster, p_slower, p_eq = share_tests(faster, faster + slower, margin)
            share = faster / (faster + slower) if faster + slower else None
            test = known_test(faster + slower, share, None, None, p_faster, p_slower, p_eq)
            versus = Verdict(None, "", name, faster + slower, None, share, share, None, None, None)
            versus.test, versus.margin, versus.measured = test, margin, "learns_first"
            row = replace(row, faster=faster, slower=slower, versus=versus)
        rows.append(row)
    adjust([r.versus for r in rows if r.versus is not None])  # Holm over the sets compared
    return rows


#: the comparison's columns of :func:`table` (:data:`launch.analysis.verdict_row.COLUMNS`)
VERSUS = ("p for / against", "verdict / holm")


def table(rows: Sequence[Row], threshold: float = SUCCESS) -> str:
    """The rows as a Markdown table."""
    lines = [
        f"| seeds | learned (≥ {threshold:.0%}) [95%] | epochs to learn, KM median [95%] | "
        "learned first: here / baseline | p faster / slower | verdict raw / Holm |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        cells = (
            "baseline | — | —"
            if r.versus is None
            else f"{r.faster} / {r.slower} | {verdict_row.cells(r.versus, VERSUS)}"
        )
        lines.append(
            f"| `{r.name}` ({r.seeds}) | {r.learned} of {r.seeds} [{r.low:.0%}, {r.high:.0%}] | "
            f"{r.median} | {cells} |"
        )
    return "\n".join(lines)


def names(sets: list[tuple[Path, Curves]]) -> list[str]:
    """Each set's overrides less those every set shares (and ``trainer.compile``, which changes
    no arithmetic); the folder's name where nothing is left or two would read the same."""
    shared = set.intersection(*(set(c.overrides) for _, c in sets)) if len(sets) > 1 else set()
    out: list[str] = []
    for folder, curves in sets:
        kept = [o for o in curves.overrides if o not in shared and not o.startswith("trainer.compile")]
        if curves.init_from:
            kept.append(f"--init-from {Path(curves.init_from).name}")
        name = " ".join(kept) or folder.name
        out.append(name if name not in out else str(folder))
    return out


def given(curves: Curves) -> dict[str, str]:
    """The set's overrides as ``{key: value}`` (the last value where a key repeats)."""
    return dict(o.split("=", 1) for o in curves.overrides if "=" in o)


def backbone_of(curves: Curves) -> str:
    """The ``backbone=`` a set was trained with (``sandbox``, the task's default, when none)."""
    return given(curves).get("backbone", "sandbox")


#: the overrides that choose the variant (and ``trainer.compile``, which changes no arithmetic)
VARIANT_KEYS = ("attn", "reading", "trainer.compile")


def setting(curves: Curves, init: bool | None = None) -> tuple:
    """What a set shares with the sets it is paired with: its overrides but the variant's, its
    seeds, its epochs and whether it was fine-tuned from another set (``init``: as if it were, or
    were not)."""
    kept = {k: _sortable(v) for k, v in given(curves).items() if k not in VARIANT_KEYS}  # 3e-3 is 0.003
    tuned = bool(curves.init_from) if init is None else init
    return tuple(sorted(kept.items())), tuple(curves.seeds), curves.epochs, tuned


def is_standard(curves: Curves) -> bool:
    return curves.variant == "standard"


#: overrides that tell variants apart, not cells of a hyper-parameter grid
NOT_GRID = (*VARIANT_KEYS, "experiment")


def grid_keys(sets: Sequence[Curves]) -> list[str]:
    """The override keys whose values differ between ``sets`` (a grid's axes; the variant's keys
    and the experiment left out), in the order the first set gives them."""
    parsed = [given(c) for c in sets]
    keys = list(dict.fromkeys(k for p in parsed for k in p))
    return [k for k in keys if k not in NOT_GRID and len({p.get(k) for p in parsed}) > 1]


def grid_groups(sets: Sequence[Curves]) -> dict[str, tuple[list[Curves], list[str]]]:
    """Per variant, its sets and the keys they form a grid over, where they do (2 sets or more,
    one or two keys)."""
    by_variant: dict[str, list[Curves]] = {}
    for c in sets:
        by_variant.setdefault(c.variant, []).append(c)
    found = {}
    for variant, group in by_variant.items():
        keys = grid_keys(group)
        if len(group) >= 2 and 1 <= len(keys) <= 2:
            found[variant] = (group, keys)
    return found


def grid_sets(sets: Sequence[Curves]) -> list[Curves]:
    return [c for group, _ in grid_groups(sets).values() for c in group]


#: what P5 says of each ablation its code sweeps, in words (it prints no number for any of them);
#: "no statement" where the text the suite holds (docs/methods.md) says nothing of the key
P5_SAYS = {
    "backbone.model.init_scale": 'P5 (abstract) analyses "the effects of initialization and curriculum '
    'learning" on these dynamics, with no number',
    **dict.fromkeys(
        (
            "optim.lr",
            "task.batch_size",
            "backbone.model.ffn_dim",
            "optim.mlp_lr_discount",
            "backbone.model.ffn_bias",
        ),
        "P5 states no result for this sweep in the text the suite holds (its code's grid sweeps it: "
        "facebookresearch/pal, projects/visualization/configs.py); its recipe is the reference",
    ),
}


def grid_section(backbone: str, sets: Sequence[Curves]) -> tuple[list[str], dict[str, bytes]]:
    """Where a backbone's sets of one variant form a grid over one or two keys (2 sets or more):
    a table of each cell's success and epochs to learn, what P5 says of the keys
    (:data:`P5_SAYS`), and the figure P5 draws of it (success rate against the first key, one line
    per value of the second). Nothing otherwise."""
    lines: list[str] = []
    pngs: dict[str, bytes] = {}
    for variant, (group, keys) in grid_groups(sets).items():
        cells = []
        for c in group:
            (row,) = compare({"cell": c}, "cell")
            cells.append(({k: given(c).get(k, "default") for k in keys}, row, c))
        name = f"p5_grid_{backbone}_{variant}.png"
        lines += [
            "",
            f"#### `{backbone}`, `{variant}`: success against {' × '.join(f'`{k}`' for k in keys)}",
            "",
            f"| {' | '.join(keys)} | seeds × epochs | learned [95%] | epochs to learn, KM median [95%] |",
            "| " + " | ".join("---" for _ in keys) + " | --- | --- | --- |",
        ]
        for values, row, c in sorted(cells, key=lambda cell: [_sortable(v) for v in cell[0].values()]):
            lines.append(
                f"| {' | '.join(values.values())} | {row.seeds} × {c.epochs} | {row.learned} of {row.seeds} "
                f"[{row.low:.0%}, {row.high:.0%}] | {row.median} |"
            )
        lines += [f"\n`{k}`: {P5_SAYS[k]}." for k in keys if k in P5_SAYS]
        buffer = io.BytesIO()
        draw_grid([(values, row) for values, row, _ in cells], keys, buffer)
        pngs[name] = buffer.getvalue()
        lines += ["", f"![success against {', '.join(keys)}]({name})"]
    return lines, pngs


def _sortable(value: str) -> tuple[int, float, str]:
    try:
        return (0, float(value), "")
    except ValueError:
        return (1, 0.0, value)


def draw_grid(cells: Sequence[tuple[dict[str, str], Row]], keys: Sequence[str], path) -> None:
    """Success rate [exact 95%] against ``keys[0]`` (log axis where its values are positive and span
    a factor of 10), one line per value of ``keys[1]`` if any, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines: dict[str, list[tuple[float | str, Row]]] = {}
    for values, row in cells:
        label = values[keys[1]] if len(keys) > 1 else ""
        lines.setdefault(label, []).append((values[keys[0]], row))
    numeric = all(_sortable(v)[0] == 0 for values, _ in cells for v in [values[keys[0]]])
    fig, ax = plt.subplots(figsize=(5.6, 3.6), constrained_layout=True)
    values = [float(v[keys[0]]) for v, _ in cells] if numeric else []
    log = bool(values) and min(values) > 0 and max(values) / min(values) >= 10
    for i, (label, points) in enumerate(sorted(lines.items(), key=lambda item: _sortable(item[0]))):
        points.sort(key=lambda p: _sortable(p[0]))
        dodge = 0.04 * (i - (len(lines) - 1) / 2)  # lines side by side, not on top of each other
        xs = [float(x) for x, _ in points] if numeric else list(range(len(points)))
        xs = [x * 10**dodge if log else x + dodge * (max(xs) - min(xs) or 1) for x in xs]
        rates = [r.learned / r.seeds for _, r in points]
        below = [rate - r.low for rate, (_, r) in zip(rates, points, strict=True)]
        above = [r.high - rate for rate, (_, r) in zip(rates, points, strict=True)]
        ax.errorbar(
            xs,
            rates,
            yerr=[below, above],
            marker="o",
            capsize=3,
            label=f"{keys[1]}={label}" if label else None,
        )
        if not numeric:
            ax.set_xticks(xs, [x for x, _ in points])
    if log:
        ax.set_xscale("log")
    ax.set(xlabel=keys[0], ylabel="seeds learned (≥ 95%)", ylim=(0, 1))
    ax.grid(alpha=0.3)
    if len(keys) > 1:
        ax.legend(fontsize="small")
    fig.savefig(path, dpi=110, format="png")
    plt.close(fig)


def load_sets(roots: Sequence[Path]) -> tuple[list[tuple[Path, Curves]], list[tuple[Path, str]]]:
    """Every seed set (a folder with a ``curves.json``) under ``roots``, loaded once; and those that
    cannot be read (torn, of another shape, not a regular file, too large: :meth:`Curves.load`),
    each with its one-line reason, so that one never stops the others."""
    folders = sorted({p.parent for root in roots for p in Path(root).rglob("curves.json")})
    sets, unreadable = [], []
    for folder in folders:
        try:
            sets.append((folder, Curves.load(folder / "curves.json")))
        except ConfigError as error:
            unreadable.append((folder / "curves.json", str(error)))
    return sets, unreadable


def report_section(
    sets: Sequence[tuple[Path, Curves]], unreadable: Sequence[tuple[Path, str]] = ()
) -> tuple[list[str], dict[str, bytes]]:
    """For ``python -m launch.analysis.report``: the seed sets (:func:`load_sets`) grouped by backbone
    (:func:`backbone_section`), then the seed-set files that cannot be read (``unreadable``: each
    with its reason); the Markdown lines and the PNGs. Nothing when there is neither."""
    if not sets and not unreadable:
        return [], {}
    if not sets:
        return ["", "## P5: seeds trained at once", "", *unreadable_lines(unreadable)[1:]], {}
    groups: dict[str, list[tuple[Path, Curves]]] = {}
    for folder, curves in sets:
        groups.setdefault(backbone_of(curves), []).append((folder, curves))
    lines = [
        "",
        "## P5: seeds trained at once",
        "",
        f"Seed sets written by `python -m src.sandbox.seeds` (`curves.json`), per backbone, each paired "
        f"by seed with the backbone's `standard` set: *learned* is the share at ≥ {SUCCESS:.0%} test "
        "accuracy by the last epoch [exact 95% interval], *epochs to learn* the Kaplan–Meier median with "
        "the never-learners censored, then the seeds that learned first in each set, the exact sign "
        "test and its verdict, raw and after Holm over the group (launch/analysis/seed_sets.py).",
    ]
    pngs: dict[str, bytes] = {}
    for backbone, group in groups.items():
        more_lines, more_pngs = backbone_section(backbone, group)
        lines += more_lines
        pngs.update(more_pngs)
    return lines + unreadable_lines(unreadable), pngs


def unreadable_lines(unreadable: Sequence[tuple[Path, str]]) -> list[str]:
    """The seed-set files that cannot be read, one line each with its reason (nothing if none)."""
    if not unreadable:
        return []
    lines = ["", f"### Seed-set files that cannot be read ({len(unreadable)}): not counted", ""]
    return lines + [f"- `{path}`: {' '.join(reason.split())}" for path, reason in unreadable]


def backbone_section(backbone: str, sets: list[tuple[Path, Curves]]) -> tuple[list[str], dict[str, bytes]]:
    """One backbone's sets paired with its ``standard`` set of the same setting (said so, and
    nothing compared, without one; a set of another setting, seeds or epochs is named, not
    paired), with the success-by-epoch figure, then any grid the sets form (:func:`grid_section`)."""
    lines = ["", f"### `{backbone}`", ""]
    standards = [s for s in sets if is_standard(s[1])]
    if not standards:
        return lines + [
            f"No `standard` set of `{backbone}` to pair with: {len(sets)} set(s) not compared."
        ], {}
    # the baseline: the standard set whose setting the most sets share (the variants' setting;
    # a grid's other cells are drawn below)
    base_folder, base = max(standards, key=lambda b: sum(setting(c) == setting(b[1]) for _, c in sets))
    paired = [(base_folder, base)] + [
        s for s in sets if setting(s[1]) == setting(base) and s[0] != base_folder
    ]
    grid = {id(c) for c in grid_sets([c for _, c in sets])}
    others = [
        f"`{folder}` ({len(c.seeds)} seeds × {c.epochs} epochs)"
        for folder, c in sets
        if (folder, c) not in paired and id(c) not in grid
    ]
    if others:
        lines += [
            f"Not paired with `{base_folder}` ({len(base.seeds)} seeds × {base.epochs} epochs), "
            "another setting, seeds or epochs: " + ", ".join(others) + ".",
            "",
        ]
    pngs: dict[str, bytes] = {}
    if len(paired) > 1 or id(base) not in grid:  # a grid alone has nothing to pair: its table below
        named = dict(zip(names(paired), (c for _, c in paired), strict=True))
        lines.append(table(compare(named, next(iter(named)))))
        buffer = io.BytesIO()
        draw_success(named, buffer)
        pngs[f"p5_success_{backbone}.png"] = buffer.getvalue()
        lines += ["", f"![success by epoch, {backbone}](p5_success_{backbone}.png)"]
        if any(c.probe_epochs() for c in named.values()):
            buffer = io.BytesIO()
            draw_clustering(named, buffer)
            pngs[f"p5_clustering_{backbone}.png"] = buffer.getvalue()
            lines += ["", f"![clustering head by epoch, {backbone}](p5_clustering_{backbone}.png)"]
    grid_lines, grid_pngs = grid_section(backbone, [c for _, c in sets])
    return lines + grid_lines, {**pngs, **grid_pngs}


def main(argv: Sequence[str] | None = None) -> int:
    parser = command_parser(__spec__.name, __doc__)
    parser.add_argument(
        "folders", nargs="+", type=Path, help="folders with a curves.json (src.sandbox.seeds)"
    )
    parser.add_argument(
        "--baseline", type=Path, default=None, help="the set the others are paired with (default: the first)"
    )
    parser.add_argument("--epochs", type=int, default=None, help="read every set only to this epoch")
    parser.add_argument(
        "--threshold",
        type=float,
        default=SUCCESS,
        help=f"test accuracy that counts as learned (default {SUCCESS}; 1.0: P5's code's own criterion)",
    )
    parser.add_argument(
        "--margin",
        type=float,
        default=SHARE_MARGIN,
        help=f"the sign test's equivalence margin, a share's distance from one half (default {SHARE_MARGIN}; "
        "0: no equivalence)",
    )
    parser.add_argument("--out", type=Path, default=None, help="draw the success-by-epoch curves here (PNG)")
    return run_command(parser, compare_sets, argv)


def compare_sets(args: argparse.Namespace) -> None:
    """The command's work: the sets read, compared with the baseline, tabled and drawn."""
    folders = ([args.baseline] if args.baseline else []) + [f for f in args.folders if f != args.baseline]
    missing = [str(f / "curves.json") for f in folders if not (f / "curves.json").exists()]
    if missing:
        raise ConfigError(
            f"no curves.json in {', '.join(missing)}: write them with python -m src.sandbox.seeds"
        )
    sets = []
    for folder in folders:
        curves = Curves.load(folder / "curves.json")  # its errors name the file
        if args.epochs:
            try:
                curves = curves.truncated(args.epochs)
            except ConfigError as error:
                raise ConfigError(f"{folder}: {error}") from error
        sets.append((folder, curves))
    named = dict(zip(names(sets), (c for _, c in sets), strict=True))
    if not 0 < args.threshold <= 1:
        raise ConfigError(f"--threshold {args.threshold}: give a test accuracy in (0, 1]")
    if not 0 <= args.margin < 0.5:
        raise ConfigError(f"--margin {args.margin}: give a share's distance from one half in [0, 0.5)")
    margin = args.margin or None
    print(table(compare(named, next(iter(named)), args.threshold, margin), args.threshold))
    if args.out:
        draw_success(named, args.out, args.threshold)
        print(f"figure: {args.out}")


if __name__ == "__main__":
    raise SystemExit(main())
