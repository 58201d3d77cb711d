"""The README's verdict table, rebuilt from committed results: ``python -m launch.analysis.readme_table``.

Each folder under ``results/budgets/`` holds what ``python -m launch.analysis.report … --out`` wrote
of one declared sweep (``docs/budgets.md``): ``claims.csv`` (the Claims section's rows, with the
host, commit and torch build of the runs behind each) and ``results.csv``. This command reads the
``claims.csv`` files alone and writes one table: a row per claim, task and point of training, a
column per sweep (its budget), each cell the primary reading's effect [95% interval], its verdict
and its paired seeds. The table goes between the README's two markers (:data:`BEGIN`,
:data:`END`); nothing else of the README is touched. ``--check`` rewrites nothing and exits 1
where the README's table is not the one the files give (a test runs it, so that a README number
without its committed file, or a file the README does not follow, fails).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from src.command import command_parser, run_command
from src.engine.record import atomic
from src.errors import SuiteError

from .exports import read_exports_csv
from .results import fmt

BEGIN = "<!-- verdicts: python -m launch.analysis.readme_table (from results/budgets/*/claims.csv) -->"
END = "<!-- /verdicts -->"
RESULTS = Path("results/budgets")
POINTS = ("", "at init", "during training", "at the end")  # a κ claim's rows, in training's order


def rows_of(folder: Path) -> list[dict[str, Any]]:
    """``folder/claims.csv``'s primary, non-confirm rows; a :class:`SuiteError` naming the file
    where it is missing."""
    path = folder / "claims.csv"
    if not path.is_file():
        raise SuiteError(
            f"{path}: no claims.csv (write it with python -m launch.analysis.report <sweep> --out {folder})"
        )
    return [r for r in read_exports_csv(path) if r["role"] == "primary" and not r["stage"]]


def cell(row: dict[str, Any] | None) -> str:
    """One sweep's answer to one claim: ``+3.70 [+2.90, +4.50] **reproduced** (20)``, accuracies
    in points, κ in log10, P4's speed as a ratio; the Holm verdict where it differs (†)."""
    if row is None:
        return "—"
    if row["effect"] is None:
        return f"{row['verdict']} ({row['n']})"
    numbers = [signed(row[k], row) for k in ("effect", "ci_low", "ci_high")]
    verdict = row["verdict"] + ("" if row["verdict_holm"] in (None, row["verdict"]) else " †")
    return f"{numbers[0]} [{numbers[1]}, {numbers[2]}] **{verdict}** ({row['n']})"


def signed(value: float | None, row: dict[str, Any]) -> str:
    """A difference as the Claims section prints it (a ratio for time to target)."""
    if value is None:
        return "?"
    if row["measure"] == "time_to_target":
        return "∞" if math.isinf(value) else f"{value:.2f}×"
    text = fmt(abs(value), row["metric"] or "") if row["measure"] == "final" else f"{abs(value):.3f}"
    return ("−" if value < 0 else "+") + text


def point(row: dict[str, Any]) -> str:
    """The point of training a κ row is read at (``at init``), from its reading; "" for the rest."""
    reading = row["reading"] or ""
    return reading.rsplit(" · ", 1)[1] if " · at " in reading or " · during" in reading else ""


def table(folders: list[Path]) -> str:
    """The README's block between the markers: the table and the line that says where it is from."""
    columns = {folder: {(r["claim"], r["task"], point(r)): r for r in rows_of(folder)} for folder in folders}
    budgets = [budget_of(rows) for rows in columns.values()]
    keys = sorted(
        {k for rows in columns.values() for k in rows},
        key=lambda k: (k[0][:2], k[1], k[0], POINTS.index(k[2])),
    )
    lines = [
        "| claim | variant | task | measure | " + " | ".join(budgets) + " |",
        "| --- | --- | --- | --- | " + " | ".join("---" for _ in budgets) + " |",
    ]
    for key in keys:
        first = next(rows[key] for rows in columns.values() if key in rows)
        measure = measure_words(first) + (f" {key[2]}" if key[2] else "")
        lines.append(
            f"| {key[0]} | `{first['variant']}` | {key[1]} | {measure} | "
            + " | ".join(cell(rows.get(key)) for rows in columns.values())
            + " |"
        )
    made = {
        k: sorted({v[:12] for rows in columns.values() for r in rows.values() for v in (r[k] or "").split()})
        for k in ("host", "commit", "torch")
    }
    lines += [
        "",
        "From "
        + ", ".join(f"`{folder / 'claims.csv'}`" for folder in folders)
        + "; runs trained on "
        + "; ".join(f"{k} {', '.join(v[:3]) if v else 'not recorded'}" for k, v in made.items())
        + ".",
    ]
    return "\n".join(lines)


def measure_words(row: dict[str, Any]) -> str:
    """What a row measures, as the table heads it: ``test/acc`` (points), ``log10 κ(A)``, the
    ratio of steps to target, else the claim's measure as named."""
    measure = row["measure"]
    if measure == "final":
        return f"`{row['metric']}`" + (" (points)" if "acc" in (row["metric"] or "") else "")
    if measure.startswith("monitor:kappa/"):
        return f"log10 κ({measure.removeprefix('monitor:kappa/').split('/')[0]})"
    if measure == "time_to_target":
        return "steps to target (ratio)"
    return measure


def budget_of(rows: dict[tuple, dict[str, Any]]) -> str:
    """A column's heading: the sweep's budget and its largest paired n (``2000 steps, 20 seeds``)."""
    budgets = sorted({r["budget"].split(" · ")[0] for r in rows.values() if r["budget"]})
    seeds = max((r["n"] for r in rows.values()), default=0)
    return f"{' / '.join(budgets) or 'budget ?'}, {seeds} seeds"


def replaced(readme: str, block: str) -> str:
    """``readme`` with the text between the markers replaced by ``block``; a :class:`SuiteError`
    where the markers are not there once each, in order."""
    if readme.count(BEGIN) != 1 or readme.count(END) != 1 or readme.index(BEGIN) > readme.index(END):
        raise SuiteError(f"the README needs the lines {BEGIN!r} and {END!r}, once each, in that order")
    head, rest = readme.split(BEGIN)
    _, tail = rest.split(END)
    return f"{head}{BEGIN}\n{block}\n{END}{tail}"


def command_line() -> argparse.ArgumentParser:
    parser = command_parser(__spec__.name, __doc__)
    parser.add_argument(
        "folders",
        nargs="*",
        type=Path,
        help=f"results folders, one column each, in order (default: every folder under {RESULTS})",
    )
    parser.add_argument("--readme", type=Path, default=Path("README.md"), help="the README to rewrite")
    parser.add_argument(
        "--check", action="store_true", help="rewrite nothing; exit 1 where the README's table differs"
    )
    return parser


def rebuild(args: argparse.Namespace) -> int:
    """The command's work: 0 when the README is (or now is) the files' table; 1 for ``--check``
    on a README that differs."""
    folders = args.folders or sorted((p for p in RESULTS.iterdir() if p.is_dir()), key=sweep_order)
    if not folders:
        raise SuiteError(f"no results folders under {RESULTS}")
    text = args.readme.read_text()
    wanted = replaced(text, table(folders))
    if wanted == text:
        print(f"{args.readme}: its verdict table is the files' ({len(folders)} sweeps)")
        return 0
    if args.check:
        print(
            f"{args.readme}: its verdict table is not the one {', '.join(map(str, folders))} give; "
            "rebuild it with python -m launch.analysis.readme_table"
        )
        return 1
    atomic.write_text(args.readme, wanted)
    print(f"{args.readme}: verdict table rebuilt from {len(folders)} sweeps")
    return 0


def sweep_order(folder: Path) -> tuple[str, int]:
    """Folders by task, then budget (``digits_500`` before ``digits_2000``)."""
    name, _, steps = folder.name.rpartition("_")
    return (name, int(steps)) if steps.isdigit() else (folder.name, 0)


def main(argv: list[str] | None = None) -> int:
    return run_command(command_line(), rebuild, argv)


if __name__ == "__main__":
    raise SystemExit(main())
