"""A Pathfinder generator writing the release's layout (``pathfinder32/<difficulty>/``).

Pathfinder (Linsley et al., 2018; Kim et al., 2020) asks whether two marked points lie on
the same path. LRA's images come from the authors' ``snakes2`` generator: paths ("snakes")
made of short dashes ("paddles") with gaps, a marker at an end of a path, distractor paths,
and the label 1 when both markers sit on the two ends of one path. This is a small
re-implementation of that recipe for tests and CPU runs, not the authors' generator:

* a path is ``contour_length`` straight dashes of ``dash`` pixels with ``gap``-pixel gaps,
  its direction turning by a Gaussian angle (``turn`` radians) at every dash;
* every image has two paths of ``contour_length`` dashes and ``distractors`` paths of
  ``contour_length // 3``; positive: both markers (``3×3`` squares) on the two ends of the
  first path; negative: one marker on an end of each of the two long paths;
* pixels of different paths keep a Chebyshev distance of at least ``separation`` (paths
  never touch or cross), and a path never comes back within 2 pixels of itself.

Files: ``imgs/<k>/sample_<i>.png`` (8-bit grayscale, 0 background, 255 ink; ``per_folder``
images a folder) and ``metadata/<k>.npy``, text lines ``imgs/<k> sample_<i>.png <i> <label>
<contour_length>`` as in the release (read by :func:`tasks.lra.images.pathfinder_index`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from src.engine.record import atomic

Pixels = list[tuple[int, int]]


@dataclass(frozen=True)
class PathfinderSpec:
    size: int = 32
    contour_length: int = 14
    distractors: int = 2
    dash: float = 2.0
    gap: float = 1.0
    turn: float = 0.5
    separation: int = 3
    margin: int = 1

    @property
    def difficulty(self) -> str:
        """The release's folder name for this contour length."""
        return "curv_baseline" if self.contour_length <= 6 else f"curv_contour_length_{self.contour_length}"


class _Canvas:
    """The pixels drawn so far, each tagged with the path that owns it (0: none)."""

    def __init__(self, spec: PathfinderSpec) -> None:
        self.spec = spec
        self.owner = np.zeros((spec.size, spec.size), dtype=np.int32)

    def free(self, pixels: Pixels, path: int) -> bool:
        """Whether ``pixels`` lie inside the margin and at ``separation`` from every other path."""
        s, r = self.spec, self.spec.separation - 1
        for y, x in pixels:
            if not (s.margin <= y < s.size - s.margin and s.margin <= x < s.size - s.margin):
                return False
            window = self.owner[max(y - r, 0) : y + r + 1, max(x - r, 0) : x + r + 1]
            if ((window != 0) & (window != path)).any():
                return False
        return True

    def draw(self, pixels: Pixels, path: int) -> None:
        for y, x in pixels:
            self.owner[y, x] = path


def _dash_pixels(start: np.ndarray, angle: float, length: float) -> Pixels:
    """The pixels a straight dash from ``start`` (y, x) covers, in order."""
    direction = np.array([math.sin(angle), math.cos(angle)])
    points = start + np.linspace(0.0, length, int(length * 4) + 1)[:, None] * direction
    pixels: Pixels = []
    for y, x in np.rint(points).astype(int):
        if not pixels or pixels[-1] != (y, x):
            pixels.append((int(y), int(x)))
    return pixels


def _marker(center: tuple[int, int]) -> Pixels:
    y, x = center
    return [(y + dy, x + dx) for dy in (-1, 0, 1) for dx in (-1, 0, 1)]


def _try_path(
    rng: np.random.Generator,
    canvas: _Canvas,
    path: int,
    dashes: int,
    markers: tuple[bool, bool],
    tries: int = 10,
) -> Pixels | None:
    """One attempt at a path that fits the canvas; its pixels (markers included) or None.

    Each dash redraws its turn up to ``tries`` times until it fits.
    """
    s = canvas.spec
    pos = rng.uniform(s.margin + 1, s.size - s.margin - 2, size=2)
    angle = rng.uniform(0, 2 * math.pi)
    pixels: Pixels = []
    previous: Pixels = []
    for i in range(dashes):
        for _ in range(tries):
            turned = angle + rng.normal(0.0, s.turn) if i else angle
            start = pos + s.gap * np.array([math.sin(turned), math.cos(turned)]) if i else pos
            dash = _dash_pixels(start, turned, s.dash)
            older = [p for p in pixels if p not in previous]
            if canvas.free(dash, path) and not any(
                max(abs(y - oy), abs(x - ox)) < 2 for y, x in dash for oy, ox in older
            ):
                break
        else:
            return None  # no turn fits: the path runs into the border, another path or itself
        angle, pos = turned, start + s.dash * np.array([math.sin(turned), math.cos(turned)])
        pixels += [p for p in dash if p not in pixels]
        previous = dash
    ends = [pixels[0], pixels[-1]]
    if all(markers) and max(abs(ends[0][0] - ends[1][0]), abs(ends[0][1] - ends[1][1])) < 5:
        return None  # markers at both ends must stay apart
    for end, marked in zip(ends, markers, strict=True):
        if marked:
            pixels += [p for p in _marker(end) if p not in pixels]
    return pixels if canvas.free(pixels, path) else None


def draw_image(rng: np.random.Generator, spec: PathfinderSpec, label: int, attempts: int = 200) -> np.ndarray:
    """One ``(size, size)`` uint8 image of class ``label`` (1: markers on one path)."""
    for _ in range(attempts):
        canvas = _Canvas(spec)
        plan = [(spec.contour_length, (True, True) if label else (True, False))]
        plan.append((spec.contour_length, (False, False) if label else (True, False)))
        plan += [(max(spec.contour_length // 3, 1), (False, False))] * spec.distractors
        for path, (dashes, markers) in enumerate(plan, start=1):
            for _ in range(attempts):
                pixels = _try_path(rng, canvas, path, dashes, markers)
                if pixels is not None:
                    canvas.draw(pixels, path)
                    break
            else:
                break  # this path does not fit: start the image again
        else:
            return np.where(canvas.owner > 0, 255, 0).astype(np.uint8)
    raise RuntimeError(f"could not draw a Pathfinder image with {spec}; lower contour_length or distractors")


def write_release(
    root: Path, num_images: int, spec: PathfinderSpec, seed: int = 0, per_folder: int = 1000
) -> Path:
    """Write ``num_images`` (classes alternating) under ``root/pathfinder32/<difficulty>/``; its path."""
    from PIL import Image

    folder = Path(root) / f"pathfinder{spec.size}" / spec.difficulty
    (folder / "metadata").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    lines: dict[int, list[str]] = {}
    for i in range(num_images):
        label, k = i % 2, i // per_folder
        (folder / "imgs" / str(k)).mkdir(parents=True, exist_ok=True)
        Image.fromarray(draw_image(rng, spec, label)).save(folder / "imgs" / str(k) / f"sample_{i}.png")
        lines.setdefault(k, []).append(f"imgs/{k} sample_{i}.png {i} {label} {spec.contour_length}")
    for k, rows in lines.items():
        atomic.write_text(folder / "metadata" / f"{k}.npy", "\n".join(rows) + "\n")  # the index, whole
    return folder
