"""The benchmark's arithmetic on a tiny ViT: paired ratios, peak memory, the targets' verdicts.

Timings themselves are never asserted (speed is measured by ``make bench``, not by a test).
"""

from __future__ import annotations

import argparse

import pytest
import torch

from launch.tools import bench

TINY = ["--model", "vit_tiny_patch16_224", "--img", "32", "--batch", "2", "--repeats", "3", "--warmup", "1"]


def parse(**options) -> argparse.Namespace:
    """The bench's arguments for a tiny ViT, with ``options`` set."""
    defaults = dict(model="vit_tiny_patch16_224", device="cpu", dtype="fp32", batch=2, img=32, repeats=3)
    return argparse.Namespace(**{**defaults, "warmup": 1, **options})


def test_paired_ratios_put_standard_at_one_and_the_median_inside_its_quartiles():
    args = parse(forms=["standard", "cond_init", "spectral"])
    results = bench.time_forms("block", args)
    assert results["standard"]["ratio"] == results["standard"]["ratio_q1"] == 1.0
    for form in ("cond_init", "spectral"):
        r = results[form]
        assert r["ratio_q1"] <= r["ratio"] <= r["ratio_q3"] and r["ms"] > 0


def test_init_only_variants_use_the_same_memory_as_standard():
    args = parse(forms=["standard", "cond_init", "mimetic", "precond"])
    memory = bench.peak_memory(args)
    assert memory["cond_init"]["peak_mb"] == memory["standard"]["peak_mb"]  # same graph, same tensors
    assert memory["mimetic"]["peak_mb"] == memory["standard"]["peak_mb"]
    assert memory["cond_init"]["ratio"] == 1.0 and memory["precond"]["peak_mb"] > 0


def test_the_table_marks_each_target_met_or_missed():
    row = {"ms": 1.0, "ratio_q1": 1.0, "ratio_q3": 1.0}
    results = {
        "model": {
            "standard": {**row, "ratio": 1.0},
            "spectral": {**row, "ratio": 1.009},
            "cond_tokens_polar": {**row, "ratio": 1.2},
        }
    }
    lines = {line.split()[0]: line for line in bench.table(results).splitlines() if line.strip()}
    assert lines["spectral"].endswith("≤1.01 ok")
    assert lines["cond_tokens_polar"].endswith("≤1.10 MISS")
    assert "≤" not in lines["standard"]


def test_flush_denormal_is_the_cpu_default_and_can_be_turned_off(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(torch, "set_flush_denormal", lambda on: calls.append(on) or True)
    out = tmp_path / "bench.json"
    common = [*TINY, "--forms", "standard", "--skip", "block", "memory", "overhead", "--out", str(out)]
    assert bench.main(common) == 0 and calls == [True]
    assert bench.main([*common, "--no-flush-denormal"]) == 0 and calls == [True, False]
    assert '"flush_denormal": false' in out.read_text()


@pytest.mark.parametrize("form", list(bench.FORMS))
def test_every_form_builds_and_applies_its_variant(form):
    model, x = bench.build("block", form, parse())
    variant, _ = bench.FORMS[form]
    assert [v.name for v in model.attention_variants] == [variant]
    assert model(x).shape == x.shape
