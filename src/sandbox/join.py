"""Seed sets of one recipe trained apart, read as one: ``python -m src.sandbox.join OUT DIR DIR …``.

A set of 32 seeds that left a comparison open can be extended without retraining it: train the
next seeds into their own folder (``--seeds 32-63 --out …``), then join the folders. ``OUT`` gets
the ``curves.json``, ``seeds.json`` and ``success.png`` a set of all those seeds trained at once
would have (a seed trains the same beside any others: tests/sandbox/test_seeds.py), which
``launch.analysis.seed_sets`` and ``launch.analysis.report`` read as any set. Its weights stay in the parts'
``weights.safetensors`` (a joined folder has none, so ``--init-from`` needs a part). Sets of
another recipe, budget or probe cadence, or sharing a seed, are refused: one ``error:`` line,
exit 2, nothing written.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from src.command import command_parser, run_command
from src.engine.record import atomic
from src.engine.record.lock import OutputLock
from src.errors import ConfigError

from .curves import Curves, draw_success, seed_table

# what must agree for seeds of several sets to be one set's (the seeds themselves must not)
SAME = ("overrides", "epochs", "steps_per_epoch", "test_size", "attn", "probe_every", "init_from")


def join(parts: Sequence[Curves]) -> Curves:
    """One set with every part's seeds, in seed order; wall time summed."""
    for key in SAME:
        values = {json.dumps(getattr(c, key), sort_keys=True) for c in parts}
        if len(values) > 1:
            raise ConfigError(
                f"the sets differ in {key} ({' vs '.join(sorted(values))}): join sets of one recipe"
            )
    seeds = [s for c in parts for s in c.seeds]
    if len(set(seeds)) < len(seeds):
        twice = sorted({s for s in seeds if seeds.count(s) > 1})
        raise ConfigError(f"seeds {twice} are in more than one set: join disjoint sets")
    order = sorted(range(len(seeds)), key=seeds.__getitem__)

    def joined(name: str) -> list:
        rows = [row for c in parts for row in getattr(c, name)]
        return [rows[i] for i in order] if rows else []

    init_acc = None
    if parts[0].init_acc is not None:
        init_acc = [a for c in parts for a in c.init_acc or []]
        init_acc = [init_acc[i] for i in order]
    return replace(
        parts[0],
        seeds=sorted(seeds),
        acc=joined("acc"),
        loss=joined("loss"),
        clustering=joined("clustering"),
        focus=joined("focus"),
        seconds=sum(c.seconds for c in parts),
        init_acc=init_acc,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = command_parser(__spec__.name, __doc__)
    parser.add_argument("out", type=Path, help="the joined set's folder (must not hold a set yet)")
    parser.add_argument("parts", nargs="+", type=Path, help="folders with a curves.json (src.sandbox.seeds)")
    return run_command(parser, join_under_lock, argv)


def join_under_lock(args: argparse.Namespace) -> int:
    """:func:`write_joined` under ``OUT``'s lock: two joins (or a seed set) into one ``OUT`` at
    once, the second is refused, nothing torn."""
    try:
        with OutputLock(args.out, "python -m src.sandbox.join", option="OUT"):
            return write_joined(args.out, args.parts)
    except OSError as error:  # an OUT that cannot be made or written
        raise ConfigError(f"{args.out}: cannot write there ({error.strerror or error})") from error


def write_joined(out: Path, parts: list[Path]) -> int:
    """The command's work, under ``out``'s lock: the parts read and joined, then written."""
    missing = [str(p / "curves.json") for p in parts if not (p / "curves.json").is_file()]
    if missing:
        raise ConfigError(
            f"no curves.json in {', '.join(missing)}: write them with python -m src.sandbox.seeds"
        )
    if (out / "curves.json").exists():
        raise ConfigError(f"{out} already holds a set: give a new folder")
    curves = join([Curves.load(p / "curves.json") for p in parts])
    out.mkdir(parents=True, exist_ok=True)
    curves.save(out / "curves.json")
    atomic.write_text(out / "seeds.json", json.dumps(seed_table(curves), indent=1))
    draw_success({" ".join(curves.overrides) or "default": curves}, out / "success.png")
    print(f"{len(curves.seeds)} seeds from {len(parts)} sets: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
