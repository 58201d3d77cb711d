"""P5's stages, read from one logged curve without a hand-picked threshold.

P5 sees learning proceed in stages: a plateau (at chance), a rise, perhaps another plateau and
rise. :func:`stages` finds them in a run's validation curve (``val/acc`` by default, a point
every validation):

1. **Segmentation.** The curve is cut into segments, each a constant or a line, by *optimal
   partitioning*: an exact dynamic programme over all cut points minimising the segments'
   least-squares residual sums of squares plus their prices, in units of ``σ² log n`` (the
   Schwarz/BIC price of one parameter when the noise ``σ`` is known): a level 1, a slope 2, a
   cut 3 (:data:`CUT`, :data:`LEVEL`, :data:`SLOPE`). A straight line is one segment; a kink
   or a jump larger than the noise is a cut; a segment is a plateau when the constant is the
   cheaper fit, the slope not paying its price. [reading] The prices are fixed rules, not
   per-run thresholds, chosen among five settings (cut, slope) on simulated curves: 200 curves
   of pure noise or a noisy straight line, and 100 binomial draws of seed 11's staircase
   (2,048 test examples, a validation every 5 epochs; at twice that noise in brackets). With
   (3, 2) a cut is found in 1% of the 40-point curves and none of the 100-point ones, and the
   staircase's two plateaus and two rises in 95 draws (90); (2, 2): 6%, 2%, 94 (87); (2, 3):
   5.5%, 2%, 94 (83); (3, 1): 2.5%, 0.5%, 86 (77); (2, 1): 7.5%, 3%, 85 (77).
2. **Noise.** ``σ`` is estimated from the curve itself: the median absolute second difference
   (``1.4826 · MAD / √6``; second differences cancel any line and leave ``6σ²`` of i.i.d.
   noise), floored by ``floor``. An accuracy is first put on the arcsine scale
   ``asin(√a)`` (:func:`accuracy_stages`), where the sampling error of an accuracy on ``N``
   test examples is ``1/(2√N)`` at every level (the binomial's variance-stabilising
   transform); that is the floor: a change smaller than the test set can resolve is not a
   stage, and 94% → 100% counts for what it is (on the raw scale it would be drowned by the
   noise of 50%).
3. **Plateau or rise.** Segments of fewer than 3 points are not plateaus (a validation or two
   between two levels is a move). Two plateaus one after the other differ in level (the cut
   says so): the move between them is a rise (or a fall, when it goes the wrong way), as is any
   run of sloped segments between plateaus.

Lengths are in the curve's steps; levels on the curve's own scale. The first plateau lasts
from ``start`` (the run's step 0) to the last validation on it; a rise from the last
validation of the plateau before it to the first validation of the plateau after it. A run
that ends on its first plateau never learned: its plateau is **censored** (it lasts at least
the run), never dropped, and the median over seeds is Kaplan–Meier's
(:func:`plateau_km_median`); a run that ends while still rising has a censored rise.

[reading] The accuracy rather than the test loss: on seed 11 (160 epochs) the loss keeps
drifting down on the accuracy's plateaus as the margins grow, and reads as one long rise.

No torch and no matplotlib: the report and the verdicts import it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

Kind = Literal["plateau", "rise", "fall"]


@dataclass(frozen=True)
class Phase:
    """One stage: ``kind``, its span in steps, and its level (plateaus: the segment's mean)."""

    kind: Kind
    start: float
    end: float
    level: float

    @property
    def length(self) -> float:
        return self.end - self.start


@dataclass(frozen=True)
class Stages:
    """A curve's stages (see the module docstring).

    Attributes:
        cuts: the index of each segment's first point, after the first (the changepoints).
        phases: plateaus, rises and falls in order.
        noise: the ``σ`` the segmentation used.
        first_plateau: steps from ``start`` to the first plateau's last validation (0 when the
            curve starts by rising; the whole run when censored).
        first_rise: the rise after the first plateau, in steps (``None`` when there is none).
        censored: the run never left its first plateau.
        rise_censored: the run ended while still in its first rise.
    """

    cuts: list[int]
    phases: list[Phase] = field(default_factory=list)
    noise: float = 0.0
    first_plateau: float = 0.0
    first_rise: float | None = None
    censored: bool = False
    rise_censored: bool = False

    @property
    def plateaus(self) -> int:
        return sum(p.kind == "plateau" for p in self.phases)

    @property
    def plateaus_left(self) -> int:
        """Plateaus the run left by a rise (P5's stalls; the level it ends on is not one)."""
        return sum(
            p.kind == "plateau" and q.kind == "rise"
            for p, q in zip(self.phases, self.phases[1:], strict=False)
        )

    @property
    def rises(self) -> int:
        return sum(p.kind == "rise" for p in self.phases)

    def summary(self) -> dict[str, float | int | bool | None]:
        """Flat numbers for ``summary.json`` (``stages/…`` keys)."""
        return {
            "stages/plateaus": self.plateaus,
            "stages/plateaus_left": self.plateaus_left,
            "stages/rises": self.rises,
            "stages/first_plateau": self.first_plateau,
            "stages/first_rise": self.first_rise,
            "stages/censored": self.censored,
            "stages/rise_censored": self.rise_censored,
        }


def accuracy_stages(
    steps: list[float] | np.ndarray, accuracy: list[float] | np.ndarray, test_size: int, start: float = 0.0
) -> Stages:
    """:func:`stages` of an accuracy curve measured on ``test_size`` examples: segmented on the
    arcsine scale with the test set's sampling error ``1/(2√N)`` as the noise floor."""
    acc = np.clip(np.asarray(accuracy, dtype=float), 0.0, 1.0)
    return stages(steps, np.arcsin(np.sqrt(acc)), floor=0.5 / math.sqrt(test_size), start=start, levels=acc)


def noise_level(values: np.ndarray) -> float:
    """``σ`` of i.i.d. noise around a piecewise line: ``1.4826 · MAD(second differences) / √6``."""
    if len(values) < 3:
        return 0.0
    d2 = np.diff(values, 2)
    return float(1.4826 * np.median(np.abs(d2 - np.median(d2))) / math.sqrt(6))


class _Sums:
    """Cumulative sums giving any segment's least-squares RSS (constant or line) in O(1)."""

    def __init__(self, x: np.ndarray, y: np.ndarray) -> None:
        zero = np.zeros(1)
        self.n = np.arange(len(x) + 1, dtype=float)
        self.sx, self.sy = (np.concatenate([zero, np.cumsum(a)]) for a in (x, y))
        self.sxx, self.sxy, self.syy = (np.concatenate([zero, np.cumsum(a)]) for a in (x * x, x * y, y * y))

    def rss(self, i: np.ndarray | int, j: int, line: bool = True) -> np.ndarray:
        """RSS of points ``i … j−1`` (``i`` may be an array of starts)."""
        n = self.n[j] - self.n[i]
        sx, sy = self.sx[j] - self.sx[i], self.sy[j] - self.sy[i]
        syy = self.syy[j] - self.syy[i] - sy * sy / n
        if not line:
            return np.maximum(syy, 0.0)
        sxx = self.sxx[j] - self.sxx[i] - sx * sx / n
        sxy = self.sxy[j] - self.sxy[i] - sx * sy / n
        with np.errstate(divide="ignore", invalid="ignore"):
            explained = np.where(sxx > 0, sxy * sxy / np.where(sxx > 0, sxx, 1.0), 0.0)
        return np.maximum(syy - explained, 0.0)


CUT, LEVEL, SLOPE = 3.0, 1.0, 2.0  # prices in units of σ² log n (the module docstring)


def _cost(sums: _Sums, i: np.ndarray | int, j: int, unit: float) -> tuple[np.ndarray, np.ndarray]:
    """The priced fit of points ``i … j−1``: the cheaper of a constant and a line, and whether the
    constant is it."""
    flat = sums.rss(i, j, line=False) + LEVEL * unit
    line = sums.rss(i, j, line=True) + (LEVEL + SLOPE) * unit
    return np.minimum(flat, line), flat <= line


def segment(x: np.ndarray, y: np.ndarray, unit: float, min_size: int = 1) -> list[int]:
    """Optimal partitioning of ``y(x)`` into constants and lines: the cut indices minimising
    ``Σ (RSS + prices) + CUT · unit · cuts`` (prices: :data:`LEVEL`, :data:`SLOPE` times ``unit``).

    Exact (every partition with segments of at least ``min_size`` points is considered), O(n²).
    """
    n = len(y)
    sums = _Sums(x, y)
    best = np.full(n + 1, np.inf)
    best[0] = -CUT * unit
    last = np.zeros(n + 1, dtype=int)
    for j in range(min_size, n + 1):
        starts = np.arange(0, j - min_size + 1)
        starts = starts[np.isfinite(best[starts])]
        total = best[starts] + _cost(sums, starts, j, unit)[0] + CUT * unit
        k = int(np.argmin(total))  # ties: the earliest start, i.e. the fewest cuts
        best[j], last[j] = total[k], starts[k]
    cuts, j = [], n
    while j > 0:
        j = int(last[j])
        if j > 0:
            cuts.append(j)
    return sorted(cuts)


def stages(
    steps: list[float] | np.ndarray,
    values: list[float] | np.ndarray,
    *,
    floor: float = 0.0,
    higher_is_better: bool = True,
    start: float = 0.0,
    min_size: int = 1,
    levels: list[float] | np.ndarray | None = None,
) -> Stages:
    """The stages of one curve (see the module docstring); ``floor`` bounds the noise ``σ`` below;
    ``levels``: the values to report the phases' levels in (default: ``values``), when the curve
    was segmented on another scale."""
    x = np.asarray(steps, dtype=float)
    y = np.asarray(values, dtype=float)
    shown = y if levels is None else np.asarray(levels, dtype=float)
    if len(x) != len(y) or len(x) == 0 or len(shown) != len(y):
        raise ValueError(f"stages needs as many steps as values, at least one; got {len(x)} and {len(y)}")
    sigma = max(noise_level(y), floor, 1e-6 * max(1.0, float(np.ptp(y))))  # 1e-6: above rounding
    cuts, segs = _segments(x, y, sigma, min_size)
    walk = _Walk(x, y, shown, 1.0 if higher_is_better else -1.0, start)
    walk.through(segs)
    return _summary(cuts, walk.phases, sigma, walk.rise_censored)


_Seg = tuple[int, int, bool]  # (first index, last index, flat?)


def _segments(x: np.ndarray, y: np.ndarray, sigma: float, min_size: int) -> tuple[list[int], list[_Seg]]:
    """The cuts of the penalised segmentation (penalty ``σ² log n`` a cut) and each segment as
    (first index, last index, flat?); a segment of fewer than 3 points is a move, never flat."""
    n = len(y)
    span = float(x[-1] - x[0]) or 1.0
    u = (x - x[0]) / span  # on [0, 1]: the sums stay well conditioned
    unit = sigma**2 * math.log(max(n, 2))
    cuts = segment(u, y, unit, min_size) if n >= 2 * min_size else []
    bounds = [0, *cuts, n]
    sums = _Sums(u, y)
    segs = [
        (a, b - 1, b - a >= 3 and bool(_cost(sums, a, b, unit)[1]))
        for a, b in zip(bounds[:-1], bounds[1:], strict=True)
    ]
    return cuts, segs


class _Walk:
    """The phases of a curve's segments, in order: each flat segment a plateau at its mean level, the
    sloped ones between two plateaus (or before the first) one move; a move still open at the end
    is censored."""

    def __init__(self, x: np.ndarray, y: np.ndarray, shown: np.ndarray, sign: float, start: float) -> None:
        self.x, self.y, self.shown, self.sign, self.start = x, y, shown, sign, start
        self.phases: list[Phase] = []
        self.rise_censored = False

    def move(self, i0: int, i1: int, t0: float, t1: float) -> None:
        kind: Kind = "rise" if self.sign * (self.y[i1] - self.y[i0]) > 0 else "fall"
        self.phases.append(Phase(kind, t0, t1, float(self.shown[i1])))

    def through(self, segs: list[_Seg]) -> None:
        x = self.x
        prev_end: int | None = None  # last index of the previous plateau
        pending: int | None = None  # first index of sloped segments not yet assigned to a move
        for a, b, flat in segs:
            if not flat:
                pending = a if pending is None else pending
                continue
            level = float(self.shown[a : b + 1].mean())
            if prev_end is not None:
                self.move(prev_end, a, float(x[prev_end]), float(x[a]))
            elif pending is not None:
                self.move(pending, a, self.start, float(x[a]))
            t0 = self.start if prev_end is None and pending is None else float(x[a])
            self.phases.append(Phase("plateau", t0, float(x[b]), level))
            prev_end, pending = b, None
        if pending is not None or not any(p.kind == "plateau" for p in self.phases):
            self.close(prev_end)

    def close(self, prev_end: int | None) -> None:
        """The move from the last plateau (or the start) to the curve's end, censored by the run's end."""
        i0 = prev_end if prev_end is not None else 0
        t0 = float(self.x[prev_end]) if prev_end is not None else self.start
        if i0 < len(self.y) - 1:
            self.move(i0, len(self.y) - 1, t0, float(self.x[-1]))
            self.rise_censored = True


def _summary(cuts: list[int], phases: list[Phase], sigma: float, open_end: bool) -> Stages:
    """:class:`Stages` from the phases: the first plateau's length (censored when it is the only
    phase) and the first rise's (censored when it is the last phase and still open)."""
    first = phases[0] if phases else None
    rises = [i for i, p in enumerate(phases) if p.kind == "rise"]
    return Stages(
        cuts=cuts,
        phases=phases,
        noise=sigma,
        first_plateau=first.length if first is not None and first.kind == "plateau" else 0.0,
        first_rise=phases[rises[0]].length if rises else None,
        censored=first is not None and first.kind == "plateau" and len(phases) == 1,
        rise_censored=bool(rises) and open_end and rises[0] == len(phases) - 1,
    )


def plateau_km_median(found: list[Stages]) -> float | None:
    """The Kaplan–Meier median of the first plateau's length over runs, the censored ones
    (never left it) kept as "at least the run"; ``None`` when the median is not reached."""
    from scipy import stats as sps

    if not found:
        return None
    lengths = np.array([s.first_plateau for s in found])
    censored = np.array([s.censored for s in found])
    data = sps.CensoredData(uncensored=lengths[~censored], right=lengths[censored])
    sf = sps.ecdf(data).sf
    below = np.nonzero(sf.probabilities <= 0.5)[0]
    return float(sf.quantiles[below[0]]) if len(below) else None


def emergence(steps: list[float] | np.ndarray, clustering: list[float] | np.ndarray) -> float | None:
    """The step a clustering head has emerged: the end of the first rise of its clustering series
    (``None`` if it never rises, or is still rising at the last snapshot: censored)."""
    found = stages(steps, clustering)
    rises = [p for p in found.phases if p.kind == "rise"]
    if not rises or (found.rise_censored and rises[0] is found.phases[-1]):
        return None
    return rises[0].end
