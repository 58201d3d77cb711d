"""LRA runs: the rsqrt schedule of the LRA paper's recipes, and the embedded default end to end."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from conftest import compose, run_cli

from src.engine.loop.optim import build_scheduler
from src.engine.loop.schedule import RsqrtLRScheduler


def test_the_rsqrt_schedule_warms_up_linearly_then_decays_as_one_over_sqrt_t(tmp_path):
    cfg = compose(["experiment=lra/transformer_listops"], tmp_path)
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=cfg.optim.lr)
    scheduler = build_scheduler(cfg.sched, optimizer, total_steps=5000, steps_per_epoch=100)
    warmup, base = cfg.sched.warmup_steps, cfg.optim.lr
    lrs = {}
    for t in (0, warmup // 2, warmup, 4 * warmup):
        scheduler.step_update(t)
        lrs[t] = optimizer.param_groups[0]["lr"]
    peak = base / math.sqrt(warmup)
    assert (
        lrs[0] == 0.0 and lrs[warmup // 2] == pytest.approx(peak / 2) and lrs[warmup] == pytest.approx(peak)
    )
    assert lrs[4 * warmup] == pytest.approx(peak / 2)  # 1/sqrt(4) after the warm-up
    assert type(scheduler) is RsqrtLRScheduler  # the engine's, under the recorded `_target_` name


@pytest.mark.slow
@pytest.mark.minutes(3)
def test_the_small_listops_default_beats_twice_chance(tmp_path):
    """README: ``python -m src.run task=lra_listops_small`` generates its data, then trains."""
    result = run_cli(
        ["task=lra_listops_small"], cwd=tmp_path, env={"DATA_DIR": str(tmp_path / "data")}, timeout=1800
    )
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in (tmp_path / "data" / "listops_small").glob("*.tsv")) == [
        "basic_test.tsv",
        "basic_train.tsv",
        "basic_val.tsv",
    ]
    (summary,) = Path(tmp_path / "outputs").glob("runs/lra_listops_small/**/summary.json")
    final = json.loads(summary.read_text())["final"]
    assert final["val/acc"] >= 2 * (1 / 10), final
