"""Seeds until the answer is known: ``python -m launch.analysis.settle DIR``.

A sweep of a few seeds leaves most claim rows *inconclusive* (:mod:`launch.analysis.verdicts`). This
module adds seeds to the rows that are not settled, in batches, through the same launcher the
sweep used (each batch is ``python -m src.run -m <the run's command> seed=<new seeds>`` with the
sweep's launcher, so ``hydra/launcher=slurm`` sweeps settle on SLURM), until every row is settled
or the cap is reached. The folder is data: each command is rebuilt from the run's records and
checked, and nothing of its files runs (:mod:`launch.analysis.relaunch`); a folder whose files break the
rules or disagree with its records is refused in one line before anything is written.

* a **row** (a claim on a task for one reading) is *settled* when its Holm-adjusted verdict is
  *reproduced*, *contradicted* or *equivalent* at its look's levels; :func:`settle` judges the
  claims' rows unless given another ``judge`` (:mod:`launch.ask` judges one claimless effect row,
  :func:`launch.analysis.verdicts.effects`, *better* and *worse* settling it as the claims' sides do);
* **looks** come at ``first, first + batch, …, cap`` seeds; seeds are added to a row's reading
  and to its ``standard`` (the new seeds follow the sweep's own: seeds ``max + 1, …``), every
  seed is kept and reported, none is dropped when its row settles;
* **looks read validation only**: a row's numbers at a look are final validation values even where
  the runs have test numbers (``verdicts(on="val")``); the test split is read once, by the report,
  after the seeds are chosen;
* **the stopping rule costs alpha**: looking after every batch and stopping at the first
  verdict would inflate the false-verdict rate, so each look is read at the alpha it spends
  (:func:`launch.analysis.stats.look_levels`: Lan–DeMets spending, O'Brien–Fleming-shaped by default,
  each look at its increment, Bonferroni over looks: conservative). The report reads the plan
  from ``settle.json`` and states it beside the table.

A folder mixing sweeps whose experiments have seeds that are not one set (seeds 0-2 of one, 5-7 of
another) is refused at the first look: the sweep's seeds, which new ones follow, would be
neither's.

State lives in ``DIR/settle.json`` (the plan, the sweep's command, each experiment's target seed
count, and every look's verdicts), written before each launch, and in the run records
themselves: after a kill, rerunning the same command launches only the seeds that have no
completed or failed record (an unfinished one resumes from its checkpoint), never one twice.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from src.command import command_parser, run_command
from src.engine.record import atomic
from src.engine.record.bounded import RefusedFile, read_bytes
from src.errors import SuiteError

from . import relaunch, stats
from .claims import CLAIMS, Claim, parse_margins
from .records import Run, read_runs, run_config
from .verdicts import Verdict, verdicts

STATE = "settle.json"
SETTLED = ("reproduced", "contradicted", "equivalent", "better", "worse")  # a claim's, or a comparison's


@dataclass(frozen=True)
class Plan:
    """When to look: at ``first`` seeds, then every ``batch`` more, up to ``cap``; ``shape``: the
    alpha-spending function (``obf`` or ``pocock``, :func:`launch.analysis.stats.spent`)."""

    first: int
    batch: int
    cap: int
    shape: str = "obf"

    def __post_init__(self) -> None:
        if not 2 <= self.first <= self.cap or self.batch < 1:
            raise SuiteError(
                f"settle: seeds {self.first} first, {self.batch} per batch, cap {self.cap}: "
                "need 2 ≤ first ≤ cap and a batch of at least 1"
            )

    @property
    def looks(self) -> list[int]:
        """The seed counts at which rows are judged (the cap always one of them)."""
        return sorted({*range(self.first, self.cap, self.batch), self.cap})

    def levels(self, target: int) -> stats.Levels:
        """The levels of the look at ``target`` seeds (the last look at or below it), with the last
        look's beside them (``last``: the level a row's seeds for δ are planned at,
        :func:`launch.analysis.stats.tested_at`)."""
        looks = self.looks
        at = max((i for i, n in enumerate(looks) if n <= target), default=0)
        every = stats.look_levels(looks, self.shape)
        return dataclasses.replace(every[at], last=every[-1]) if at < len(looks) - 1 else every[at]

    def after(self, target: int) -> int | None:
        """The next look's seed count after ``target`` (None at the cap)."""
        return next((n for n in self.looks if n > target), None)

    def describe(self) -> str:
        levels = stats.look_levels(self.looks, self.shape)
        pairs = zip(self.looks, levels, strict=True)
        each = ", ".join(f"{n} ({lv.side:.4f}/{lv.equivalent:.4f})" for n, lv in pairs)
        shape = {"obf": "O'Brien–Fleming", "pocock": "Pocock"}[self.shape]
        return (
            f"seeds added in batches of {self.batch} until every row is settled or {self.cap} seeds; "
            f"looks at {each} seeds (one-sided level per side / TOST level): {shape}-shaped "
            f"Lan–DeMets alpha spending, each look at the alpha it spends, "
            f"{stats.SIDE_ALPHA:g} per side and {stats.EQUIV_ALPHA:g} for equivalence in all"
        )


Launch = Callable[[list[Run], list[int]], None]  # (runs of one experiment, seeds to add)
Read = Callable[[], list[Run]]
Judge = Callable[[list[Run], dict[str, stats.Levels]], list[Verdict]]  # (runs, levels by experiment)


def settle(
    root: Path,
    plan: Plan,
    read: Read,
    launch: Launch,
    claims: list[Claim] = CLAIMS,
    margins: dict[str, float] | None = None,
    wanted: Callable[[Verdict, list[Run]], bool] = lambda v, runs: True,
    say: Callable[[str], None] = print,
    judge: Judge | None = None,
) -> list[Verdict]:
    """Add seeds until every wanted row is settled or at the cap; the final verdicts.

    ``read`` gives the runs as they are now, ``launch`` runs more seeds of one experiment (given
    its runs) and returns when they have ended. The state is saved in ``root/settle.json`` before
    each launch, so a killed settle resumes where it was. ``judge``: the rows at a look, from the
    runs and each experiment's levels (the ``claims``' verdicts on validation where None)."""
    fresh = {"plan": asdict(plan), "targets": {}, "looks": [], "base_seeds": None}
    state = refuse_other_plan(root, plan) or fresh
    while True:
        runs = read()
        by_experiment = {e: m for e, m in group(runs).items() if not stage_of(m)}  # confirm runs apart
        if state["base_seeds"] is None:  # the sweep's own seeds: new ones follow them
            refuse_mixed_sweeps(root, by_experiment)
            state["base_seeds"] = sorted({r.seed for m in by_experiment.values() for r in m})[: plan.first]
        targets: dict[str, int] = state["targets"]
        for experiment in by_experiment:
            targets.setdefault(experiment, plan.first)
        if launch_missing(root, state, by_experiment, read, launch, say):
            continue  # the new seeds are in: judge again
        levels = {e: plan.levels(t) for e, t in targets.items()}
        found = judge(runs, levels) if judge else verdicts(runs, claims, margins, levels, on="val")
        mine = [
            v for v in found if judged(v) and not v.stage and wanted(v, by_experiment.get(v.experiment, []))
        ]
        open_rows = [v for v in mine if v.adjusted not in SETTLED]
        state["judged"] = sorted({*state.get("judged", []), *(v.experiment for v in mine)})
        advanced = advance(open_rows, targets, plan)
        state["looks"].append(look_record(found, targets, advanced))
        save_state(root, state)
        if not advanced:
            say(
                f"settled: {len(mine) - len(open_rows)} of {len(mine)} rows; the other "
                f"{len(open_rows)} not settled at the cap of {plan.cap} seeds"
            )
            return found


def refuse_other_plan(root: Path, plan: Plan) -> dict | None:
    """The state a settle of ``root`` left (None: none); a :class:`SuiteError` where it was written
    for another plan (its looks' alpha is spent as that plan said)."""
    state = load_state(root)
    if state and state["plan"] != asdict(plan):
        raise SuiteError(
            f"{root / STATE} was written for another plan ({state['plan']}); rerun with those "
            "options, or settle a copy of the sweep under the new plan"
        )
    return state


def launch_missing(
    root: Path, state: dict, by_experiment: dict[str, list[Run]], read: Read, launch: Launch, say: Callable
) -> bool:
    """Launch every experiment's seeds up to its target that have no record; False if none was
    missing. The state is saved first, so a kill here resumes with the same targets."""
    targets = state["targets"]
    missing = {e: gap for e, runs in by_experiment.items() if (gap := missing_seeds(runs, targets[e], state))}
    if not missing:
        return False
    save_state(root, state)
    for experiment, seeds in missing.items():
        name = label(by_experiment[experiment])
        say(f"look at {targets[experiment]} seeds: {len(seeds)} more of {name}")
        launch(by_experiment[experiment], seeds)
    after = group(read())
    lost = [
        f"{label(by_experiment[e])} seeds {gap}"
        for e in missing
        if (gap := missing_seeds(after.get(e, []), targets[e], state))
    ]
    if lost:
        raise SuiteError(
            f"settle: launched but no record came back for {', '.join(lost)}: see their run folders"
        )
    return True


def judged(v: Verdict) -> bool:
    """A row that more seeds can settle: a paired comparison (not P5's one-sample stages)."""
    return bool(v.experiment and v.baseline_experiment)


def advance(open_rows: list[Verdict], targets: dict[str, int], plan: Plan) -> list[str]:
    """Raise each open row's reading, and its ``standard``, to the look after the one it was judged
    at; the experiments moved. Several open rows on one experiment (two claims on one reading, a
    ``standard`` shared by several readings) move it to that next look once, never past it."""
    judged_at = dict(targets)  # this look's targets: a row moved earlier in the loop moves no further
    moved = set()
    for v in open_rows:
        nxt = plan.after(judged_at[v.experiment])
        if nxt is None:
            continue
        for experiment in (v.experiment, v.baseline_experiment):
            if targets[experiment] < nxt:
                targets[experiment] = nxt
                moved.add(experiment)
    return sorted(moved)


def refuse_mixed_sweeps(root: Path, by_experiment: dict[str, list[Run]]) -> None:
    """A :class:`SuiteError` where the experiments' seeds are not one sweep's: two experiments each
    with a seed the other lacks (a run that never started lacks a seed, never adds one, so one
    sweep's experiments' seeds nest). New seeds follow the sweep's, and a first look at the
    union would launch each sweep's seeds for the other's experiments."""
    seeds = {e: frozenset(r.seed for r in m) for e, m in by_experiment.items()}
    for a, b in ((a, b) for a in seeds for b in seeds if a < b):
        if not (seeds[a] <= seeds[b] or seeds[b] <= seeds[a]):
            first_a, first_b = (min(r.name for r in by_experiment[e]) for e in (a, b))
            raise SuiteError(
                f"settle: {root} mixes sweeps: the experiment of {first_a} has seeds {spans(seeds[a])}, "
                f"the one of {first_b} seeds {spans(seeds[b])}; settle each sweep from a folder of its "
                "own (or run the missing seeds with the sweep's command first)"
            )


def spans(seeds: Iterable[int]) -> str:
    """``0-2, 5`` for seeds 0, 1, 2, 5."""
    out: list[list[int]] = []
    for s in sorted(seeds):
        if out and s == out[-1][1] + 1:
            out[-1][1] = s
        else:
            out.append([s, s])
    return ", ".join(f"{a}-{b}" if b > a else f"{a}" for a, b in out)


def seeds_for(target: int, state: dict) -> list[int]:
    """The first ``target`` seeds of the sweep: its own, then ``max + 1, …``."""
    base = state["base_seeds"] or [0]
    extra = range(max(base) + 1, max(base) + 1 + max(0, target - len(base)))
    return sorted([*base[:target], *extra])


def missing_seeds(members: list[Run], target: int, state: dict) -> list[int]:
    """The seeds up to ``target`` without a completed or failed record (an unfinished one is
    launched again: it resumes from its checkpoint)."""
    done = {r.seed for r in members if r.status in ("completed", "failed", "failed to start")}
    return [s for s in seeds_for(target, state) if s not in done]


def group(runs: Iterable[Run]) -> dict[str, list[Run]]:
    """The readable runs by experiment; a ``debug=`` run (a few steps of everything) is no seed of one."""
    out: dict[str, list[Run]] = {}
    for r in runs:
        if r.status not in ("unreadable", "debug"):
            out.setdefault(r.experiment, []).append(r)
    return out


def label(members: list[Run]) -> str:
    r = members[0]
    options = ", ".join(f"{k}={v}" for k, v in sorted(r.attn_options.items()) if k != "variant")
    return f"{r.task} · {r.attn}" + (f" ({options})" if options else "")


def look_record(found: list[Verdict], targets: dict[str, int], advanced: list[str]) -> dict:
    return {
        "rows": [
            {
                "claim": v.claim.key if v.claim else None,  # None: a comparison no claim makes
                "task": v.task,
                "reading": v.reading,
                "n": v.n,
                "target": targets.get(v.experiment),
                "verdict": v.verdict,
                "adjusted": v.adjusted,
            }
            for v in found
            if judged(v)
        ],
        "advanced": advanced,
    }


def load_state(root: Path) -> dict | None:
    path = root / STATE
    if not path.exists() and not path.is_symlink():
        return None
    try:  # a regular file within its cap (src/engine/record/bounded.py): a FIFO would hang the read
        return json.loads(read_bytes(path))
    except RefusedFile as refused:
        raise SuiteError(f"{refused}; move it aside to start the settle afresh") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise SuiteError(f"{path} is not JSON ({error}); move it aside to start the settle afresh") from None


def save_state(root: Path, state: dict) -> None:
    """Atomically: a kill mid-write leaves the previous state."""
    atomic.write_text(root / STATE, json.dumps(state, indent=1) + "\n")


def read_plan(root: Path) -> tuple[Plan, dict[str, stats.Levels]] | None:
    """A settled sweep's plan and each experiment's levels (for the report), or None."""
    state = load_state(root)
    if state is None:
        return None
    try:
        plan = Plan(**state["plan"])
        judged = set(state.get("judged", state["targets"]))  # rows never looked at keep the fixed levels
        return plan, {e: plan.levels(int(t)) for e, t in state["targets"].items() if e in judged}
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise SuiteError(f"{root / STATE}: not a settle state ({error}); move it aside") from None


# -- the confirm stage -----------------------------------------------------------------------

CONFIRM_SEEDS_FROM = 1000  # the confirm stage's seeds start here (or above the sweep's largest)


def confirm(
    root: Path, names: list[str], seeds: int, read: Read, launch: Launch, say: Callable[[str], None] = print
) -> list[int]:
    """The confirm stage: each named reading (``reading=<name>`` in its command), and its
    ``standard``, again on ``seeds`` fresh seeds disjoint from every seed of the sweep, as
    ``stage=confirm`` runs: their own experiment, paired among themselves, a family of their own
    in the verdicts. A reading chosen *because* it came out well is quoted only from these. Seeds
    that already have a record are not launched again. Returns the seeds used."""
    runs = read()
    by_experiment = group(runs)
    explored = {e: members for e, members in by_experiment.items() if not stage_of(members)}
    check_readings(root, names, explored, "--confirm")
    names_of = {e: reading_name(members) for e, members in explored.items()}
    chosen = [e for e, n in names_of.items() if n in names]
    contexts = {explored[e][0].context for e in chosen}
    baselines = [e for e, m in explored.items() if m[0].attn == "standard" and m[0].context in contexts]
    first = max(CONFIRM_SEEDS_FROM, 1 + max(r.seed for m in explored.values() for r in m))
    fresh = list(range(first, first + seeds))
    confirmed = {
        e: {r.seed for r in m if r.status != "incomplete"} for e, m in by_experiment.items() if stage_of(m)
    }
    for experiment in dict.fromkeys([*chosen, *baselines]):
        members = explored[experiment]
        twin = members[0].identity.hash  # a confirm run's identity without its stage is its source's
        have = set().union(
            *(s for e, s in confirmed.items() if by_experiment[e][0].identity.without("stage").hash == twin)
        )
        todo = [s for s in fresh if s not in have]
        if todo:
            say(f"confirm: {len(todo)} fresh seeds of {label(members)}")
            launch(members, todo)
    return fresh


def stage_of(members: list[Run]) -> str:
    return members[0].identity.config.get("stage") or ""


def reading_name(members: list[Run]) -> str | None:
    """The ``reading=`` an experiment was launched with (None: no recorded command, or none), from
    the first of its runs with a recorded command, read as data."""
    launched = launched_run(members)
    if launched is None:
        return None
    path = Path(launched.name) / ".hydra" / "overrides.yaml"
    overrides = relaunch.parsed(path, relaunch.read_list(path))
    return next((str(o.value()) for o in overrides if o.key_or_group == "reading" and o.value()), None)


# -- launching through Hydra -----------------------------------------------------------------


def launched_run(members: list[Run]) -> Run | None:
    """One of an experiment's runs whose command Hydra recorded (the first by folder)."""
    ordered = sorted(members, key=lambda r: r.name)
    return next((r for r in ordered if (Path(r.name) / ".hydra" / "overrides.yaml").exists()), None)


class Commands:
    """Each experiment's command for new seeds (:func:`launch.analysis.relaunch.run_command`), checked once:
    every run's recorded command against its own record, and the experiment's composed against its
    identity (:func:`launch.analysis.relaunch.check_composes`); ``extra``: overrides every launch adds
    (``stage=confirm``)."""

    def __init__(self, extra: tuple[str, ...] = ()) -> None:
        self.extra, self.known = extra, {}

    def check(self, by_experiment: dict[str, list[Run]]) -> None:
        """Check every experiment's command now, before anything is launched or written."""
        for members in by_experiment.values():
            self.of(members)

    def of(self, members: list[Run]) -> relaunch.Command | None:
        """The command of the experiment ``members`` are runs of (None: no run recorded one): the
        first run's by folder; every run's command that differs from it is composed too."""
        experiment = members[0].experiment
        if experiment not in self.known:
            commands: dict[tuple[str, ...], tuple[relaunch.Command, Run]] = {}
            for r in sorted(members, key=lambda r: r.name):
                folder = Path(r.name)
                if (folder / ".hydra" / "overrides.yaml").exists():
                    record, identity, _ = run_config(folder)
                    command = relaunch.run_command(folder, record, identity.config)
                    commands.setdefault(command.overrides, (command, r))
            for command, r in commands.values():
                relaunch.check_composes(command, r.seed, r.identity, self.extra)
            self.known[experiment] = next((c for c, _ in commands.values()), None)
        return self.known[experiment]


def hydra_launcher(hydra_args: list[str], commands: Commands) -> Launch:
    """Launch new seeds as ``python -m src.run -m`` with each experiment's checked command and
    ``hydra_args`` (the sweep's launcher and folder, and the user's own)."""

    def launch(members: list[Run], seeds: list[int]) -> None:
        command = commands.of(members)
        if command is None:
            raise SuiteError(f"{label(members)}: no run has .hydra/overrides.yaml to repeat")
        line = [sys.executable, "-m", "src.run", "-m", *command.overrides]
        line += [f"seed={','.join(map(str, seeds))}", *commands.extra, *hydra_args]
        subprocess.run(line, check=False)

    return launch


def own_hydra(given: list[str]) -> list[str]:
    """The Hydra overrides given on settle's command line (trusted: the user typed them); a
    :class:`SuiteError` for any other, since a run's own settings come from its records."""
    others = [o for o in given if not o.lstrip("~+").startswith(("hydra.", "hydra/"))]
    if others:
        raise SuiteError(
            f"{' '.join(others)}: after the folder, settle takes only Hydra overrides (hydra.…, "
            "hydra/…); the runs' own settings come from their records"
        )
    return given


def main(argv: list[str] | None = None) -> int:
    """Settle the sweep (or run its confirm stage); one ``error:`` line and 2 on bad input."""
    return run_command(command_line(), settle_sweep, argv, intermixed=True, expected=(ValueError,))


def command_line() -> argparse.ArgumentParser:
    """The command line (see the module's docstring)."""
    parser = command_parser(__spec__.name, __doc__)
    parser.add_argument("dir", type=Path, help="a sweep's folder (hydra.sweep.dir)")
    parser.add_argument(
        "hydra",
        nargs="*",
        metavar="HYDRA_OVERRIDE",
        help="Hydra overrides of your own for the launches (hydra.launcher.setup=[…]); the folder's "
        "own are repeated only as far as launch.analysis.relaunch allows",
    )
    parser.add_argument("--cap", type=int, default=10, help="the most seeds a row gets (default 10)")
    parser.add_argument("--batch", type=int, default=3, help="seeds added per look (default 3)")
    parser.add_argument(
        "--first", type=int, default=None, help="seeds at the first look (default: the sweep's)"
    )
    parser.add_argument("--spending", choices=("obf", "pocock"), default="obf")
    parser.add_argument("--readings", default=None, help="settle only these readings (conf/reading/ names)")
    parser.add_argument("--primary", action="store_true", help="settle only the claims' primary readings")
    parser.add_argument("--margin", action="append", default=[], metavar="KEY=δ")
    parser.add_argument(
        "--confirm", metavar="READINGS", help="the confirm stage: these readings and standard on fresh seeds"
    )
    parser.add_argument("--seeds", type=int, default=10, help="the confirm stage's seeds (default 10)")
    return parser


def settle_sweep(args: argparse.Namespace) -> None:
    """The command's work: every file of the folder checked, then the confirm stage or the settle."""
    root = args.dir
    if not (root / "multirun.yaml").exists():
        raise SuiteError(f"{root}: no multirun.yaml here; give the folder of a sweep (-m)")
    hydra_args = [*relaunch.sweep_hydra(root), f"hydra.sweep.dir={root.resolve()}"]
    hydra_args += own_hydra(args.hydra)
    runs = read_runs([root])
    explored = {e: m for e, m in group(runs).items() if not stage_of(m)}
    commands = Commands(("stage=confirm",) if args.confirm else ())
    commands.check(explored)  # every file of the folder checked before anything is written
    launch = hydra_launcher(hydra_args, commands)
    if args.confirm:
        used = confirm(root, args.confirm.split(","), args.seeds, lambda: read_runs([root]), launch, say)
        print(f"confirm stage: seeds {used[0]}-{used[-1]}; its rows: python -m launch.analysis.report {root}")
        return
    if args.readings:
        check_readings(root, args.readings.split(","), explored, "--readings")
    plan = looks_plan(args, root, runs)
    margins = parse_margins(args.margin)
    wanted = readings_filter(args.readings, args.primary)
    say(plan.describe())
    settle(root, plan, lambda: read_runs([root]), launch, margins=margins, wanted=wanted, say=say)
    print(f"tables and verdicts: python -m launch.analysis.report {root}")


def looks_plan(args: argparse.Namespace, root: Path, runs: list[Run]) -> Plan:
    """The looks' plan: ``--first`` seeds at the first look, else a resumed settle's own first look
    (whatever seeds came since), else the sweep's seeds; then ``--batch``, ``--cap``, ``--spending``."""
    state = load_state(root)
    first = args.first or (
        state["plan"]["first"] if state else len({r.seed for r in runs if not r.identity.config.get("stage")})
    )
    return Plan(first, args.batch, args.cap, args.spending)


def check_readings(root: Path, names: list[str], explored: dict[str, list[Run]], option: str) -> None:
    """A :class:`SuiteError` naming ``names`` that no experiment of ``root`` was launched with."""
    known = {n for m in explored.values() if (n := reading_name(m))}
    unknown = [n for n in names if n not in known]
    if unknown:
        listed = ", ".join(sorted(known)) or "none"
        raise SuiteError(f"{option} {','.join(unknown)}: no such reading in {root} (readings: {listed})")


def readings_filter(names: str | None, primary: bool = False) -> Callable[[Verdict, list[Run]], bool]:
    """Rows whose reading was launched as ``reading=<one of names>``, and (``primary``) only the
    claims' primary readings; every row without either."""
    chosen = set(names.split(",")) if names else None

    def wanted(v: Verdict, runs: list[Run]) -> bool:
        return (chosen is None or reading_name(runs) in chosen) and (not primary or v.role == "primary")

    return wanted


def say(line: str) -> None:
    print(line, flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
