"""The registry of measures: each claim's ``measure`` names one, and the one names what judges it.

A :class:`Measure` is registered by name (:func:`register`) by the module that computes it: from
run records, :mod:`launch.analysis.verdicts` (``final``, ``monitor:<key>``, ``time_to_target``,
``stages``); from seed sets and memory runs, :mod:`launch.analysis.seed_verdicts` (``stages``,
``learns_first``, ``spike_curvature``, ``clustering_first``, ``curriculum``, ``init_source``).
Each registers the function that turns a claim and its :class:`Evidence` into families of
:class:`~launch.analysis.verdict_row.Verdict` rows (each family Holm-adjusted together,
:func:`launch.analysis.verdict_row.adjust`); :func:`launch.analysis.verdicts.verdicts` and
:func:`launch.analysis.seed_verdicts.seed_verdicts` dispatch through :func:`lookup`. A name ending
in ``:`` is a prefix (``monitor:`` serves ``monitor:kappa/W_Q/median``). A P5 seed set is evidence
as a sweep's runs are: one measure may read both (``stages``).

Adding a statistic is one registered function (and, if it is a paper's, one
:class:`~launch.analysis.claims.Claim` row naming it): docs/extending.md.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from .claims import Claim
    from .records import Run

#: a comparison's verdicts (no claim, so no paper's side): the metric's own direction
COMPARED = {"reproduced": "better", "contradicted": "worse"}


@dataclass(frozen=True)
class Evidence:
    """What a measure judges a claim from: one task's run records (``runs``, with the claim's δ,
    the evaluation set's size to count as a sample and the split a ``final`` row reads), or the
    seed sets and memory runs (``sets``, ``memories``)."""

    task: str = ""
    runs: list[Run] = field(default_factory=list)
    margin: float | None = None
    examples: int | None = None
    on: str = "auto"
    sets: list[tuple[Path, Any]] = field(default_factory=list)  # (folder, src.sandbox.curves.Curves)
    memories: list[tuple[Path, dict]] = field(default_factory=list)


#: a measure's judge: a claim and its evidence to families of rows (each a list of
#: launch.analysis.verdict_row.Verdict, which imports this module), each family adjusted together
Judge = Callable[["Claim", Evidence], list[list[Any]]]
Reads = Literal["runs", "sets"]


@dataclass(frozen=True)
class Measure:
    """One measure: its judge from run records (``runs``) and from seed sets (``sets``), either
    None where it reads no such evidence; ``unit``: how its effect prints (a signed
    ``difference``, a ``share`` in [0, 1], a ``ratio``); ``words``: a claimless row's verdicts."""

    name: str
    runs: Judge | None = None
    sets: Judge | None = None
    unit: str = "difference"
    words: dict[str, str] = field(default_factory=lambda: dict(COMPARED))


MEASURES: dict[str, Measure] = {}

#: the modules that register measures, imported on the first :func:`lookup`
MODULES = ("launch.analysis.verdicts", "launch.analysis.seed_verdicts")


def register(name: str, reads: Reads, unit: str = "difference", words: dict[str, str] | None = None):
    """A decorator: the function judges measure ``name`` from ``reads`` (``runs`` or ``sets``)
    evidence; a second registration of one name adds the other evidence's judge."""

    def decorate(judge: Judge) -> Judge:
        found = MEASURES.get(name) or Measure(name, unit=unit, words=dict(words or COMPARED))
        if getattr(found, reads) is not None and getattr(found, reads) is not judge:
            raise ValueError(f"measure {name!r} already has a judge from {reads}")
        MEASURES[name] = replace(found, **{reads: judge})
        return judge

    return decorate


def lookup(name: str) -> Measure:
    """The measure ``name`` (a prefix's where ``name`` is ``prefix:key``); a ValueError naming the
    registered ones for a name no module registers."""
    for module in MODULES:
        importlib.import_module(module)
    found = MEASURES.get(name)
    if found is None and ":" in name:
        found = MEASURES.get(name.split(":", 1)[0] + ":")
    if found is None:
        raise ValueError(f"unknown measure {name!r} (registered: {', '.join(sorted(MEASURES))})")
    return found
