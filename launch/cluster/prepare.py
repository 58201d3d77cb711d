"""Build a sweep's data on the CPU, before its GPU jobs: ``python -m launch.cluster.prepare <overrides>``.

    python -m launch.cluster.prepare experiment=paper/glue task=mlm seed=0  # the WordPiece, token caches
    python -m launch.cluster.prepare -m experiment=glue_tiny                # glue_tiny's, mlm_tiny's files
    python -m launch.cluster.prepare experiment=paper/lm --check            # what is missing; builds nothing

The grid is the one ``python -m src.run -m <the same overrides>`` runs, expanded by
:func:`launch.plan.per_experiment` and :func:`launch.plan.jobs` (the seeds of a run are one job
there: no data the suite builds depends on the seed). Each distinct task config (and data folder)
is built once from its config, as a run builds it, and its :meth:`src.engine.task.Task.prepare_data`
builds what the run's :meth:`~src.engine.task.Task.datasets` would otherwise build on first use: the
token caches and the tokenizer trained here of the language-modelling tasks (``bpe``), masked-LM's
WordPiece and token caches, the generated sets (``glue_tiny``, the small ListOps, COCO shapes).
It is the code the run itself calls, through :func:`src.engine.generated.ensure_generated`, so a run
finds each artefact ready (its marker holds the spec the run asks for) and builds nothing; many runs
share one artefact, which is built once. Nothing trains and no GPU is touched. Tasks whose data is read
as it is (images, COCO, LRA's released sets, GLUE fine-tuning from a checkpoint, whose vocabulary the
pretraining makes) have nothing to prepare, and the command says so.

It prints a line per task as it starts, a line when an artefact starts to build and every 30 s while
a token cache grows, and ends with one line per artefact: ``built`` or ``already there`` (or ``found``:
files there without a marker, the user's own, used as they are), its path and size. ``--check`` builds
nothing and lists what is not prepared. Exit status 0; 2 with one ``error:`` line for bad overrides, a
data set that is missing (only the user can fetch it), or, with ``--check``, data not prepared.

Where it is needed: a sweep on SLURM (``hydra/launcher=slurm``) checks, before it submits anything, that
every artefact its runs read is there (:class:`launch.cluster.callbacks.DataPrepared`, with ``--check``'s
code) and otherwise stops, naming this command. Local multiruns and single runs prepare inside the run as
before (on first use, under a file lock): the CPU that would prepare ahead is the one that runs them.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from src.command import command_parser, run_command
from src.errors import SuiteError, message_of

#: What ``${pretrained_by:…}`` stands for while preparing: the checkpoint a pretraining run makes, whose
#: path only a job knows (its run folder); preparing reads only whether there is one.
PRETRAINED = "<the pretraining run's checkpoints/last.pt>"


@dataclass
class Need:
    """One distinct task config of a sweep, with the data folder it reads and the runs that read it."""

    task: str
    data_dir: Path
    cfg: Any  # the first job's composed config (its task node is what is prepared)
    runs: int


@dataclass
class Outcome:
    """What preparing (or checking) a sweep found: every artefact once, the tasks with nothing to
    prepare, the gaps a check found and the errors (a missing data set) of each task."""

    needs: list[Need] = field(default_factory=list)
    artefacts: dict[Path, Any] = field(default_factory=dict)  # marker -> src.engine.generated.Artefact
    nothing: list[Need] = field(default_factory=list)
    gaps: dict[str, list[str]] = field(default_factory=dict)  # what is not prepared -> the tasks that read it
    errors: list[tuple[Need, str]] = field(default_factory=list)


@contextlib.contextmanager
def pretrained_placeholder() -> Iterator[None]:
    """``${pretrained_by:…}`` resolves to :data:`PRETRAINED` in the block (None in the pretraining run
    itself, as in a job): outside a job there is no run folder to find the checkpoint from."""
    from omegaconf import OmegaConf

    from src import resolvers

    def placeholder(pretrain_task: str, seed: int, task: str) -> str | None:
        return None if task == pretrain_task else PRETRAINED

    OmegaConf.register_new_resolver("pretrained_by", placeholder, replace=True)
    try:
        yield
    finally:
        OmegaConf.register_new_resolver("pretrained_by", resolvers.pretrained_by, replace=True)


def needs(arguments: list[str]) -> list[Need]:
    """The sweep's distinct task configs (with their data folders), in the grid's order."""
    from launch.plan import as_text, jobs, per_experiment
    from src.configs import compose

    found: dict[tuple[str, str], Need] = {}
    with pretrained_placeholder():
        for each in per_experiment(arguments):
            for overrides, seeds in jobs(each):
                cfg = compose(overrides)
                data_dir = Path(str(cfg.paths.data_dir)).absolute()
                key = (str(data_dir), as_text(cfg.task))
                if key in found:
                    found[key].runs += seeds
                else:
                    found[key] = Need(str(cfg.task.name), data_dir, cfg, seeds)
    return list(found.values())


def prepare(arguments: list[str], check: bool = False, say: Callable[[str], None] = print) -> Outcome:
    """Build (or, ``check``, look for) every artefact the sweep of ``arguments`` reads; ``say`` gets
    the progress lines."""
    from hydra.utils import instantiate

    from src.engine.generated import NotPrepared, preparing

    outcome = Outcome(needs=needs(arguments))
    for i, need in enumerate(outcome.needs, 1):
        runs = f"{need.runs} run{'s' if need.runs != 1 else ''}"
        say(f"[{i}/{len(outcome.needs)}] {need.task} ({runs}), data in {shown(need.data_dir)}")
        failed = True
        with pretrained_placeholder(), preparing(check, say=lambda line: say(f"  {line}")) as session:
            try:
                task = instantiate(need.cfg.task)
                task.prepare_data(need.data_dir)
                failed = False
            except NotPrepared as gap:
                outcome.gaps.setdefault(str(gap), []).append(need.task)
            except SuiteError as error:
                outcome.errors.append((need, message_of(error)))
        for marker, artefact in session.artefacts.items():
            outcome.artefacts.setdefault(marker, artefact)
        if not session.artefacts and not failed:
            outcome.nothing.append(need)
    return outcome


def unprepared(arguments: list[str]) -> str | None:
    """One line saying what of the sweep's data is missing, naming the command that builds it; None
    when everything is there. Builds nothing (:func:`prepare` with ``check``); a data set that is
    missing altogether raises its :class:`src.errors.DataError`."""
    outcome = prepare(arguments, check=True, say=lambda line: None)
    if outcome.errors:
        from src.errors import DataError

        need, message = outcome.errors[0]
        raise DataError(f"{need.task}: {message}")
    if not outcome.gaps:
        return None
    gap, tasks = next(iter(outcome.gaps.items()))
    more = len(outcome.gaps) - 1
    also = f"; {more} more not prepared" if more else ""
    return (
        f"this sweep's data is not prepared ({gap}, for {', '.join(tasks)}{also}); "
        f"run python -m launch.cluster.prepare {command_line(arguments)}"
    )


def command_line(arguments: list[str]) -> str:
    """``arguments`` as a shell would take them back."""
    import shlex

    return shlex.join(arguments)


def shown(path: Path) -> str:
    """``path`` relative to the working folder when it is below it, else as it is."""
    try:
        return str(Path(path).absolute().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def size_text(n: int) -> str:
    """Bytes as ``812 B``, ``1.9 MB``, ``8.4 GB``."""
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


STATES = {"built": "built", "ready": "already there", "found": "found"}


def artefact_line(artefact: Any) -> str:
    """``built          data/cache/…/train.bin  (8.4 GB): the wordpiece token cache train.bin, in 310 s``."""
    took = f", in {artefact.seconds:.1f} s" if artefact.seconds is not None else ""
    own = " (no marker: not built by this command or a run of this version; used as it is)"
    own = own if artefact.state == "found" else ""
    path = shown(artefact.outputs[0])
    return f"{STATES[artefact.state]:<13}  {path}  ({size_text(artefact.size())}): {artefact.what}{took}{own}"


def report(outcome: Outcome) -> int:
    """The closing lines; the exit status."""
    for need in outcome.nothing:
        print(f"nothing to prepare: {need.task} (its data is read as it is when a run starts)")
    for artefact in outcome.artefacts.values():
        print(artefact_line(artefact))
    for gap, tasks in outcome.gaps.items():
        print(f"not prepared: {gap} (for {', '.join(tasks)})")
    for need, message in outcome.errors:
        print(f"error: {need.task}: {message}", file=sys.stderr)
    if outcome.gaps:
        print("error: the data above is not prepared: run this command without --check", file=sys.stderr)
    return 2 if outcome.errors or outcome.gaps else 0


def main(argv: list[str] | None = None) -> int:
    """Prepare (or check) the sweep's data; one ``error:`` line and 2 on bad input (Hydra's grammar
    and composition errors with their type)."""
    parser = command_parser(__spec__.name, __doc__)
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="the sweep's overrides")
    parser.add_argument("-m", "--multirun", action="store_true", help="optional: a sweep is prepared as one")
    parser.add_argument("--check", action="store_true", help="say what is not prepared; build nothing")
    return run_command(parser, prepare_sweep, argv, intermixed=True, named=(Exception,))


def prepare_sweep(args: argparse.Namespace) -> int:
    """The command's work: the sweep checked as ``src.run`` checks it, its data prepared (or
    checked), the closing lines; the exit status."""
    from src.precheck import precheck

    precheck(["-m", *args.overrides])  # src.run's refusals: a key no config has (did you mean …), …
    return report(prepare(args.overrides, check=args.check, say=lambda line: print(line, flush=True)))


if __name__ == "__main__":
    os.environ["CUDA_VISIBLE_DEVICES"] = ""  # preparing never needs a GPU: make sure nothing starts one
    raise SystemExit(main())
