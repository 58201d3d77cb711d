"""Write a synthetic ListOps or Pathfinder set in the LRA release's format.

    python -m tasks.lra.generate listops data/listops-1000                 # LRA's sizes (slow: 100k trees)
    python -m tasks.lra.generate listops data/listops_small --num-train 4000 --min-length 50 --max-length 300
    python -m tasks.lra.generate pathfinder data --num-images 2000 --contour-length 14

ListOps writes ``<folder>/basic_{train,val,test}.tsv``; Pathfinder writes
``<folder>/pathfinder32/<difficulty>/{imgs,metadata}``.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from src.command import command_parser, run_command

from . import listops, pathfinder


def _add_fields(parser: argparse.ArgumentParser, spec_cls: type) -> None:
    for f in dataclasses.fields(spec_cls):
        parser.add_argument(f"--{f.name.replace('_', '-')}", type=type(f.default), default=f.default)


def main(argv: list[str] | None = None) -> int:
    parser = command_parser(__spec__.name, __doc__)
    sub = parser.add_subparsers(dest="task", required=True)
    lo = sub.add_parser("listops", help="basic_{train,val,test}.tsv")
    lo.add_argument("folder", type=Path)
    _add_fields(lo, listops.ListOpsSpec)
    pf = sub.add_parser("pathfinder", help="pathfinder32/<difficulty>/{imgs,metadata}")
    pf.add_argument("folder", type=Path)
    pf.add_argument("--num-images", type=int, default=1000)
    pf.add_argument("--seed", type=int, default=0)
    _add_fields(pf, pathfinder.PathfinderSpec)
    return run_command(parser, write_set, argv)


def write_set(args: argparse.Namespace) -> None:
    """The command's work: the chosen set written into ``args.folder``."""
    spec = vars(args).copy()
    task, folder = spec.pop("task"), spec.pop("folder")
    if task == "listops":
        listops.write_release(folder, listops.generate(listops.ListOpsSpec(**spec)))
        print(f"wrote {folder}/basic_{{train,val,test}}.tsv")
    else:
        num, seed = spec.pop("num_images"), spec.pop("seed")
        out = pathfinder.write_release(folder, num, pathfinder.PathfinderSpec(**spec), seed=seed)
        print(f"wrote {num} images to {out}")


if __name__ == "__main__":
    raise SystemExit(main())
