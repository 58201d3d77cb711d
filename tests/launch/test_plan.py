"""launch.plan: FLOPs against published figures and a closed form, the reference rows against their
papers' costs, Mask R-CNN's parts against closed forms, storage against a real checkpoint, the
sweep's grid against Hydra's, and the command line's table and refusals."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
import timm
import torch
from timm.models.vision_transformer import VisionTransformer

from launch import plan as planner
from launch.plan import (
    DEFAULT_MFU,
    GPUS,
    LAUNCH_S,
    REFERENCES,
    Row,
    checkpoint_bytes,
    derived_mfu,
    jobs,
    main,
    plan,
    reference_row,
    totals,
)
from launch.tools.flops import (
    count_flops,
    count_step,
    forward_backward,
    forward_flops,
    model_and_inputs,
    step_cost,
)
from src.configs import compose
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


def test_one_pass_counts_what_torchs_flop_counter_and_a_kernel_counter_count():
    """count_step's single dispatch mode against torch's FlopCounterMode with a counter of the
    non-view operations stacked inside it (the plan's two counters before they became one), on a
    ViT's forward and backward on meta: the same FLOPs and the same launches."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.flop_counter import FlopCounterMode

    class Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.n = getattr(self, "n", 0) + (not getattr(func, "is_view", False))
            return func(*args, **(kwargs or {}))

    def fresh():
        with torch.device("meta"):
            model = VisionTransformer(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=2)
        return model, (torch.zeros(1, 3, 32, 32, device="meta"),)

    with FlopCounterMode(display=False) as flops, Ops() as ops:
        forward_backward(*fresh())
    assert count_step(lambda: forward_backward(*fresh())) == (flops.get_total_flops(), ops.n) != (0, 0)


@pytest.mark.parametrize("name", ["swin_tiny_patch4_window7_224", "xcit_nano_12_p16_224"])
def test_the_remembered_meta_outputs_are_the_kernels_and_give_the_same_count(name, monkeypatch):
    """The counter answers a repeated meta call from the outputs' shapes, strides and dtypes it
    remembered (:func:`launch.tools.flops.computed`). On Swin (layer norm, cat, rolls, masks) and
    XCiT (batch norm, convolutions, in-place ops): every remembered answer has the metadata the
    kernel gives, most calls of a second pass are answered so, and the count is the uncached one."""
    from launch.tools import flops

    def fresh():
        with torch.device("meta"):
            model = timm.create_model(name, img_size=64, num_classes=10)
        return model.train(), (torch.zeros(1, 3, 64, 64, device="meta"),)

    monkeypatch.setattr(flops, "_SHAPES", {})
    uncached = flops.count_step(lambda: forward_backward(*fresh()))
    assert flops._SHAPES  # the first pass remembers
    answered, kept = 0, 0  # calls answered from memory, calls that may be (no view, no in-place)
    remembered = flops.computed

    def both(func, args, kwargs):
        nonlocal answered, kept
        key = flops.call_key(func, args, kwargs)
        out = remembered(func, args, kwargs)
        kept += key is not None
        if key is not None and flops._SHAPES.get(key) is not None:
            answered += 1
            assert flops.out_spec(func(*args, **kwargs)) == flops.out_spec(out), func
        return out

    monkeypatch.setattr(flops, "computed", both)
    assert flops.count_step(lambda: forward_backward(*fresh())) == uncached
    assert answered > 0.9 * kept > 0, (answered, kept)
    monkeypatch.setattr(flops, "call_key", lambda *_: None)  # no memory at all
    assert flops.count_step(lambda: forward_backward(*fresh())) == uncached


def test_a_planned_backbone_is_built_once_and_each_caller_gets_its_own_copy():
    """The meta model a plan builds for one backbone is copied for each variant: applying one
    leaves the next untouched, and the counts are those of a fresh process's order."""
    cfgs = {v: compose([f"attn={v}"]) for v in ("standard", "precond")}
    before = step_cost(cfgs["standard"])
    assert step_cost(cfgs["precond"]) != before
    assert step_cost(cfgs["standard"]) == before
    from src.engine import task

    first, _, _ = model_and_inputs(cfgs["standard"])
    built = dict(task._PLANNED)
    second, _, _ = model_and_inputs(cfgs["standard"])
    assert task._PLANNED == built and built  # the second caller's model is a copy: none built
    assert first is not second and next(first.parameters()) is not next(second.parameters())


def test_a_variant_that_only_initializes_shares_the_backbones_count():
    """cond_init and mimetic write weights once, at init (on meta: nothing): a step computes what
    standard's does, so the plan counts it once for the three; each counted alone agrees."""
    cfgs = {v: compose([f"attn={v}"]) for v in ("standard", "cond_init", "mimetic", "precond")}
    keys = {v: planner.step_key(cfg) for v, cfg in cfgs.items()}
    assert keys["cond_init"] == keys["mimetic"] == keys["standard"] != keys["precond"]
    assert step_cost(cfgs["cond_init"]) == step_cost(cfgs["mimetic"]) == step_cost(cfgs["standard"])


GOLDEN = ROOT / "tests/launch/golden/plan_imagenet.txt"  # the ImageNet plan as main printed it at 62cfa6b


def test_the_imagenet_rows_are_the_ones_printed_before_the_speed_up(capsys):
    """ViT-B's six rows of ``launch.plan experiment=paper/imagenet`` (the full table: the slow test
    below) are, character for character, those the plan printed before it counted each distinct
    step once and in one pass."""
    assert main(["experiment=paper/imagenet", "backbone=vit_base"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| imagenet |")]
    golden = [line for line in GOLDEN.read_text().splitlines() if line.startswith("| imagenet | vit_base |")]
    assert len(rows) == 6 and rows == golden


@pytest.mark.slow
def test_the_imagenet_table_is_the_one_printed_before_the_speed_up():
    done = subprocess.run(
        [sys.executable, "-m", "launch.plan", "experiment=paper/imagenet"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0 and done.stdout == GOLDEN.read_text()


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


def test_steps_hours_and_a_measured_step_time():
    """ImageNet's 300 epochs of 1,281,167 images at 1,024 an update; GPU-hours from the MFU and the
    launches (8 micro-batches a step on its 8 GPUs), or from a measured step time where one is
    given: the suite's loop before a bare step."""
    args = ["experiment=paper/imagenet", "backbone=vit_base", "attn=standard,spectral"]
    costs: dict = {}  # each distinct model counted once for the calls below
    rows = plan(args, gpu="A100-SXM", mfu=0.5, costs=costs)
    assert [r.steps for r in rows] == [300 * math.ceil(1_281_167 / 1024)] * 2
    (row, _) = rows
    assert row.source == "MFU" and row.gpu_hours == pytest.approx(
        row.steps * (row.flops_per_step / 156e12 + row.launches_per_step * LAUNCH_S) / 3600
    )
    assert row.flops_per_step == pytest.approx(1024 * 3 * 2 * 17.6e9, rel=0.05)  # backward ≈ 2 × forward
    kernels = costs[planner.step_key(compose([*args[:2], "attn=standard"]))][2]
    assert row.launches_per_step == 8 * kernels  # 8 processes × 1 micro-batch of 128
    bare = {"seconds_per_step": {"vit_base/spectral": 0.5}}
    timed = plan(args, measured=bare, costs=costs)
    assert [r.source for r in timed] == ["MFU", "step"]
    assert timed[1].gpu_hours == pytest.approx(row.steps * 0.5 / 3600)
    looped = plan(args, measured={**bare, "loop_samples_per_s": {"vit_base/spectral": 2048.0}}, costs=costs)
    assert looped[1].source == "loop" and looped[1].gpu_hours == pytest.approx(row.steps * 0.5 / 3600)
    one = [*args[:2], "attn=standard"]
    slow = plan(one, measured={"launch": {"seconds_per_op": 10 * LAUNCH_S}}, costs=costs)
    extra = row.steps * row.launches_per_step * 9 * LAUNCH_S / 3600  # the measured launch cost replaces 20 µs
    assert slow[0].gpu_hours - plan(one, costs=costs)[0].gpu_hours == pytest.approx(extra)


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
    cfg = compose(["experiment=paper/glue", "task=mlm", "attn=standard", "seed=0"])
    _, flops, _, _ = step_cost(cfg)
    model, x, _ = model_and_inputs(cfg)
    full = count_flops(model.model, x, backward=True)  # the decoder on every position
    n, dim, vocab = cfg.task.seq_len, cfg.backbone.model.dim, cfg.task.vocab_size
    masked = round(cfg.task.mask_prob * n)
    assert full - flops == pytest.approx(3 * 2 * dim * vocab * (n - masked), rel=0.01)


@pytest.mark.parametrize("ref", REFERENCES, ids=lambda r: r.name)
def test_a_reference_row_costs_what_its_paper_states_on_its_gpu(ref):
    """DeiT-B's 300 epochs on V100s (424 GPU-hours) and Cramming's day on an A6000: the plan's own
    row for each, priced on that GPU's dense peak at the default MFU, within 1.5× of the paper."""
    row = reference_row(ref)
    assert row.source == "MFU" and ref.gpu in ("V100", "A6000")
    assert row.gpu_hours == pytest.approx(
        row.steps
        * (row.flops_per_step / (GPUS[ref.gpu][0] * DEFAULT_MFU) + row.launches_per_step * LAUNCH_S)
        / 3600
    )
    assert 1 / 1.5 <= row.gpu_hours / ref.hours <= 1.5


def test_the_default_mfu_is_what_the_reference_rows_imply():
    """DEFAULT_MFU is the geometric mean of the MFUs at which each reference row costs exactly its
    paper's GPU-hours (within 2%: a change of recipe or counting moves it, and this says so)."""
    assert DEFAULT_MFU == pytest.approx(derived_mfu(), rel=0.02)
    assert 0.1 < DEFAULT_MFU < 0.4  # a GPU's training MFU, not PaLM's 46%


def test_a_launch_bound_step_is_priced_by_its_launches_not_a_floor():
    """LRA's Nyströmformer (0.4M parameters): its step at the MFU is well under a millisecond, so
    its hours are its launches' (each ``LAUNCH_S``), and say so; ViT-B's are its FLOPs'."""
    lra, costs = ["experiment=paper/lra", "task=lra_text", "attn=standard", "seed=0"], {}
    (row,) = plan(lra, costs=costs)
    (big,) = plan(["experiment=paper/imagenet", "backbone=vit_base", "attn=standard", "seed=0"])
    launches = row.steps * row.launches_per_step * LAUNCH_S / 3600
    assert row.gpu_hours > launches > 0.9 * row.gpu_hours and "launch-bound" in row.note
    (twice,) = plan(lra, launch_s=2 * LAUNCH_S, costs=costs)
    assert twice.gpu_hours == pytest.approx(row.gpu_hours + launches)
    assert (
        "launch-bound" not in big.note
        and big.steps * big.launches_per_step * LAUNCH_S / 3600 < 0.1 * big.gpu_hours
    )


def test_mask_rcnn_counts_its_fpn_and_heads():
    """COCO's step is Mask R-CNN's whole: the FPN's convolutions over the backbone's four levels,
    and the box head on the sampler's 512 RoIs and the mask head on its 128 positives, each
    forward + backward (3 × the forward: their inputs carry a gradient), in closed form."""
    import torch

    cfg = compose(["experiment=paper/coco", "backbone=xcit_micro_det", "attn=standard", "seed=0"])
    step, (x,), note = model_and_inputs(cfg)
    model, width = step.model, 256
    assert note == "" and x.shape[-2:] == (640, 864)  # 640 × 480 at the mean multi-scale side 640

    def fwd_bwd(fn):
        return count_step(lambda: fn().float().sum().backward())[0]

    backbone = fwd_bwd(lambda: sum(f.sum() for f in model.backbone(x)))
    with_fpn = fwd_bwd(lambda: sum(f.sum() for f in model.extract_feat(x)))
    sides = [(640 // s, 864 // s) for s in (4, 8, 16, 32)]
    channels = model.neck.in_channels
    fpn = sum(
        2 * c * width * h * w + 2 * width * width * 9 * h * w
        for c, (h, w) in zip(channels, sides, strict=True)
    )
    assert with_fpn - backbone == pytest.approx(3 * fpn, rel=0.02)

    whole = fwd_bwd(lambda: step(x))
    rpn = fwd_bwd(lambda: sum(o.sum() for outs in model.rpn_head(model.extract_feat(x)) for o in outs))
    box = 2 * (width * 49 * 1024 + 1024 * 1024 + 1024 * 81 + 1024 * 320)
    mask = 4 * 2 * width * width * 9 * 14 * 14 + 2 * width * width * 4 * 14 * 14 + 2 * width * 80 * 28 * 28
    assert whole - rpn == pytest.approx(3 * (512 * box + 128 * mask), rel=0.02)
    assert torch.device(next(step.parameters()).device).type == "meta"


def test_totals_sum_the_tables():
    """--all's last table: each table's runs and GPU-hours, and their sum."""
    rows = [
        Row("a", "b", "c", 3, 1, 1.0, 10, 1, 1.0, gpu_hours=2.0),
        Row("a", "b", "d", 2, 1, 1.0, 10, 1, 1.0),
    ]
    out = totals([("ImageNet", rows[:1]), ("LRA", rows)], gpus=4, gpu="H100-SXM")
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in out.splitlines()[2:]]
    assert cells[0][:3] == ["ImageNet", "3", "6"] and cells[1][:3] == ["LRA", "5 (2 not counted)", "6"]
    assert cells[2][:3] == ["**all**", "8 (2 not counted)", "12"] and cells[2][4] == "0.125"


def test_all_plans_every_paper_table():
    """--all's tables are the paper experiments with a sweep of their own (P5's are a CPU's, the
    convergence table is ImageNet's runs), GLUE's pretraining among them."""
    tables = {overrides[0].split("/")[-1] for _, overrides in planner.TABLES}
    swept = {p.stem for p in (ROOT / "conf/experiment/paper").glob("*.yaml")} - {"convergence"}
    assert tables == {s for s in swept if not s.startswith("p5")}
    assert ("GLUE pretraining", ("experiment=paper/glue", "task=mlm", "seed=0")) in planner.TABLES


def test_help_names_the_gpus_and_the_mfus_source(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    out = capsys.readouterr().out
    assert done.value.code == 0 and "A100-SXM" in out and "--references" in out and str(DEFAULT_MFU) in out


def test_a_cpu_sized_sweep_gets_a_cpu_estimate_that_scales_with_steps_and_runs(capsys):
    """digits' runs take seconds on a core: the plan adds their CPU time (steps × (FLOPs at
    CPU_FLOP_S + launches at CPU_LAUNCH_S)), twice the steps and twice the runs four times it, and
    the sweep's wall time at the cores given; ImageNet's (the golden table) gets none."""
    costs: dict = {}
    (short_run,) = plan(["trainer.max_steps=100", "seed=0"], costs=costs)
    (long_runs,) = plan(["trainer.max_steps=200", "seed=0,1"], costs=costs)
    assert long_runs.runs == 2 and long_runs.cpu_seconds() == pytest.approx(2 * short_run.cpu_seconds())
    assert short_run.cpu_seconds() == pytest.approx(
        100
        * (short_run.flops_per_step / planner.CPU_FLOP_S + short_run.launches_per_step * planner.CPU_LAUNCH_S)
    )
    assert planner.cpu_sized([long_runs]) and not planner.cpu_sized(
        [Row("a", "b", "c", 1, 1, 1e15, 10**6, 1, 1.0)]  # a PFLOP a step, a million steps
    )
    total = planner.cpu_table([long_runs], cores=4).splitlines()[-1]
    each = long_runs.cpu_seconds()
    assert total.endswith(f"| {planner.minutes(2 * each)}: {planner.minutes(each)} at 2 cores |")

    assert main(["-m", "attn=standard,precond", "seed=0,1,2"]) == 0
    out = capsys.readouterr().out
    assert "On this machine's CPU" in out and f"{planner.CPU_FLOP_S / 1e9:g} GFLOP/s" in out
    assert "On this machine's CPU" not in GOLDEN.read_text()


def test_the_cpu_rate_is_what_the_suites_timed_runs_imply():
    """CPU_FLOP_S: the geometric mean of the rates at which the plan's rows for CPU_REFERENCES
    take their stated times; each reference within a factor 1.5 of its time at that rate."""
    costs: dict = {}
    assert planner.cpu_rate(costs) == pytest.approx(planner.CPU_FLOP_S, rel=0.02)
    for ref in planner.CPU_REFERENCES:
        (row,) = plan(list(ref.overrides), costs=costs)
        assert 1 / 1.5 < row.cpu_seconds() / ref.seconds < 1.5
