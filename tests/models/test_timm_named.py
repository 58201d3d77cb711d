"""A timm model by name (``backbone=timm backbone.name=…``): built by timm, labelled by the name in
the run's folder, W&B and the report; the refusals of a name that is no option, of a name timm does
not know and of a model whose attention no variant knows, each in one line."""

from __future__ import annotations

import json

import pytest
import timm
import torch
from conftest import compose, run_cli

from launch.analysis.records import read_run
from src import attention, cli
from src.attention.timm_families import FAMILIES, nearest_supported, supported_timm_models
from src.engine.record.tracking import run_tags
from src.errors import ConfigError
from src.models.timm_named import create

NAME = "vit_tiny_patch16_224"
#: A tiny vit_tiny_patch16_224 for the digits (8×8, one channel): its own patch and depth.
TINY = ["backbone=timm", f"backbone.name={NAME}", "+backbone.model.patch_size=2", "+backbone.model.depth=1"]


def test_the_name_builds_that_timm_model_with_the_tasks_shape():
    model = create(NAME, num_classes=10, img_size=8, in_chans=1, patch_size=2, depth=1)
    assert model.pretrained_cfg["architecture"] == NAME
    assert model.patch_embed.img_size == (8, 8) and model.patch_embed.proj.in_channels == 1
    assert model(torch.zeros(2, 1, 8, 8)).shape == (2, 10)
    # a model that takes no img_size (ConvNeXt) is built without one
    assert create("convnext_atto", num_classes=3, img_size=32, in_chans=1)(
        torch.zeros(1, 1, 32, 32)
    ).shape == (1, 3)


def test_a_name_timm_does_not_know_is_one_line_with_the_closest():
    with pytest.raises(ConfigError) as error:
        create("vit_tiny_patch16_22", num_classes=10)
    message = str(error.value)
    assert "backbone.name=vit_tiny_patch16_22: no such model in timm's registry" in message
    assert "did you mean vit_tiny_patch16_224" in message and "\n" not in message


def test_backbone_equals_a_timm_name_points_at_backbone_timm():
    with pytest.raises(ConfigError) as error:
        cli.prepare_argv([f"backbone={NAME}", "trainer.max_steps=2"])
    assert str(error.value) == (
        f"backbone={NAME}: no such option in conf/backbone, but a timm model: "
        f"backbone=timm backbone.name={NAME}"
    )
    with pytest.raises(ConfigError, match="did you mean vit_micro"):  # a typo of an option stays one
        cli.prepare_argv(["backbone=vit_micr"])


def test_backbone_timm_without_a_name_is_refused_in_one_line():
    from src.precheck import precheck

    with pytest.raises(ConfigError) as error:
        precheck(["backbone=timm"])
    assert str(error.value).startswith(
        "backbone.name is not set: backbone=timm builds a timm model by its name"
    )
    with pytest.raises(ConfigError, match="no such model in timm's registry"):
        precheck(["backbone=timm", "backbone.name=vit_tiny_patch16_22"])


def test_the_name_labels_the_wandb_run(tmp_path):
    cfg = compose([*TINY, "logger=wandb"], tmp_path)
    assert cfg.backbone.model.name == NAME
    assert cfg.logger.group == f"digits/{NAME}" and run_tags(cfg) == ["precond", "digits", NAME]


def test_a_timm_vit_by_name_trains_through_the_entry_point_labelled_by_its_name(tmp_path):
    result = run_cli(
        [*TINY, "trainer.max_steps=4", "trainer.val_every=2", "trainer.monitor_every=2"], cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (summary_file,) = (tmp_path / "outputs").glob("**/summary.json")
    run = summary_file.parent
    # the folder: runs/<task>/<the timm name>/<attn>/seed=0,<other overrides> (the name once)
    assert run.relative_to(tmp_path / "outputs").parts[:4] == ("runs", "digits", NAME, "precond")
    assert (
        run.name == "seed=0,+backbone.model.depth=1,+backbone.model.patch_size=2,trainer.max_steps=4,"
        "trainer.monitor_every=2,trainer.val_every=2"
    )
    summary = json.loads(summary_file.read_text())
    assert summary["backbone"] == NAME and summary["steps"] == 4 and summary["status"] == "completed"
    assert read_run(run).backbone == NAME  # what the report groups and labels by


# -- a model whose attention no variant knows ---------------------------------------------------------------


def test_a_model_without_supported_attention_names_each_class_once_and_the_nearest_model():
    model = timm.create_model("convnext_atto", pretrained=False, num_classes=3)
    with pytest.raises(attention.AttentionConfigError) as error:
        attention.apply(model, "standard")
    message = str(error.value)
    assert "\n" not in message and message.startswith(
        "no attention module the variants know in ConvNeXt (convnext_atto): supported are "
    )
    listed = message.split("supported are ")[1].split(", and any module")[0]
    names = [entry.split(" (")[0] for entry in listed.split("), ")]
    assert len(names) == len(set(names)) and "WindowAttention" in names and "EvaAttention" in names
    nearest = message.rpartition("the nearest supported timm model by name: ")[2]
    assert nearest == nearest_supported("convnext_atto") and nearest in supported_timm_models()
    with torch.device("meta"):  # the suggestion is one the variants apply to
        assert attention.find_sites(timm.create_model(nearest, pretrained=False))


@pytest.mark.parametrize("family", [f for f in FAMILIES.values() if f.timm_name])
def test_each_familys_timm_model_is_a_supported_name(family):
    assert family.timm_name in supported_timm_models()
    with torch.device("meta"):
        model = timm.create_model(family.timm_name, pretrained=False)
    assert attention.find_sites(model) and nearest_supported(family.timm_name) == family.timm_name


def test_the_names_the_families_claim_are_the_registrys():
    names = supported_timm_models()
    assert "eva02_tiny_patch14_224" in names and "beit_base_patch16_224" in names
    assert not [n for n in names if n.startswith(("convnext", "levit", "efficientformer", "swinv2"))]


def test_names_of_another_attention_class_are_not_claimed(monkeypatch):
    names = supported_timm_models()
    for other in ("vit_base_patch16_rope_224", "vit_relpos_base_patch16_224", "vit_pe_core_tiny_patch16_384"):
        assert other not in names
    # a name a later timm adds under a family's pattern, with another attention class: built on the
    # meta device before it is suggested, and passed over
    from src.attention import timm_families

    monkeypatch.setattr(
        timm_families, "supported_timm_models", lambda: ["vit_base_patch16_rope_224", "vit_base_patch16_224"]
    )
    assert nearest_supported("vit_base_patch16_rope_224") == "vit_base_patch16_224"
