"""Snapshot, frame, page and GIF of a run: what the ``modadd`` task calls at each validation,
and :func:`redraw` to draw them again from the saved snapshots."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from src.engine.record.files import read_metrics
from src.engine.record.safe_config import as_data

from .frames import render_frame
from .page import write_gif, write_page
from .snapshot import Snapshot, snapshot_path, snapshot_steps


def frame_path(sandbox_dir: Path, step: int) -> Path:
    return sandbox_dir / "frames" / f"step_{step:07d}.png"


def recorded_config(run_dir: Path) -> dict[str, Any] | None:
    """The run's ``config.yaml`` as data (None: it has none): read unresolved, its node
    interpolations followed and any resolver call (``${oc.env:…}``) kept as text, since the folder
    may be someone else's (:func:`src.engine.record.safe_config.as_data`)."""
    path = Path(run_dir) / "config.yaml"
    if not path.exists():
        return None
    tree = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    return as_data(tree) if isinstance(tree, dict) else {}


def run_title(run_dir: Path) -> str:
    """``modadd · sandbox · attn=standard · seed=0`` from the run's ``config.yaml``."""
    cfg = recorded_config(run_dir)
    if cfg is None:
        return Path(run_dir).name
    task, backbone, attn = cfg["task"]["name"], cfg["backbone"]["name"], cfg["attn"]["variant"]
    return f"{task} · {backbone} · attn={attn} · seed={cfg['seed']}"


def test_size(run_dir: Path) -> int | None:
    """The run's ``task.test_size`` from its ``config.yaml``: the noise floor of its stages."""
    cfg = recorded_config(run_dir)
    return int(cfg["task"]["test_size"]) if cfg is not None else None


def planned_steps(run_dir: Path) -> int | None:
    """The run's total steps from its ``config.yaml`` (one process), for a fixed x axis."""
    cfg = recorded_config(run_dir)
    if cfg is None:
        return None
    trainer, task = cfg["trainer"], cfg["task"]
    if trainer.get("max_steps"):
        return int(trainer["max_steps"])
    per_epoch = max(1, int(task["train_size"]) // (int(task["batch_size"]) * int(trainer["accumulate"])))
    return int(trainer["max_epochs"]) * per_epoch if trainer.get("max_epochs") else None


def record_snapshot(snap: Snapshot, run_dir: Path, final: bool, options: dict[str, Any]) -> None:
    """Save ``snap``, draw its frame, rewrite the page (and the GIF when ``final``)."""
    sandbox_dir = Path(run_dir) / "sandbox"
    step = snap.step
    snap.save(snapshot_path(sandbox_dir, step))
    rows = [r for r in read_metrics(run_dir) if r["step"] <= step]
    title = run_title(run_dir)
    render_frame(
        snap,
        rows,
        frame_path(sandbox_dir, step),
        title,
        planned_steps(run_dir),
        options["dpi"],
        test_size(run_dir),
    )
    frames = [
        f for s in snapshot_steps(sandbox_dir, up_to=step) if (f := frame_path(sandbox_dir, s)).exists()
    ]
    if final and options["gif"] and frames:
        write_gif(frames, sandbox_dir / "training.gif", options["gif_ms"])
    write_page(sandbox_dir, frames, title, rows)


def redraw(run_dir: Path, dpi: int = 64, gif_ms: int = 120) -> Path:
    """Redraw every frame, the GIF and the page of a run from its snapshots; returns the page."""
    run_dir = Path(run_dir)
    sandbox_dir = run_dir / "sandbox"
    rows, title, total = read_metrics(run_dir), run_title(run_dir), planned_steps(run_dir)
    size = test_size(run_dir)
    frames = []
    for step in snapshot_steps(sandbox_dir):
        snap = Snapshot.load(snapshot_path(sandbox_dir, step))
        frames.append(frame_path(sandbox_dir, step))
        render_frame(snap, [r for r in rows if r["step"] <= step], frames[-1], title, total, dpi, size)
    if frames:
        write_gif(frames, sandbox_dir / "training.gif", gif_ms)
    return write_page(sandbox_dir, frames, title, rows)
