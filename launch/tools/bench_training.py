"""The bench's measurements that train: the runner's overhead and time to quality.

``python -m launch.tools.bench`` (:mod:`launch.tools.bench`) times single steps of a model per variant; the
two measurements here run whole trainings through the suite instead (``src.engine.train``), so
they carry its configuration (Hydra's ``conf/``), its records and :mod:`launch.analysis.results`:

* :func:`runner_overhead`: the suite's loop against the plainest PyTorch loop on the same task,
  model, optimizer, schedule and batches, as a ratio of time per step;
* :func:`time_to_quality` (``--quality``): for embedded tasks, the steps each variant needs to
  reach ``standard``'s final validation loss (median over seeds), as a ratio to ``standard``'s.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from src import attention


def runner_overhead(args: argparse.Namespace, rounds: int = 3) -> dict[str, float]:
    """The suite's loop against a bare loop: same task, model, optimizer, schedule and batches."""
    from src.engine.record.files import read_metrics

    suite, bare = [], []
    for _ in range(rounds):
        with tempfile.TemporaryDirectory() as tmp:
            suite.append(suite_seconds_per_step(args, Path(tmp), read_metrics))
        bare.append(bare_seconds_per_step(args))
    return {
        "suite_ms": 1000 * statistics.median(suite),
        "bare_ms": 1000 * statistics.median(bare),
        "ratio": statistics.median(suite) / statistics.median(bare),
    }


def overhead_config(args: argparse.Namespace, output: Path):
    from src.configs import compose

    return compose(
        [
            "attn=standard",
            f"trainer.max_steps={args.overhead_steps}",
            "trainer.val_every=0",
            "trainer.monitor_every=0",
            f"trainer.checkpoint_every={10**9}",
            "trainer.progress=none",
            f"trainer.log_every={args.overhead_steps // 10}",
            "trainer.device=cpu",
            f"trainer.flush_denormal={bool(args.flush_denormal)}",  # as the bare loop runs
        ],
        output,
    )


def suite_seconds_per_step(args: argparse.Namespace, tmp: Path, read_metrics) -> float:
    """Seconds per step of the suite's loop, from its own windows (final validation excluded)."""
    from src.engine import train

    cfg = overhead_config(args, tmp)
    train(cfg, tmp / "run")
    rows = [r for r in read_metrics(tmp / "run") if r["split"] == "train"]
    seconds = sum(cfg.trainer.log_every * cfg.task.batch_size / r["throughput"] for r in rows)
    return seconds / args.overhead_steps


def bare_seconds_per_step(args: argparse.Namespace) -> float:
    """The same training, written as the plainest PyTorch loop."""
    from torch.utils.data import DataLoader

    from src.engine.loop.optim import build_optimizer, build_scheduler
    from src.engine.loop.prepared import prepared

    with tempfile.TemporaryDirectory() as tmp:
        cfg = overhead_config(args, Path(tmp))
    task, (train_set, _), model = prepared(cfg)  # as the suite's loop builds them
    optimizer = build_optimizer(cfg.optim, model)
    scheduler = build_scheduler(cfg.sched, optimizer, args.overhead_steps, len(train_set) // task.batch_size)
    loader = DataLoader(train_set, batch_size=task.batch_size, shuffle=True, drop_last=True)
    batches, step = iter(loader), 0
    start = time.perf_counter()
    while step < args.overhead_steps:
        try:
            batch = next(batches)
        except StopIteration:
            batches = iter(loader)
            continue
        loss = task.train_loss(model, batch)
        loss.backward()
        if cfg.trainer.clip_grad:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.trainer.clip_grad)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        scheduler.step_update(step)
    return (time.perf_counter() - start) / args.overhead_steps


def time_to_quality(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Steps to ``standard``'s final validation loss, per task and variant (median over seeds)."""
    from launch.analysis.records import read_run
    from launch.analysis.results import convergence
    from src.configs import compose
    from src.engine import train

    rows = []
    for task in args.quality:
        runs = []
        for variant in attention.VARIANTS:
            for seed in range(args.seeds):
                folder = args.quality_dir / task / variant / f"seed={seed}"
                extra = [f"trainer.max_steps={args.quality_steps}"] if args.quality_steps else []
                cfg = compose(
                    [
                        f"task={task}",
                        f"attn={variant}",
                        f"seed={seed}",
                        "trainer.progress=none",
                        "trainer.monitor_every=0",
                        *extra,
                    ]
                )
                if variant not in cfg.backbone.get("attn_variants", attention.VARIANTS):
                    break  # the task's backbone does not take it (modadd's sandbox: three variants)
                if cfg.trainer.max_steps:  # 20 validations a run: steps to quality within 5% of the budget
                    cfg.trainer.val_every = max(1, cfg.trainer.max_steps // 20)
                if not (folder / "summary.json").exists():
                    train(cfg, folder)
                runs.append(read_run(folder))
        rows += [
            {
                "task": c.task,
                "variant": c.attn,
                "steps": c.steps,
                "ratio": c.ratio,
                "reached": c.reached,
                "seeds": c.seeds,
            }
            for c in convergence(runs, metric="val/loss")
        ]
    return rows
