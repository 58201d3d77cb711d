"""launch.plan: FLOPs against published figures and a closed form, storage against a real
checkpoint, the sweep's grid against Hydra's, and the command line's table and refusals."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
import timm
import torch
from timm.models.vision_transformer import VisionTransformer

from launch.plan import checkpoint_bytes, forward_flops, jobs, main, plan
from src.engine.record import checkpoint

ROOT = Path(__file__).resolve().parents[2]


def test_vit_base_forward_is_timms_17_6_gmacs():
    """timm's ViT-B/16 at 224 is 17.6 GMACs (its model card): 35.2 GFLOPs, a multiply-add as 2."""
    assert forward_flops("vit_base_patch16_224") == pytest.approx(2 * 17.6e9, rel=0.05)


def closed_form(model: VisionTransformer, img: int, patch: int, chans: int) -> float:
    """2·params·tokens for every block's weights (attention's and MLP's linears, norms), plus
    attention's 4·N²·D per layer (QKᵀ and AV), the patch embedding (2·C·p²·D per patch) and the head."""
    dim, patches = model.embed_dim, (img // patch) ** 2
    tokens = patches + model.num_prefix_tokens
    block_params = sum(p.numel() for p in model.blocks.parameters())
    head = 2 * dim * model.num_classes
    return (
        2 * block_params * tokens
        + len(model.blocks) * 4 * tokens**2 * dim
        + 2 * chans * patch**2 * dim * patches
        + head
    )


@pytest.mark.parametrize("img, patch, dim, depth, heads", [(64, 8, 192, 4, 3), (224, 16, 768, 12, 12)])
def test_vit_forward_matches_the_closed_form(img, patch, dim, depth, heads):
    with torch.device("meta"):
        model = VisionTransformer(img_size=img, patch_size=patch, embed_dim=dim, depth=depth, num_heads=heads)
    assert forward_flops(model, img_size=img) == pytest.approx(closed_form(model, img, patch, 3), rel=0.05)


def test_a_built_model_counts_as_its_timm_name():
    with torch.device("meta"):
        model = timm.create_model("vit_small_patch16_224", pretrained=False)
    assert forward_flops(model) == forward_flops("vit_small_patch16_224")


def test_storage_is_what_the_suites_checkpoint_code_writes(tmp_path):
    """last.pt (twice: its previous.pt) and best.pt as the trainer writes them, for a model of
    1.3M parameters after one AdamW step: within 10% of the estimate."""
    torch.manual_seed(0)
    model = VisionTransformer(img_size=32, patch_size=8, embed_dim=128, depth=6, num_heads=4, num_classes=10)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 3, 32, 32)).sum().backward()
    optimizer.step()
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    last = tmp_path / "last.pt"
    for _ in range(2):  # the second save rotates the first into previous.pt
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "ema": None}
        checkpoint.save({**state, "scheduler": scheduler.state_dict(), "rng": checkpoint.rng_state()}, last)
    checkpoint.save({"model": model.state_dict(), "ema": None, "step": 1}, last.with_name(checkpoint.BEST))
    written = sum(p.stat().st_size for p in tmp_path.iterdir())
    assert {p.name for p in tmp_path.iterdir()} == {"last.pt", checkpoint.PREVIOUS, checkpoint.BEST}
    params = sum(p.numel() for p in model.parameters())
    assert written == pytest.approx(checkpoint_bytes(params), rel=0.10)


def test_the_grid_is_hydras_with_seeds_folded():
    """experiment=paper/imagenet: 4 backbones (DeiT-B's row is ViT-B's runs) × 6 variants, each over
    3 seeds (72 runs)."""
    grid = jobs(["experiment=paper/imagenet"])
    assert len(grid) == 24 and {seeds for _, seeds in grid} == {3}
    assert len({frozenset(overrides) for overrides, _ in grid}) == 24


def test_steps_hours_and_a_measured_step_time(tmp_path):
    """ImageNet's 300 epochs of 1,281,167 images at 1,024 an update; GPU-hours from the MFU, or
    from a measured step time where one is given."""
    args = ["experiment=paper/imagenet", "backbone=vit_base", "attn=standard,spectral"]
    rows = plan(args, gpu="A100-SXM", mfu=0.5)
    assert [r.steps for r in rows] == [300 * math.ceil(1_281_167 / 1024)] * 2
    (row, _) = rows
    assert row.source == "MFU" and row.gpu_hours == pytest.approx(
        row.flops_per_step * row.steps / 156e12 / 3600
    )
    assert row.flops_per_step == pytest.approx(1024 * 3 * 2 * 17.6e9, rel=0.05)  # backward ≈ 2 × forward
    timed = plan(args, measured={"seconds_per_step": {"vit_base/spectral": 0.5}})
    assert [r.source for r in timed] == ["MFU", "measured"]
    assert timed[1].gpu_hours == pytest.approx(row.steps * 0.5 / 3600)


def test_the_command_prints_a_table_with_gpu_hours_and_totals(capsys):
    assert (
        main(
            ["-m", "experiment=paper/imagenet", "backbone=vit_base", "attn=standard,spectral", "--gpus", "6"]
        )
        == 0
    )
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("|")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]
    hours = head.index("GPU-h")
    assert cells[-1][0] == "**total**" and cells[-1][head.index("runs")] == "6"
    total = sum(float(row[hours].replace(",", "")) for row in cells[:-1])
    assert float(cells[-1][hours].replace(",", "")) == pytest.approx(total, abs=0.1)
    assert cells[-1][head.index("wall h/run")] == f"{total / 6:,.1f} at 6 GPUs"


@pytest.mark.parametrize(
    "argv, says",
    [
        (["experiment=paper/imagenet", "trainer.max_step=3"], "did you mean trainer.max_steps"),
        (["experiment=paper/nope"], "no such option"),
        (["experiment=paper/imagenet", "--gpu", "B200"], "--gpu B200"),
    ],
)
def test_bad_input_is_one_error_line_and_exit_2(argv, says):
    done = subprocess.run(
        [sys.executable, "-m", "launch.plan", *argv], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 2 and done.stdout == ""
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("error: ") and says in line


def test_a_measured_file_that_is_not_json_is_refused(tmp_path, capsys):
    bad = tmp_path / "gpu_check.json"
    bad.write_text("{not json")
    assert main(["experiment=paper/imagenet", "--measured", str(bad)]) == 2
    assert capsys.readouterr().err.startswith("error: ")


def test_masked_lm_decodes_only_the_masked_positions():
    """Crammed BERT's pretraining step: the tied decoder (D × V) runs on mask_prob of the 128
    positions, as tasks/mlm/task.py's masked_logits does; forward and backward are 3 × its forward."""
    from launch.plan import compose, count_flops, model_and_inputs, step_cost

    cfg = compose(["experiment=paper/glue", "task=mlm", "attn=standard", "seed=0"])
    _, flops, _ = step_cost(cfg)
    model, x, _ = model_and_inputs(cfg)
    full = count_flops(model.model, x, backward=True)  # the decoder on every position
    n, dim, vocab = cfg.task.seq_len, cfg.backbone.model.dim, cfg.task.vocab_size
    masked = round(cfg.task.mask_prob * n)
    assert full - flops == pytest.approx(3 * 2 * dim * vocab * (n - masked), rel=0.01)


def test_a_step_too_small_to_fill_a_gpu_says_its_hours_are_a_floor():
    """LRA's Nyströmformer (0.4M parameters): a step at the MFU is under a millisecond."""
    (row,) = plan(["experiment=paper/lra", "task=lra_text", "attn=standard", "seed=0"])
    (big,) = plan(["experiment=paper/imagenet", "backbone=vit_base", "attn=standard", "seed=0"])
    assert "the hours a floor" in row.note and "floor" not in big.note


def test_help_names_the_gpus_and_the_mfus_source(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    out = capsys.readouterr().out
    assert done.value.code == 0 and "A100-SXM" in out and "PaLM's 46.2%" in out
