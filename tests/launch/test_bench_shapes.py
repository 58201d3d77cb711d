"""The shapes section of the benchmark: its recipes match their configs, and its arithmetic (the
ratios, the per-sample scaling to the recipe's batch) holds on tiny models.

Timings themselves are never asserted (speed is measured by ``python -m launch.tools.bench --shapes``);
matrix-product FLOP counts are exact, so their scaling is.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from conftest import CONF
from omegaconf import OmegaConf

from launch.tools import bench, bench_shapes
from launch.tools.bench_shapes import RECIPES, Recipe


def config(path: str) -> dict:
    return OmegaConf.to_container(OmegaConf.load(CONF / f"{path}.yaml"))


def task_of(recipe: Recipe) -> dict:
    """The task node a recipe's configs give (an experiment's overrides over its task file)."""
    first = recipe.configs[0]
    if first.startswith("task/"):
        return config(first)["task"]
    experiment = config(first)
    name = next(d["override /task"] for d in experiment["defaults"] if "override /task" in d)
    return {**config(f"task/{name}")["task"], **experiment.get("task", {})}


@pytest.mark.parametrize("name", list(RECIPES))
def test_each_recipe_has_its_configs_batch_and_length(name):
    recipe = RECIPES[name]
    task = task_of(recipe)
    assert recipe.batch == task["batch_size"]
    inputs = recipe.inputs(1)
    if "pad_length" in task:  # LRA: every sequence padded to it
        assert inputs[0].shape[1] == task["pad_length"]
        assert len(inputs) == (4 if name == "lra_retrieval" else 2)  # two towers
    elif "seq_len" in task:  # LM, MLM: measured tokens x length_scale = the recipe's
        assert inputs[0].shape[1] * recipe.length_scale == task["seq_len"]
    else:
        assert inputs[0].shape[-1] == task["img_size"]


@pytest.mark.parametrize("name", [n for n in RECIPES if RECIPES[n].configs[-1] == "backbone/nystromformer"])
def test_lra_recipes_build_the_papers_nystromformer(name):
    model = RECIPES[name].build()
    options = config("backbone/nystromformer")["model"]
    block = model.blocks[0]
    assert len(model.blocks) == options["depth"] and block.norm1.normalized_shape == (options["dim"],)
    assert (block.attn.num_heads, block.attn.head_dim) == (options["num_heads"], options["head_dim"])


def tiny_recipes() -> dict[str, Recipe]:
    """A tiny ViT (tokens 17×48) and a tiny GPT (a causal entry), each with a micro-batch of 8."""
    import timm

    from src.models.gpt import GPT

    vit = Recipe(
        lambda: timm.create_model("vit_tiny_patch16_224", img_size=64, embed_dim=48, depth=2, num_heads=3),
        lambda b: (torch.randn(b, 3, 64, 64),),
        8,
        (),
    )
    gpt = Recipe(
        lambda: GPT(97, 32, dim=32, depth=2, num_heads=2),
        lambda b: (torch.randint(0, 97, (b, 16)),),
        8,
        (),
        length_scale=2.0,
    )
    return {"vit": vit, "gpt": gpt}


def test_ratios_are_one_plus_the_correction_over_the_step_at_the_recipes_batch():
    out = bench_shapes.measure("vit", tiny_recipes()["vit"], b=2, repeats=1)
    assert out["tokens"] == "17×48" and set(out["forms"]) == {
        *bench_shapes.TOKEN_METHODS,
        *bench_shapes.SPECTRAL_METHODS,
    }
    for cost in out["forms"].values():
        assert cost["ratio"] == pytest.approx(1 + cost["ms"] / out["step_ms"])
        assert cost["gflop_ratio"] == pytest.approx(cost["gflop"] / out["step_gflop"])
    assert out["forms"]["cond_tokens"]["per"] == "sample" and out["forms"]["spectral_svd"]["per"] == "step"
    assert (
        out["forms"]["cond_tokens"]["gflop"] > out["forms"]["cond_tokens_svd"]["gflop"]
    )  # svd: products only


def test_per_sample_work_scales_with_the_recipes_batch_and_per_step_work_does_not():
    """Doubling the recipe's micro-batch doubles the step's and cond_tokens' GFLOP (exact counts),
    and leaves spectral's (the weights') and a causal model's vocabulary map's as they were."""
    recipes = tiny_recipes()
    for name, recipe in recipes.items():
        one = bench_shapes.measure(name, recipe, b=2, repeats=1)
        two = bench_shapes.measure(name, dataclasses.replace(recipe, batch=16), b=2, repeats=1)
        assert two["step_gflop"] == pytest.approx(2 * one["step_gflop"])
        per_sample = name == "vit"
        for form in one["forms"]:
            factor = 2 if per_sample and form.startswith("cond_tokens") else 1
            assert two["forms"][form]["gflop"] == pytest.approx(factor * one["forms"][form]["gflop"]), form
    gpt = bench_shapes.measure("gpt", recipes["gpt"], b=2, repeats=1)
    assert gpt["tokens"] == "table 97×32" and gpt["forms"]["cond_tokens"]["per"] == "step"


def test_the_shapes_table_judges_the_defaults_only():
    row = {"method": "m", "ms": 1.0, "gflop": 1.0, "gflop_ratio": 0.1, "per": "sample"}
    forms = {
        "cond_tokens": {**row, "ratio": 1.05},
        "cond_tokens_svd": {**row, "ratio": 3.0},
        "spectral_svd": {**row, "ratio": 1.2},
    }
    results = {"vit_base": {"tokens": "197×768", "batch": 128, "step_ms": 100.0, "forms": forms}}
    rows = [line.rstrip() for line in bench_shapes.table(results)[2:]]
    assert rows[0].split()[0] == "vit_base" and rows[0].endswith(" ok")
    assert not rows[1].endswith(("ok", "MISS")) and rows[2].endswith(" MISS")


def test_the_bench_writes_the_shapes_section(tmp_path, monkeypatch):
    monkeypatch.setattr(bench_shapes, "RECIPES", {"vit_base": tiny_recipes()["vit"]})
    out = tmp_path / "bench.json"
    argv = ["--forms", "standard", "--skip", "block", "model", "memory", "overhead"]
    assert bench.main([*argv, "--shapes", "--shape-repeats", "1", "--out", str(out)]) == 0
    shapes = json.loads(out.read_text())["shapes"]
    assert list(shapes) == ["vit_base"] and shapes["vit_base"]["batch"] == 8
    assert {"step_ms", "step_gflop", "forms", "tokens", "measured_batch"} <= set(shapes["vit_base"])
