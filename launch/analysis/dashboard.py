"""A W&B workspace and report for a project's runs: ``python -m launch.analysis.dashboard``.

    python -m launch.analysis.dashboard --entity E --project P [--task digits] [--sweep NAME] \
        [--dry-run OUT.json]

The workspace groups the runs by variant and option set (the config keys the suite's W&B runs
carry, :func:`src.engine.record.tracking.run_config`) and plots the task's main metric (mean ± one
standard deviation over seeds), the final metric per variant, κ and entropy; the report sets the
papers' numbers (:mod:`launch.analysis.paper`) beside a panel grid of our runs. ``--dry-run`` writes the
specification as JSON without any network, written whole or not at all (a file that cannot be
written is one ``error: cannot write …`` line and exit status 2, an earlier one left as it was);
without it the library saves both (needs a W&B login).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from omegaconf import OmegaConf

from launch.analysis.dashboard_spec import report, spec_json, workspace
from src.command import command_parser, run_command
from src.engine.record.files import RecordError, write_atomic, write_failure
from src.engine.record.tracking import main_metric
from src.errors import ConfigError, SuiteError

TASKS = Path(__file__).resolve().parents[2] / "conf" / "task"


def task_metric(task: str) -> str:
    """The main metric of ``task`` (``conf/task/<task>.yaml``'s ``task.metric``, else its class's)."""
    path = TASKS / f"{task}.yaml"
    if not path.exists():
        known = ", ".join(sorted(p.stem for p in TASKS.glob("*.yaml")))
        raise ConfigError(f"--task {task}: no conf/task/{task}.yaml; one of: {known}")
    return main_metric(OmegaConf.load(path).task)[0]


#: What W&B's filter expressions cannot hold in a value: wandb_workspaces writes a value between
#: single quotes, unescaped, and parses the expression as Python (``sweep_name == 'a'b'`` is a
#: SyntaxError; a backslash would start an escape and filter on another name).
UNFILTERABLE = ("'", "\\")


def check_sweep_name(sweep: str | None) -> None:
    """``--sweep`` names a sweep a W&B filter can select: no quote, backslash or control character."""
    if sweep is None:
        return
    if sweep == "" or any(c in sweep for c in UNFILTERABLE) or not sweep.isprintable():
        raise ConfigError(
            f"--sweep {sweep!r}: W&B's run filters cannot select a sweep name that is empty or holds a "
            "quote, a backslash or a control character (the workspace library pastes it into an "
            "expression); name the sweep without them (sweep_name=…) and give that name"
        )


def write_spec(path: Path, text: str) -> None:
    """``text`` into ``path`` (its folder made if need be), whole or not at all; a
    :class:`RecordError` (``cannot write <path> (<reason>; N MB free on its disk)``) if not."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise RecordError(write_failure(path.parent, error)) from error
    write_atomic(path, text)


def main(argv: list[str] | None = None) -> int:
    """Build the workspace and report; write them (``--dry-run``) or save them to W&B."""
    parser = command_parser(__spec__.name, __doc__)
    parser.add_argument("--entity", required=True, help="W&B entity (user or team)")
    parser.add_argument("--project", required=True, help="W&B project (logger.project)")
    parser.add_argument("--task", default="digits", help="the task whose runs and metric (default: digits)")
    parser.add_argument("--sweep", help="only the runs of this sweep (the config's sweep_name)")
    parser.add_argument(
        "--dry-run", type=Path, metavar="OUT.json", help="write the specification, no network"
    )
    return run_command(parser, build_dashboard, argv)


def build_dashboard(args: argparse.Namespace) -> None:
    """The command's work: the workspace and report built, then written or saved."""
    metric = task_metric(args.task)
    check_sweep_name(args.sweep)
    view = workspace(args.entity, args.project, args.task, metric, args.sweep)
    if args.dry_run:
        rep = report(args.entity, args.project, args.task, metric, args.sweep, name_project=False)
        write_spec(args.dry_run, json.dumps(spec_json(view, rep), indent=1) + "\n")
        print(f"wrote the workspace and report specification to {args.dry_run}")
        return
    try:
        rep = report(args.entity, args.project, args.task, metric, args.sweep)
        view.save()
        rep.save()
    except Exception as e:  # noqa: BLE001  the library raises whatever its transport raises
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise SuiteError(
            f"saving to W&B {args.entity}/{args.project} failed ({type(e).__name__}: {first}); "
            "log in with `wandb login`, or write the specification with --dry-run OUT.json"
        ) from e
    print(f"saved workspace {view.url} and report {rep.url}")


if __name__ == "__main__":
    raise SystemExit(main())
