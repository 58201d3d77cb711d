"""P5's claims judged from seed sets (``curves.json``, written by ``python -m src.sandbox.seeds``).

P5's findings are rates over seeds, and its sandbox trains its seeds at once, so its claims are
judged from the sets' curves rather than from run records (:mod:`launch.analysis.verdicts` judges those).
A claim of :mod:`launch.analysis.claims` on ``modadd`` is judged here when its measure is one of:

``stages``        on each ``standard`` set: per seed that leaves its first plateau and ends the
                  rise after it, the first plateau minus that rise over the set's epochs (the
                  measure :func:`launch.analysis.verdicts.stages` reads from a run's validation curve,
                  here from the seed's test accuracy every 5 epochs, :func:`~src.sandbox.curves.seed_table`);
                  its mean with a 95% t interval; *reproduced* when the interval is above 0 (a
                  plateau longer than its rise). Seeds that never leave the plateau are censored:
                  counted in the note, not in the mean.
``learns_first``  each set of the claim's variant against the ``standard`` set of the same
                  backbone, paired by seed (same data, same init draw): among the seeds that
                  learned (≥ 95% test accuracy) first in one of the two, the share that did under
                  the variant, with its exact 95% interval; the exact sign test
                  (:func:`launch.analysis.time_to_quality.sign_test`); *reproduced* when it says faster
                  (one-sided 2.5%), *contradicted* when slower, *equivalent* when TOST puts the
                  share inside ``0.5 ± margin`` (the claim's margin,
                  :data:`launch.analysis.stats.SHARE_MARGIN` by default; exact binomial tests at 5%
                  each). An open row's note gives the discordant seeds the margin takes (80% power,
                  :func:`launch.analysis.stats.pairs_needed`) and, at the set's rate of discordant
                  seeds, the seeds. The claim's readings on
                  one backbone are a family, Holm-adjusted (each side and the equivalence).

``spike_curvature``  from a ``memory.json`` of ``python -m src.sandbox.memory`` (P5's associative
                  memory under gradient descent), per learning rate with spikes: per seed, the
                  share of its spike steps at which ``η·λ_max > 2`` minus that share among its
                  other steps (the control); the mean over the seeds with a 95% t interval;
                  *reproduced* when it is above 0 (one-sided 2.5%), *contradicted* below. The
                  note gives the pooled shares.

``clustering_first``  on each ``standard`` set whose seeds were probed (``curves.clustering``):
                  per seed that learned, the epoch its clustering head emerged (the end of the
                  first rise of its η² by the partial sum, :func:`src.sandbox.stages.emergence`)
                  against the epoch it learned; among the seeds where one came more than a probe
                  interval before the other, the share where the head came first [exact 95%],
                  the exact sign test (its margin as ``learns_first``'s); *reproduced* when first
                  (one-sided 2.5%). Seeds that
                  learned with no ended rise, and never-learners whose head formed, are counted
                  in the note.
``curriculum``    each set fine-tuned from another's weights (``--init-from``, P5's curriculum)
                  against the set of the same setting trained from scratch, paired by seed: the
                  counts, the sign test and the margin of ``learns_first``, the fine-tuned set in
                  the variant's place.
``init_source``   within a fine-tuned set: the share that learned among the seeds whose source
                  seed had learned, minus the share among those whose source had not, with
                  Newcombe's 95% interval (:func:`launch.analysis.stats.difference_interval`) and Fisher's
                  exact test, one-sided each way; *reproduced* when higher.

The rows name the set's reading (:func:`launch.analysis.reading_files.match`, from the composed
``attn`` the set records) and which is the claim's primary. Each row is the suite's one verdict row
(:class:`launch.analysis.verdict_row.Verdict`: the statistic as its value and effect, its test's
p-values, the set's epochs × seeds as its budget), each measure registered by name
(:mod:`launch.analysis.measures`) and each family adjusted by the one Holm adjustment.
"""

from __future__ import annotations

import json
import math
import statistics
import warnings
from dataclasses import replace
from pathlib import Path

from scipy.stats import binomtest, fisher_exact

from launch.analysis.seed_sets import backbone_of, compare, setting
from src.engine.record.bounded import RefusedFile, read_bytes
from src.sandbox.curves import SUCCESS, Curves, first_success, seed_table
from src.sandbox.stages import emergence

from . import stats
from .claims import CLAIMS, Claim
from .measures import Evidence, lookup, register
from .reading_files import match
from .verdict_row import Verdict, adjust, known_test, row

#: a share's words where no claim names the row (launch.analysis.seed_sets: one set against another)
SOONER = {"reproduced": "faster", "contradicted": "slower"}


def set_row(
    claim: Claim, curves: Curves, n: int, value, low, high, test: stats.PairedTest | None, note: str
) -> Verdict:
    """One claim's row on one seed set: its backbone, reading and budget taken from the set;
    ``value`` the statistic [``low``, ``high``], ``test`` its p-values (None: untested)."""
    reading = reading_of(curves)
    return Verdict(
        claim,
        "modadd",
        reading,
        n,
        None,
        value,
        value,
        low,
        high,
        None,
        note,
        test=test,
        budget=f"{curves.epochs} epochs × {len(curves.seeds)} seeds",
        role="primary" if reading == claim.primary else "exploratory",
        backbone=backbone_of(curves),
    )


def reading_of(curves: Curves) -> str:
    """The ``conf/reading/`` file whose variant and options are the set's, else its overrides."""
    found = match(curves.variant, curves.attn) if curves.attn else None
    return found or " ".join(curves.overrides) or "—"


#: The numbers each of memory.json's ``statistics`` holds (:class:`src.sandbox.memory.SpikeStatistic`).
MEMORY_NUMBERS = (
    "lr",
    "seeds",
    "seeds_with_spikes",
    "spikes",
    "spikes_sharp",
    "control",
    "control_sharp",
    "spike_grad",
    "control_grad",
)


def load_memories(roots: list[Path]) -> list[tuple[Path, dict]]:
    """Every readable ``memory.json`` under ``roots`` (:func:`read_memories`), the others left out
    with a warning each."""
    memories, unreadable = read_memories(roots)
    for _, reason in unreadable:
        warnings.warn(f"{reason}: left out", stacklevel=2)
    return memories


def read_memories(roots: list[Path]) -> tuple[list[tuple[Path, dict]], list[tuple[Path, str]]]:
    """Every ``memory.json`` (``python -m src.sandbox.memory``) under ``roots``; and those that cannot
    be read (not a regular file or too large, :mod:`src.engine.record.bounded`; torn; of another
    shape, :func:`memory_problem`), each with its one-line reason, so that one never stops the others."""
    files = sorted({p for root in roots for p in Path(root).rglob("memory.json")})
    memories, unreadable = [], []
    for f in files:
        try:
            memory = json.loads(read_bytes(f, within=f.parent))
        except ValueError as error:  # torn, or refused (RefusedFile: its message names the file)
            unreadable.append(
                (f, str(error) if isinstance(error, RefusedFile) else f"{f} is not JSON ({error})")
            )
            continue
        problem = memory_problem(memory)
        if problem:
            unreadable.append((f, f"{f} is not a memory.json of python -m src.sandbox.memory ({problem})"))
        else:
            memories.append((f.parent, memory))
    return memories, unreadable


def memory_problem(memory: object) -> str | None:
    """What keeps a parsed ``memory.json`` from being read by :func:`spike_verdicts`, or None."""
    if not isinstance(memory, dict) or not isinstance(memory.get("statistics"), list):
        return "no 'statistics' list"
    if not isinstance(memory.get("args", {}), dict):
        return "its 'args' is not an object"
    for i, s in enumerate(memory["statistics"]):
        if not isinstance(s, dict):
            return f"statistics[{i}] is not an object"
        wrong = [
            k for k in MEMORY_NUMBERS if isinstance(s.get(k), bool) or not isinstance(s.get(k), (int, float))
        ]
        differences = s.get("seed_differences", [])
        if (
            wrong
            or not isinstance(differences, list)
            or not all(isinstance(d, (int, float)) for d in differences)
        ):
            return f"statistics[{i}]: {', '.join(wrong) or 'seed_differences'} not numbers"
    return None


def spike_verdicts(claim: Claim, folder: Path, memory: dict) -> list[Verdict]:
    """One row per learning rate of one memory.json that had spikes (see the module docstring)."""
    out = []
    for s in memory["statistics"]:
        if not s["spikes"]:
            continue
        test = stats.paired_test(s.get("seed_differences", []))
        control = s["control_sharp"] / s["control"] if s["control"] else math.nan
        quiet = [f"{o['lr']:g}" for o in memory["statistics"] if not o["spikes"]]
        note = (
            f"η = {s['lr']:g}: {s['seeds_with_spikes']} of {s['seeds']} seeds spike; pooled, spikes with "
            f"η·λ_max > 2: {s['spikes_sharp']} of {s['spikes']} ({s['spikes_sharp'] / s['spikes']:.0%}), "
            f"control steps: {s['control_sharp']} of {s['control']} ({control:.0%}); median ‖∇‖ at a "
            f"spike {s['spike_grad']:.3g}, elsewhere {s['control_grad']:.3g}"
            + (f"; no spike at η = {', '.join(quiet)}" if quiet else "")
        )
        budget = memory.get("args", {})
        reading = f"η = {s['lr']:g}, {budget.get('tokens', '?')} tokens"
        out.append(
            Verdict(
                claim,
                "modadd",
                reading,
                len(s.get("seed_differences", [])),
                None,
                None if test is None else test.mean,
                None if test is None else test.mean,
                None if test is None else test.low,
                None if test is None else test.high,
                None,
                note,
                test=test,
                budget=f"{int(budget.get('steps', 0))} steps × {s['seeds']} seeds",
                role="primary" if reading == claim.primary else "exploratory",
                backbone="memory",
                folder=folder.name,
            )
        )
    return out


def stages_verdict(claim: Claim, curves: Curves) -> Verdict:
    """P5's two stages on one ``standard`` set (see the module's docstring)."""
    rows = seed_table(curves)
    done = [r for r in rows if not r["censored"] and r["first_rise"] is not None and not r["rise_censored"]]
    values = [(r["first_plateau"] - r["first_rise"]) / curves.epochs for r in done]
    test = stats.paired_test(values)
    never = sum(r["censored"] for r in rows)
    note = (
        f"{len(values)} of {len(rows)} seeds leave the first plateau and end the rise "
        f"(median plateau {statistics.median(r['first_plateau'] for r in done):.0f} epochs, "
        f"rise {statistics.median(r['first_rise'] for r in done):.0f})"
        if done
        else f"no seed of {len(rows)} ends a rise"
    ) + f"; {never} never leave it (censored)"
    return set_row(
        claim,
        curves,
        len(values),
        statistics.fmean(values) if values else None,
        None if test is None else test.low,
        None if test is None else test.high,
        test,
        note,
    )


def learns_first_verdict(claim: Claim, curves: Curves, base: Curves, family: int = 1) -> Verdict:
    """One set of the claim's variant against the ``standard`` set of its setting, paired by seed
    (the counts and the sign test of :func:`launch.analysis.seed_sets.compare`); ``family``: the sets of
    its Holm family (the level an open row's seeds are planned at)."""
    standard, here = compare({"standard": base, "here": curves}, "standard")
    note = (
        f"learned first here / in standard: {here.faster} / {here.slower}; learned by epoch "
        f"{curves.epochs}: {here.learned} / {standard.learned} of {len(curves.seeds)}"
    )
    return share_verdict(claim, curves, here.faster, here.slower, note, family)


def share_verdict(
    claim: Claim, curves: Curves, first: int, second: int, note: str, family: int = 1
) -> Verdict:
    """A sign test: ``first`` of ``first + second`` discordant seeds on the claim's side, with TOST
    against the claim's margin and, while open, the seeds the margin would take at the level it is
    tested at in a Holm family of ``family`` sets (:func:`launch.analysis.stats.tested_at`)."""
    n = first + second
    if not n:
        return set_row(claim, curves, 0, None, None, None, None, note)
    low, high = binomtest(first, n).proportion_ci(0.95, method="exact")
    test = known_test(n, first / n, low, high, *stats.share_tests(first, n, claim.margin))
    found = set_row(claim, curves, n, first / n, low, high, test, note)
    if claim.margin is not None and found.verdict == "inconclusive":
        found.note = f"{note}; {settles_at(claim.margin, n, len(curves.seeds), family)}"
    return found


def settles_at(margin: float, discordant: int, seeds: int, family: int = 1) -> str:
    """What a sign test's margin takes: discordant seeds for 80% power at the level it is tested at
    (one-sided 2.5% over its Holm family's ``family`` sets), and seeds at this rate."""
    level = stats.tested_at(stats.FIXED, family)
    needed = stats.pairs_needed(margin, alpha=level.side)
    at = "" if family == 1 else f" at {stats.describe_level(level)}, Holm over {family} sets"
    if needed is None:
        return f"a share of 0.5 ± {margin:g} takes more than 1,000 discordant seeds{at}"
    rate = f" ≈ {math.ceil(needed * seeds / discordant):,} seeds at this set's rate" if discordant else ""
    return f"a share of 0.5 ± {margin:g} takes {needed} discordant seeds (80% power{at}){rate}"


def clustering_verdict(claim: Claim, curves: Curves) -> Verdict:
    """Does each seed's clustering head form before it learns (see the module's docstring)?"""
    epochs = curves.probe_epochs()
    before = after = tied = bare = formed_unlearned = 0
    for acc, series in zip(curves.acc, curves.clustering, strict=True):
        learned, emerged = first_success(acc), emergence(epochs, series)
        if learned is None:
            formed_unlearned += emerged is not None
        elif emerged is None:
            bare += 1
        elif abs(learned - emerged) <= curves.probe_every:
            tied += 1  # within one probe interval: not ordered
        else:
            before += emerged < learned
            after += emerged > learned
    never = sum(first_success(acc) is None for acc in curves.acc)
    final = {True: [], False: []}  # the last probe's η², by whether the seed learned
    for acc, series in zip(curves.acc, curves.clustering, strict=True):
        final[first_success(acc) is not None].append(series[-1])
    medians = ", ".join(
        f"{label} {statistics.median(final[key]):.2f}"
        for key, label in ((True, "learned"), (False, "never"))
        if final[key]
    )
    note = (
        f"head first / learned first: {before} / {after}; within a probe ({curves.probe_every} epochs): "
        f"{tied}; learned with no ended rise: {bare}; of {never} that never learned, "
        f"{formed_unlearned} formed a head; final η², median: {medians}"
    )
    return share_verdict(claim, curves, before, after, note)


def curriculum_verdict(claim: Claim, curves: Curves, scratch: Curves) -> Verdict:
    """A fine-tuned set against its setting's set trained from scratch, paired by seed."""
    base, here = compare({"scratch": scratch, "here": curves}, "scratch")
    note = (
        f"from {Path(curves.init_from or '').name} / from scratch, learned first: {here.faster} / "
        f"{here.slower}; learned by epoch {curves.epochs}: {here.learned} / {base.learned} of "
        f"{len(curves.seeds)}"
    )
    return share_verdict(claim, curves, here.faster, here.slower, note)


def init_verdict(claim: Claim, curves: Curves) -> Verdict:
    """Within a fine-tuned set: learned p = 3 by the source seed's own success (see the docstring)."""
    learned = [first_success(acc) is not None for acc in curves.acc]
    source = [a >= SUCCESS for a in curves.init_acc or []]
    good = [here for here, there in zip(learned, source, strict=True) if there]
    bad = [here for here, there in zip(learned, source, strict=True) if not there]
    note = (
        f"learned from a source that learned: {sum(good)} of {len(good)}; from one that did not: "
        f"{sum(bad)} of {len(bad)}"
    )
    if not good or not bad:
        value = low = high = p_for = p_against = None
        test = None
    else:
        value = sum(good) / len(good) - sum(bad) / len(bad)
        low, high = stats.difference_interval(sum(good), len(good), sum(bad), len(bad))
        table = [[sum(good), len(good) - sum(good)], [sum(bad), len(bad) - sum(bad)]]
        p_for = fisher_exact(table, alternative="greater").pvalue
        p_against = fisher_exact(table, alternative="less").pvalue
        test = known_test(len(learned), value, low, high, p_for, p_against)
    return set_row(claim, curves, len(learned) if source else 0, value, low, high, test, note)


def seed_verdicts(
    sets: list[tuple[Path, Curves]],
    claims: list[Claim] = CLAIMS,
    memories: list[tuple[Path, dict]] = (),
    margins: dict[str, float] | None = None,
) -> list[Verdict]:
    """Every ``modadd`` claim whose measure reads seed sets (:mod:`launch.analysis.measures`) on
    every seed set (or memory.json) it applies to; a variant's set is judged only against the
    ``standard`` set of its setting: the same overrides but the variant's, the same seeds and
    epochs (:func:`launch.analysis.seed_sets.setting`). ``margins`` (``{claim key: δ}``) replaces
    the claims' own, as ``launch.analysis.report --margin``. Each family a measure gives is
    Holm-adjusted together (:func:`launch.analysis.verdict_row.adjust`)."""
    evidence = Evidence("modadd", sets=list(sets), memories=list(memories))
    out: list[Verdict] = []
    for claim in (replace(c, margin=(margins or {}).get(c.key, c.margin)) for c in claims):
        judge = lookup(claim.measure).sets if "modadd" in claim.tasks else None
        for family in judge(claim, evidence) if judge else []:
            out += adjust(family)
    return out


@register("stages", "sets")
def stages_families(claim: Claim, evidence: Evidence) -> list[list[Verdict]]:
    """``stages`` on each set of the claim's variant, each row its own family."""
    return [
        [replace(stages_verdict(claim, c), folder=f.name)]
        for f, c in evidence.sets
        if c.variant == claim.variant
    ]


@register("spike_curvature", "sets")
def spike_families(claim: Claim, evidence: Evidence) -> list[list[Verdict]]:
    """``spike_curvature`` per learning rate with spikes of each memory.json, each its own family."""
    return [[v] for folder, m in evidence.memories for v in spike_verdicts(claim, folder, m)]


@register("clustering_first", "sets", unit="share", words=SOONER)
def clustering_families(claim: Claim, evidence: Evidence) -> list[list[Verdict]]:
    """``clustering_first`` on each probed set of the claim's variant, each its own family."""
    return [
        [replace(clustering_verdict(claim, c), folder=f.name)]
        for f, c in evidence.sets
        if c.variant == claim.variant and c.probe_epochs()
    ]


@register("init_source", "sets")
def init_families(claim: Claim, evidence: Evidence) -> list[list[Verdict]]:
    """``init_source`` within each fine-tuned set of the claim's variant, each its own family."""
    return [
        [replace(init_verdict(claim, c), folder=f.name)]
        for f, c in evidence.sets
        if c.variant == claim.variant and c.init_acc is not None
    ]


@register("curriculum", "sets", unit="share", words=SOONER)
def curriculum_families(claim: Claim, evidence: Evidence) -> list[list[Verdict]]:
    """``curriculum``: each fine-tuned set against its setting's set from scratch, each its own family."""
    scratch = {(setting(c), c.variant): c for _, c in evidence.sets if not c.init_from}
    out = []
    for f, c in evidence.sets:
        base = scratch.get((setting(c, init=False), c.variant))
        if c.variant == claim.variant and c.init_from and base is not None:
            out.append([replace(curriculum_verdict(claim, c, base), folder=f.name)])
    return out


@register("learns_first", "sets", unit="share", words=SOONER)
def learns_first_families(claim: Claim, evidence: Evidence) -> list[list[Verdict]]:
    """``learns_first``: each set of the claim's variant against its setting's ``standard`` set;
    one backbone's sets a Holm family."""
    standards = {setting(c): c for _, c in evidence.sets if c.variant == "standard"}
    paired: dict[str, list[tuple[Path, Curves, Curves]]] = {}
    for f, c in evidence.sets:
        base = standards.get(setting(c))
        if c.variant == claim.variant and base is not None:
            paired.setdefault(backbone_of(c), []).append((f, c, base))
    return [
        [replace(learns_first_verdict(claim, c, base, len(members)), folder=f.name) for f, c, base in members]
        for members in paired.values()
    ]


#: the columns of the section's table (:data:`launch.analysis.verdict_row.COLUMNS`)
COLUMNS = ("claim", "backbone", "set reading", "set", "budget", "n", "statistic", "verdict (holm)", "note")


def section(found: list[Verdict]) -> list[str]:
    """The report's lines for P5's claims judged from seed sets (nothing when there are none)."""
    if not found:
        return []
    lines = [
        "",
        "## P5's claims over seeds",
        "",
        "`stages`: the first plateau minus its rise over the epochs, mean [95% t interval] over the seeds "
        "that end the rise; `learns_first`: among the seeds that learned first in one arm, the share "
        "under the variant [exact 95%], by the paired sign test; `spike_curvature`: per seed of the "
        "associative memory, the share of its spikes taken at η·λ_max > 2 minus its other steps' share, "
        "mean [95% t interval] over the seeds that spike; `clustering_first`: among the seeds whose head "
        "formed and who learned at least a probe apart, the share whose head came first [exact 95%], by "
        "the sign test; `curriculum`: `learns_first` with the fine-tuned set against the same seeds from "
        "scratch; `init_source`: the share that learned from a source seed that had learned minus the "
        "share from one that had not [Newcombe 95%], by Fisher's exact test "
        "(launch/analysis/seed_verdicts.py). "
        "A share is *equivalent* when TOST puts it inside 0.5 ± the claim's margin "
        f"(default {stats.SHARE_MARGIN:g}, [reading]; `--margin KEY=δ`). `†` the claim's primary reading.",
        "",
        "| claim | backbone | reading | set | budget | n | statistic [95%] | verdict (Holm) | note |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    return lines + [row(v, COLUMNS) for v in found]
