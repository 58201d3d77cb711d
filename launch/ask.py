"""One command from question to answer: ``python -m launch.ask attn=VARIANT task=TASK [overrides]``.

Does this variant train better than its baseline (``standard``, or ``--baseline``), on this task and
backbone, with everything else as the overrides say? The command trains paired seeds of both
arms, the baseline's command being the variant's with the variant (``attn=…``, ``attn.*``,
``reading=``) replaced, each arm a ``python -m src.run -m … seed=…`` multirun (through any Hydra
launcher given, ``hydra/launcher=slurm``) into one folder named by the question,
``<paths.output_dir>/multirun/ask/<task>/<backbone>/<variant>-vs-<baseline>/<id>/``, ``<id>`` the
first 8 hex digits of a hash of both arms' identities: the same question asked again, its
overrides in any order or a default spelled out, finds its folder, and another question (another
budget, option or data folder) gets its own. Every record there (and in the ``--reuse`` folders:
a sweep of one's own) whose identity is an arm's counts as that arm's seed, and a seed with a
completed (or failed) record is never trained again.

It looks on the settle loop's schedule (:mod:`launch.analysis.settle`: ``--first`` seeds, then
``--batch`` more at a time up to ``--cap``, each look at the alpha it spends, reading validation
only) until the effect row (:func:`launch.analysis.verdicts.effects`) is *better*, *worse* or,
with ``--margin``, *equivalent*; then writes the report of the folder's runs into ``--out``
(report.md, results.csv, results.json, ``forest_<task>.png`` and the curves) and ends with one
line on stdout, the report's row: the effect with its 95% interval (test numbers where every run
has one, as the report reads them; the line says which split), the paired seeds, the verdict at
its look's level, the budget, and when inconclusive the seeds δ would need (or, without δ, the
smallest effect these seeds detect). Everything else (the plan, the runs' output) goes to stderr.
Asking again with another ``--first``/``--batch``/``--cap`` is refused: that folder's alpha was
spent under its own plan.
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from launch.analysis import relaunch
from launch.analysis.claims import ANY_ROW, positive_margin
from launch.analysis.records import Run, read_runs, variant_label
from launch.analysis.report import write
from launch.analysis.results import flag_disagreements, fmt, printed_scale
from launch.analysis.settle import Plan, missing_seeds, read_plan, refuse_other_plan, settle
from launch.analysis.verdicts import Verdict, effects, naming_claim
from src.command import command_parser, run_command
from src.engine.record.identity import DATA, Identity
from src.errors import SuiteError

VARIANT_KEYS = ("attn", "reading")  # what the baseline's command replaces


@dataclass
class Arm:
    """One side of the question: its ``src.run`` overrides and the identity its runs must have."""

    overrides: list[str]
    identity: Identity  # without the seed
    unknown: list[str]  # keys only a running job resolves, left out of the comparison

    def owns(self, run: Run) -> bool:
        """Whether ``run`` is a seed of this arm: its identity, but the data only a run reads."""
        return run.identity.without(DATA, *self.unknown).hash == self.identity.hash


@dataclass
class Question:
    """Both arms, the Hydra overrides every launch takes, the question's folder and main metric."""

    variant: Arm
    baseline: Arm
    hydra: list[str]  # the user's Hydra overrides, for every launch
    root: Path
    metric: str
    setting: str  # task/backbone
    reuse: list[Path]  # other folders whose records count

    def read(self) -> list[Run]:
        """The runs of either arm, by identity, in the folder and the ``reuse`` folders (each folder
        once; debug and unreadable ones left to settle)."""
        found = read_runs([p for p in (self.root, *self.reuse) if p.is_dir()])
        once = {str(Path(r.name).resolve()): r for r in found}.values()
        return [r for r in once if self.variant.owns(r) or self.baseline.owns(r)]

    def launch(self, arm: Arm, seeds: list[int]) -> None:
        """``python -m src.run -m <arm> seed=…`` into the folder; its output on stderr, its error line
        (exit status 2: refused before any run) raised as this command's."""
        line = [sys.executable, "-m", "src.run", "-m", *arm.overrides, f"seed={','.join(map(str, seeds))}"]
        line += [*self.hydra, f"hydra.sweep.dir={self.root}"]
        errors = []  # held back: a refusal is this command's one line
        with subprocess.Popen(line, stdout=2, stderr=subprocess.PIPE, text=True) as done:
            for text in done.stderr:
                if text.startswith("error: "):
                    errors.append(text)
                else:
                    sys.stderr.write(text)
        if done.returncode == 2 and errors:
            raise SuiteError(errors[-1].removeprefix("error: ").strip())
        sys.stderr.writelines(errors)


def main(argv: list[str] | None = None) -> int:
    """Answer the question; one ``error:`` line and 2 on bad input."""
    return run_command(command_line(), answer, argv, intermixed=True, expected=(ValueError,))


def command_line() -> argparse.ArgumentParser:
    """The command line (see the module's docstring)."""
    parser = command_parser(__spec__.name, __doc__)
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="OVERRIDE",
        help="src.run overrides naming the variant (attn=… or reading=…) and anything else "
        "(task=, backbone=, trainer.max_steps=…), one value each; Hydra's (hydra/launcher=slurm, "
        "hydra.launcher.partition=…) go to every launch",
    )
    parser.add_argument("--baseline", default="standard", help="'VARIANT [OPTION=VALUE …]' (standard)")
    parser.add_argument(
        "--margin",
        metavar="DELTA",
        help="δ, the smallest effect of interest, in the metric's units (0.01: one point of accuracy)",
    )
    parser.add_argument("--first", type=int, default=5, help="seeds at the first look (default 5)")
    parser.add_argument("--batch", type=int, default=5, help="seeds added per look (default 5)")
    parser.add_argument("--cap", type=int, default=20, help="the most seeds per arm (default 20)")
    parser.add_argument("--spending", choices=("obf", "pocock"), default="obf")
    parser.add_argument("--out", type=Path, help="where the report goes (default: <the folder>/report)")
    parser.add_argument(
        "--reuse",
        type=Path,
        action="append",
        default=[],
        metavar="DIR",
        help="run folders, or folders holding them, whose records of either arm count too (by "
        "identity; new seeds still go to the question's folder); repeatable",
    )
    return parser


def answer(args: argparse.Namespace) -> None:
    """The command's work: the question composed and checked, its seeds settled, its line printed."""
    plan = Plan(args.first, args.batch, args.cap, args.spending)
    question = composed(args.overrides, args.baseline, args.reuse)
    if missing := [str(p) for p in args.reuse if not p.is_dir()]:
        raise SuiteError(f"--reuse {' '.join(missing)}: no such folder")
    margin = None if args.margin is None else positive_margin(args.margin, args.margin, "give a number")
    if margin is not None and printed_scale(question.metric) != 1 and margin >= 1:
        raise SuiteError(f"--margin {args.margin}: {question.metric} is a fraction; 0.01 is one point")
    refuse_other_plan(question.root, plan)
    found = question.read()  # the first look's seeds: those found first (as settle's), then 0, 1, …
    first = {"base_seeds": sorted({r.seed for r in found})[: plan.first] or None}
    for arm in (question.variant, question.baseline):  # each arm as a multirun
        if seeds := missing_seeds([r for r in found if arm.owns(r)], plan.first, first):
            question.launch(arm, seeds)
    to_stderr(plan.describe())  # after the first seeds: a launch refused is one line
    runs = question.read()
    baseline, claim_of = arm_runs(question, runs)
    label = variant_label(baseline[0])
    margins = {} if margin is None else {ANY_ROW: margin, **{c.key: margin for c in claim_of}}

    def launch(members: list[Run], seeds: list[int]) -> None:
        question.launch(question.baseline if question.baseline.owns(members[0]) else question.variant, seeds)

    def judge(runs: list[Run], levels: dict) -> list[Verdict]:
        return effects(runs, label, margins, levels, on="val")

    question.root.mkdir(parents=True, exist_ok=True)  # every seed may be another folder's (--reuse)
    looked = settle(question.root, plan, question.read, launch, say=to_stderr, judge=judge)
    out = args.out or question.root / "report"
    settled = [(question.root, *read_plan(question.root))]
    _, compared, _ = write(out, flag_disagreements(question.read()), margins, settled, label)
    if not compared:
        raise SuiteError(f"no completed pair of seeds to compare: see {out / 'report.md'}")
    print(f"wrote {out / 'report.md'} and its plots", file=sys.stderr)
    row = compared[0]
    print(one_line(row, question.setting, next(v for v in looked if v.experiment == row.experiment), plan))


def composed(overrides: list[str], baseline: str, reuse: list[Path] = ()) -> Question:
    """Both arms' commands, checked as ``src.run`` checks them and composed; the folder they go to."""
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from src.cli import is_override, prepare_argv
    from src.configs import compose
    from src.precheck import precheck

    given = prepare_argv(list(overrides))
    hydra = [o for o in given if o.lstrip("~+").startswith(("hydra.", "hydra/"))]
    mine = [o for o in given if o not in hydra]
    refuse_unasked(given)
    name, *options = baseline.split()
    theirs = [o for o in mine if o.lstrip("~+").split("=")[0].split(".")[0] not in VARIANT_KEYS]
    theirs += [f"attn={name}", *(f"attn.{o}" for o in options)]
    if any(not is_override(o) for o in theirs):
        raise SuiteError(f"--baseline {baseline!r}: give 'VARIANT OPTION=VALUE …' (e.g. 'spectral mode=svd')")
    theirs = prepare_argv(theirs)  # a baseline naming no variant: src.run's line, with the closest names
    arms = []
    for command in (mine, theirs):
        precheck(command)
        try:
            identity, unknown = relaunch.composed_identity(command, complete=True)
            cfg = compose(command)
        except (HydraException, OmegaConfBaseException) as error:
            raise SuiteError(f"{' '.join(command)}: {relaunch.one_line(error)}") from None
        arms.append((Arm(command, identity, unknown), cfg))
    (variant, cfg), (base, base_cfg) = arms
    if variant.identity.hash == base.identity.hash:
        raise SuiteError(f"{' '.join(mine)} is the baseline {baseline!r} itself: name another variant")
    if variant.identity.without("attn").hash != base.identity.without("attn").hash:
        differs = ", ".join(variant.identity.without("attn").differences(base.identity.without("attn")))
        raise SuiteError(f"the variant's command and its baseline's differ beyond the variant ({differs})")
    pair = "".join(sorted((variant.identity.hash, base.identity.hash)))
    root = Path(OmegaConf.select(cfg, "paths.output_dir")).resolve() / "multirun" / "ask"
    root = root / cfg.task.name / cfg.backbone.name / f"{cfg.attn.variant}-vs-{base_cfg.attn.variant}"
    root = root / hashlib.sha256(pair.encode()).hexdigest()[:8]
    metric = str(OmegaConf.select(cfg, "task.metric", default=""))
    return Question(variant, base, hydra, root, metric, f"{cfg.task.name}/{cfg.backbone.name}", list(reuse))


def refuse_unasked(given: list[str]) -> None:
    """A :class:`SuiteError` for what the question cannot hold: no variant named, a sweep (one value
    each), a seed (the looks choose them), a folder of one's own (the question names it)."""
    from src.precheck import parse

    parsed = parse(given) or []
    keys = [o.key_or_group for o in parsed]
    if not any(k in VARIANT_KEYS for k in keys):
        raise SuiteError("name the variant to ask about: attn=VARIANT (or reading=READING)")
    swept = [o.input_line for o in parsed if o.is_sweep_override()]
    if swept or "seed" in keys or "hydra.sweep.dir" in keys:
        what = " ".join(swept) or ("seed=…" if "seed" in keys else "hydra.sweep.dir=…")
        raise SuiteError(
            f"{what}: ask answers one question, one value per key; the seeds are its looks' and the "
            "folder is the question's (--out for the report)"
        )


def arm_runs(question: Question, runs: list[Run]) -> tuple[list[Run], list]:
    """The baseline's runs (one at least) and the claims that name the variant's row, once the first
    look's seeds are in; a :class:`SuiteError` where an arm has no record to show for them."""
    baseline = [r for r in runs if question.baseline.owns(r)]
    variant = [r for r in runs if question.variant.owns(r)]
    if not baseline or not variant:
        raise SuiteError(
            f"launched, but no record of {'the baseline' if not baseline else 'the variant'} "
            f"came back: see {question.root}"
        )
    claim = naming_claim(variant[0], variant_label(baseline[0]))
    return baseline, [claim] if claim else []


def to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def one_line(v: Verdict, setting: str, looked: Verdict, plan: Plan) -> str:
    """The answer: the report's row ``v`` in one line, with the last look's (``looked``, on
    validation) verdict and seeds."""

    def signed(x: float) -> str:
        return ("−" if x < 0 else "+") + fmt(abs(x), v.metric)

    unit = "points" if printed_scale(v.metric) != 1 else "units"
    split = "test" if v.metric.startswith("test/") else "val"
    effect = "no effect" if v.effect is None else signed(v.effect)
    if v.low is not None:
        effect += f" [{signed(v.low)}, {signed(v.high)}]"
    text = (
        f"{v.variant} vs {v.baseline_label} on {setting}: {effect} {unit} of {v.metric} ({split} split, "
        f"95% interval), {v.n} paired seeds: {v.adjusted}"
    )
    if v.adjusted == "inconclusive" and v.test is not None:
        if v.margin is not None:
            text += f"; δ {fmt(v.margin, v.metric)} would need {v.seeds_for_margin or '> 1000'} seeds"
        else:
            text += f"; these seeds detect {fmt(v.detectable, v.metric)} (80% power); give --margin δ"
    looks = f"looks on val: {looked.adjusted} at {looked.n} seeds (cap {plan.cap})"
    return f"{text} · budget {v.budget or '—'} · {looks}"


if __name__ == "__main__":
    raise SystemExit(main())
