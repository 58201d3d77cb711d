"""The GPU check's loop section: the suite's own loop, ``python -m src.run task=imagenet``, on
synthetic JPEGs it writes, with the recipe's DataLoader workers, read back from the run's record.

The images are real-size JPEGs (500 × 375, ImageNet's most common size, quality 90: about the
size and decode cost of ImageNet's) in the ImageFolder layout the task reads,
``<data>/imagenet/{train,val}/<class>/*.JPEG``. A few hundred distinct images are written and
hard-linked (a symlink where the file system has no hard links) until an epoch is longer than the
run, so the loop's DataLoader decodes and augments every sample as it would ImageNet's, without
an epoch boundary inside the timed steps. The images/s the trainer logs per window
(``throughput`` in ``metrics.jsonl``) are read after the first windows (worker start-up, cuDNN's
autotuning) and their median is the loop's rate.

Only overrides that every version of the loop has are used: the task, backbone, variant, paths,
``trainer.*`` step counts and intervals, ``task.batch_size`` (the recipe's micro-batch, one
accumulation: a step is one micro-batch, as in the bare step it is compared with).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]


def write_jpegs(data_dir: Path, distinct: int, files: int, size: tuple[int, int], classes: int = 8) -> int:
    """``distinct`` JPEGs of ``size`` (width, height) under ``data_dir/imagenet/train``, linked to
    ``files`` in all, and two per class under ``val``; returns the training files written.

    Each image is smooth structure (a gradient and a few discs, as photographs have) plus
    noise, so it compresses like a photograph rather than like noise or a flat colour."""
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(0)
    root = data_dir / "imagenet"
    width, height = size
    yy, xx = np.mgrid[0:height, 0:width]

    def image() -> Image.Image:
        channels = [(xx * rng.uniform(0.1, 0.5) + yy * rng.uniform(0.1, 0.5) + rng.uniform(0, 255)) % 256
                    for _ in range(3)]  # fmt: skip
        base = np.stack(channels, axis=-1)  # (H, W, 3)
        noisy = np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8)
        img = Image.fromarray(noisy)
        draw = ImageDraw.Draw(img)
        for _ in range(4):
            x, y, r = rng.integers(0, width), rng.integers(0, height), rng.integers(10, max(11, height // 3))
            draw.ellipse((x - r, y - r, x + r, y + r), fill=tuple(int(c) for c in rng.integers(0, 256, 3)))
        return img

    written: list[Path] = []
    for i in range(distinct):
        folder = root / "train" / f"n{i % classes:08d}"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"img_{i:06d}.JPEG"
        image().save(path, quality=90)
        written.append(path)
    for i in range(distinct, files):  # links: as many samples, decoded and augmented as many times
        source = written[i % distinct]
        link = source.parent.parent / f"n{i % classes:08d}" / f"link_{i:06d}.JPEG"
        try:
            os.link(source, link)
        except OSError:
            link.symlink_to(source)
    for c in range(classes):
        folder = root / "val" / f"n{c:08d}"
        folder.mkdir(parents=True, exist_ok=True)
        for j in range(2):
            image().save(folder / f"val_{j}.JPEG", quality=90)
    return files


def run_loop(
    data_dir: Path,
    out_dir: Path,
    shape: dict[str, Any],
    device: str,
    timeout_s: float,
) -> dict[str, Any]:
    """Train ``shape['loop_steps']`` steps of ``python -m src.run task=imagenet`` on ``data_dir``
    and read its images/s back: ``{"samples_per_s", "windows", "workers", "wall_s", "command"}``."""
    overrides = loop_overrides(data_dir, out_dir, shape, device)
    wall = run_training(overrides, timeout_s)
    return {
        **read_throughput(out_dir, shape["loop"]),
        "steps": shape["loop"]["steps"],
        "wall_s": round(wall, 1),
        "command": " ".join(["python -m src.run", *overrides]),
    }


def loop_overrides(data_dir: Path, out_dir: Path, shape: dict[str, Any], device: str) -> list[str]:
    """The run's overrides: ``shape``'s loop on ``data_dir``, logging its throughput, nothing else
    (no validation, monitor, checkpoints or progress bar)."""
    loop = shape["loop"]
    overrides = [
        "task=imagenet",
        f"backbone={shape['backbone']}",
        "attn=standard",
        *shape["overrides"],
        f"paths.data_dir={data_dir}",
        f"paths.output_dir={out_dir}",
        "trainer.accumulate=1",
        f"trainer.max_steps={loop['steps']}",
        f"trainer.log_every={loop['log_every']}",
        "trainer.val_every=0",
        "trainer.eval_batches=1",
        "trainer.monitor_every=0",
        "trainer.collapse_entropy=null",
        "trainer.checkpoints=false",
        f"trainer.checkpoint_every={10**9}",
        "trainer.progress=none",
        f"trainer.device={device}",
    ]
    if loop.get("workers") is not None:
        overrides.append(f"trainer.num_workers={loop['workers']}")
    return overrides


def run_training(overrides: list[str], timeout_s: float) -> float:
    """``python -m src.run <overrides>`` in its own process (this tree's ``src``); its wall seconds,
    or a RuntimeError with the last lines it wrote."""
    command = [sys.executable, "-m", "src.run", *overrides]
    paths = [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]  # this tree's src, as the caller's
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    start = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"src.run exited {done.returncode}: {' / '.join(tail)}"[:500])
    return wall


def read_throughput(out_dir: Path, loop: dict[str, Any]) -> dict[str, Any]:
    """The run's logged images/s: the median of its steady windows (the first ``skip_windows``
    left out), every window, the losses and the DataLoader workers it used."""
    from omegaconf import OmegaConf

    from src.engine.record.files import read_metrics

    (metrics,) = out_dir.rglob("metrics.jsonl")
    rows = [r for r in read_metrics(metrics.parent) if r.get("split") == "train"]
    rates = [float(r["throughput"]) for r in rows if r.get("throughput")]
    losses = [r.get("train/loss") for r in rows]
    steady = rates[loop["skip_windows"] :] or rates
    if not steady:
        raise RuntimeError(f"src.run logged no throughput in {metrics}")
    config = metrics.parent / "config.yaml"
    workers = OmegaConf.load(config).trainer.get("num_workers") if config.exists() else None
    return {
        "samples_per_s": statistics.median(steady),
        "windows": rates,
        "losses": losses,
        "workers": workers,
    }
