"""P5's clustering head as numbers: focus on the first k tokens, and the output grouped by the sum."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from src.models.sandbox import ClusteringHead, MultiHeadSandbox
from src.sandbox.clustering import clustering_head, clustering_series, correlation_ratio
from src.sandbox.snapshot import snapshot_path, take_snapshot
from src.sandbox.stages import emergence
from src.sandbox.statistics import run_statistics

K, L = 5, 12


def batch(n: int = 2048, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 2, (n, L), generator=torch.Generator().manual_seed(seed))


def hand_built(query: float) -> ClusteringHead:
    """P5's model set by hand: the first ``K`` positions point one way, the others the other, the
    tokens are ±1 across; the query ``(query, 0)`` looks at the first ``K`` (0: uniform attention)."""
    model = ClusteringHead(2, L)
    with torch.no_grad():
        model.token_emb.weight.copy_(torch.tensor([[0.0, -1.0], [0.0, 1.0]]))
        model.pos_emb.copy_(torch.tensor([[3.0, 0.0]] * K + [[-3.0, 0.0]] * (L - K)))
        model.attn.query.weight.copy_(torch.tensor([[query, 0.0]]))
        model.attn.value.weight.copy_(torch.eye(2))
    return model


def test_a_head_on_the_first_k_tokens_clusters_by_the_partial_sum():
    found = clustering_head(hand_built(30.0), batch(), K)
    assert found["cluster/attn/focus/h0"] == pytest.approx(1.0, abs=1e-5)
    assert found["cluster/attn/clustering"] == pytest.approx(1.0, abs=1e-6)  # a point per partial sum


def test_a_uniform_head_neither_focuses_nor_clusters():
    found = clustering_head(hand_built(0.0), batch(), K)
    assert found["cluster/attn/focus/h0"] == pytest.approx(0.0, abs=1e-5)
    # its output counts the ones of all 12 tokens: the first 5 carry 5/12 of its variance
    assert found["cluster/attn/clustering"] == pytest.approx(K / L, abs=0.05)


def test_the_multi_head_query_token_is_not_counted_as_a_position():
    torch.manual_seed(0)
    model = MultiHeadSandbox(2, L, num_heads=2)
    with torch.no_grad():
        model.blocks[0].attn.qkv.weight.zero_()  # equal logits: every head uniform over 1 + L
    found = clustering_head(model, batch(256), K)
    # uniform over the query token and 12 positions: 5/13 on the first five, focus slightly below 0
    expected = (K / (L + 1) - K / L) / (1 - K / L)
    for h in (0, 1):
        assert found[f"cluster/block0/focus/h{h}"] == pytest.approx(expected, abs=1e-5)
    assert 0.0 <= found["cluster/block0/clustering"] <= 1.0


def test_the_correlation_ratio_is_one_for_a_function_of_the_group_and_near_zero_for_noise():
    groups = np.random.default_rng(0).integers(0, 6, 4000)
    assert correlation_ratio(np.stack([groups, -2 * groups], 1), groups) == pytest.approx(1.0)
    noise = np.random.default_rng(1).standard_normal((4000, 2))
    assert correlation_ratio(noise, groups) < 0.01
    assert correlation_ratio(np.ones((10, 2)), groups[:10]) == 0.0


def test_a_head_emerges_at_the_end_of_the_first_rise_of_its_clustering():
    steps = np.arange(0, 4001, 100.0)
    rng = np.random.default_rng(0)
    series = np.clip(0.4 + 0.6 * (steps - 1500) / 1000, 0.4, 1.0) + 0.01 * rng.standard_normal(len(steps))
    assert emergence(steps, series) == pytest.approx(2500, abs=200)
    assert emergence(steps, 0.4 + 0.01 * rng.standard_normal(len(steps))) is None  # never emerges


def test_the_series_is_read_back_from_the_snapshots_a_run_saved(tmp_path):
    x = batch(512)
    sums = x[:, :K].sum(1)
    for step, query in ((0, 0.0), (320, 30.0)):
        take_snapshot(hand_built(query), x, sums % 2, sums, K, step).save(snapshot_path(tmp_path, step))
    steps, series = clustering_series(tmp_path)
    assert steps == [0, 320]
    assert series["cluster/attn/focus/h0"] == pytest.approx([0.0, 1.0], abs=1e-5)
    low, high = series["cluster/attn/clustering"]
    assert low < 0.5 and high == pytest.approx(1.0, abs=1e-6)


def test_a_runs_statistics_come_from_its_metrics_and_snapshots(tmp_path):
    """A run whose head turns from uniform to focused at step 1000 while its accuracy leaves chance."""
    x = batch(256)
    sums = x[:, :K].sum(1)
    steps = list(range(0, 2001, 100))
    rows = []
    for step in steps:
        query = 0.0 if step < 1000 else 30.0
        take_snapshot(hand_built(query), x, sums % 2, sums, K, step).save(
            snapshot_path(tmp_path / "sandbox", step)
        )
        rows.append({"step": step, "split": "val", "val/acc": 0.5 if step < 1000 else 1.0})
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    found = run_statistics(tmp_path, test_size=2048)
    assert found["stages/first_plateau"] == 900 and found["stages/first_rise"] == 100
    assert found["stages/censored"] is False and found["stages/rises"] == 1
    assert found["cluster/attn/clustering"] == pytest.approx(1.0, abs=1e-6)
    assert found["cluster/attn/focus/h0"] == pytest.approx(1.0, abs=1e-5)
    assert found["cluster/attn/emerged"] == 1000  # the first snapshot of the clustered head
