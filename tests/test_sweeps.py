"""Every experiment file and every compatible task × backbone × attn composes and trains 2 steps
on tiny data in the real layout (see ``tests/smoke/``), except where the backbone is full-size
(``scale: full``), which a CPU cannot train in seconds. A full-size configuration instead

* builds and steps on torch's meta device, in the task's own configuration (ImageNet's 224 px and
  1000 classes, GPT-2's vocabulary, COCO's 1333 × 800): shapes without values, so a 537M-parameter
  model costs what a small one does. The model is built as training builds it, the variant applied,
  and takes one step: the loss, backward, the optimizer and the schedule
  (``test_full_size_combination_builds_and_steps_on_meta``);
* has the parameter count and the number of attention modules of the papers' model
  (``test_full_size_backbones_have_the_papers_sizes``);
* with ``mimetic``, whose initialisation needs the weights' values (it skips a meta weight),
  initialises the same architecture at reduced width (``test_mimetic_initialises_…``);
* trains one real step per family through ``train()``, on the family's tiny data: its paper
  experiment (``FULL_SIZE_STEP``; marked slow).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import json
import pkgutil
from pathlib import Path
from typing import Any

import pytest
import smoke
import torch
from conftest import CONF, compose
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from torch import Tensor, nn

from launch.tools.flops import MetaShapes
from src import attention
from src.engine import train
from src.engine.experiment import check_compatible, compatible_backbones
from src.engine.loop.optim import build_optimizer, build_scheduler
from src.engine.record.files import read_metrics
from src.engine.task import Task

TWO_STEPS = [
    "trainer.max_steps=2",
    "trainer.val_every=2",
    "trainer.monitor_every=2",
    "trainer.log_every=1",
    "trainer.checkpoint_every=2",
    "trainer.eval_batches=1",
]
ONE_STEP = [
    "trainer.max_steps=1",
    "trainer.val_every=1",
    "trainer.monitor_every=1",
    "trainer.log_every=1",
    "trainer.checkpoint_every=1",
    "trainer.eval_batches=1",
]
FAMILIES = [importlib.import_module(f"smoke.{m.name}") for m in pkgutil.iter_modules(smoke.__path__)]
SMOKE = {task: overrides for family in FAMILIES for task, overrides in family.OVERRIDES.items()}
FAMILY_OF = {task: family for family in FAMILIES for task in family.OVERRIDES}
# every task config, including one a family does not know (it trains as configured, on its own data)
TASKS = sorted(p.stem for p in (CONF / "task").glob("*.yaml"))
# where a family says so (``FULL_SIZE_STEPS_ON``), full-size backbones build and step on the meta
# device on some of its tasks and only compose on the others: {task that only composes: the others}
FULL_SIZE_STEPS_ON = {
    task: family.FULL_SIZE_STEPS_ON
    for family in FAMILIES
    if hasattr(family, "FULL_SIZE_STEPS_ON")
    for task in family.OVERRIDES
    if task not in family.FULL_SIZE_STEPS_ON
}
#: the experiment whose one real full-size step stands for each family's full-size backbones
FULL_SIZE_STEP = {family.FULL_SIZE_STEP: family for family in FAMILIES if hasattr(family, "FULL_SIZE_STEP")}
#: the papers' full-size models in their paper's task: parameters (exact, as built here; the
#: published rounded figure in the comment) and attention modules (blocks, XCiT's two
#: class-attention layers, DaViT's window and channel attention per block). GPT-2's sizes:
#: tests/models/test_gpt.py.
PAPER_SIZES = {
    ("imagenet", "vit_base"): (86_567_656, 12),  # ViT-B/16: 86.6M
    ("imagenet", "deit_base"): (86_567_656, 12),  # DeiT-B: 86.6M
    ("imagenet", "swin_base"): (87_768_224, 24),  # Swin-B: 88M, blocks 2, 2, 18, 2
    ("imagenet", "davit_base"): (87_954_408, 24),  # DaViT-B: 88M, blocks 1, 1, 9, 1
    ("imagenet", "xcit_medium"): (84_395_752, 26),  # XCiT-M24/16: 84M
    ("coco", "xcit_small_det"): (44_386_560, 12),  # Mask R-CNN XCiT-S12/16: 44M
    ("coco", "xcit_medium_det"): (101_152_240, 24),  # Mask R-CNN XCiT-M24/16: 101M
    ("coco", "swin_tiny_det"): (47_794_602, 12),  # Mask R-CNN Swin-T: 48M
    ("coco", "vit_base_det"): (108_898_992, 12),  # Mask R-CNN ViT-B, global attention
    ("mlm", "crammed_bert"): (119_589_889, 16),  # Crammed BERT, 32,768 tokens: 120M
}


def missing_modules(family) -> list[str]:
    """The modules a family's optional stack needs (its ``REQUIRES``) that are not installed."""
    return [m for m in getattr(family, "REQUIRES", []) if not installed(m)]


def installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # its parent package is missing
        return False


# a task whose family's optional extra is not installed is skipped, naming what is missing
SKIPS = {
    task: [pytest.mark.skip(reason=f"not installed: {', '.join(missing)}")] if missing else []
    for family in FAMILIES
    for missing in [missing_modules(family)]
    for task in family.OVERRIDES
}


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("data")
    for family in FAMILIES:
        family.prepare(root)
    return root


def kind_of(task: str, backbone: DictConfig) -> str:
    """How a combination is tested: ``trains`` two steps, ``meta`` (full size: built and stepped on
    the meta device) or ``composes`` (full size, on a task whose family steps it on another)."""
    if backbone.scale != "full":
        return "trains"
    if task in FULL_SIZE_STEPS_ON:
        return "composes"
    family = FAMILY_OF.get(task)
    return "meta" if hasattr(family, "synthetic_batch") else "trains"  # a family that cannot: trained


@functools.cache
def compatible_pairs() -> list[tuple[str, str, DictConfig]]:
    """Every compatible ``(task, backbone, backbone file)``: each task composed once, each backbone's
    file read as it is (what the marks need, ``scale`` and ``attn_variants``, are literal there and
    no task sets them); composing each pair would cost every test process half a minute to collect."""
    files = {path.stem: OmegaConf.load(path) for path in sorted((CONF / "backbone").glob("*.yaml"))}
    pairs = []
    for task in TASKS:
        task_cfg = compose([f"task={task}", *SMOKE.get(task, [])], Path("unused")).task
        pairs += [(task, backbone, files[backbone]) for backbone in compatible_backbones(task_cfg)]
    return pairs


def test_no_task_sets_what_the_marks_read_of_a_backbone_file():
    """:func:`compatible_pairs` reads ``scale`` and ``attn_variants`` from the backbone's own file:
    no task file sets either (an experiment may: its own tests compose it)."""
    for path in sorted((CONF / "task").glob("*.yaml")):
        backbone = OmegaConf.load(path).get("backbone") or {}
        assert not {"scale", "attn_variants"} & set(backbone), path


#: tasks whose every two-step combination runs with the slow tests: imagefolder reads its folder as
#: imagenet does (imagenet's combinations stay in the fast suite; tests/tasks/test_image_folder.py
#: trains imagefolder end to end there), so the fast suite keeps under its 10 minutes
SLOW_TRAINS = {"imagefolder"}


def combinations(kind: str = "trains"):
    """Every compatible task × backbone × variant that :func:`kind_of` gives ``kind``. Slow: those
    on the meta device (about a second each) and a full-size one a family cannot build there (it
    trains)."""
    for task, backbone, backbone_cfg in compatible_pairs():
        if kind_of(task, backbone_cfg) != kind:
            continue
        full = backbone_cfg.scale == "full" and kind != "composes"
        slow = [pytest.mark.slow] if full or (task in SLOW_TRAINS and kind == "trains") else []
        for variant in backbone_cfg.get("attn_variants") or attention.VARIANTS:  # those it takes
            marks = [*slow, *SKIPS.get(task, [])]
            yield pytest.param(task, backbone, variant, marks=marks, id=f"{task}-{backbone}-{variant}")


def smoke_overrides(task: str, data_dir: Path) -> list[str]:
    return [f"task={task}", *SMOKE.get(task, []), *TWO_STEPS, f"paths.data_dir={data_dir}"]


def check_record(summary: dict, run_dir: Path, steps: int = 2) -> None:
    assert json.loads((run_dir / "summary.json").read_text()) == json.loads(json.dumps(summary, default=str))
    assert (
        summary["steps"] == steps
        and summary["status"] == "completed"
        and summary["metric"] in summary["final"]
    )
    assert (run_dir / "checkpoints" / "last.pt").exists()
    rows = read_metrics(run_dir)
    assert {r["split"] for r in rows} == {"train", "val", "monitor"}


def drop_weights(run_dir: Path) -> None:
    """Delete a run's weight files, ours (``checkpoints/``) and mmengine's (``mmdet/iter_*.pth``),
    passed or failed: a full-size model's are gigabytes each, and the next run needs the disk.
    The config and metrics of a failed run stay for reading."""
    for path in [*run_dir.rglob("*.pt"), *run_dir.rglob("*.pth")]:
        path.unlink(missing_ok=True)


@pytest.mark.parametrize("task, backbone, variant", list(combinations()))
def test_combination_trains_two_steps(task, backbone, variant, data_dir, tmp_path):
    cfg = compose([*smoke_overrides(task, data_dir), f"backbone={backbone}", f"attn={variant}"], tmp_path)
    try:
        summary = train(cfg, tmp_path / "run")
        check_record(summary, tmp_path / "run")
        assert (summary["task"], summary["backbone"], summary["attn"]) == (cfg.task.name, backbone, variant)
        assert (
            cfg.task.name.partition("-")[0] == task
        )  # imagefolder-<folder name>, every other task its file's
    finally:
        drop_weights(tmp_path / "run")


@pytest.mark.parametrize("task, backbone, variant", list(combinations("composes")))
def test_full_size_combination_composes(task, backbone, variant, data_dir, tmp_path):
    """The full-size decoders on the hub LM tasks, Crammed BERT on GLUE: the config composes and
    passes the compatibility check, the variant builds with its options, and the same backbone and
    variant build and step on the family's embedded task
    (``test_full_size_combination_builds_and_steps_on_meta``)."""
    cfg = compose([*smoke_overrides(task, data_dir), f"backbone={backbone}", f"attn={variant}"], tmp_path)
    check_compatible(cfg)
    assert instantiate(cfg.attn).name == variant
    assert (cfg.task.name.partition("-")[0], cfg.backbone.name, cfg.backbone.scale) == (
        task,
        backbone,
        "full",
    )
    for other in FULL_SIZE_STEPS_ON[task]:
        assert backbone in compatible_backbones(compose([f"task={other}"], tmp_path).task)


# -- full size: the meta device, reduced width, one real step per family ------------------------


def build_as_trained(task: Task, cfg: DictConfig) -> nn.Module:
    """The model as training builds it, on the current default device: the family's way
    (detection: mmdet's Mask R-CNN, the variant applied by its backbone), else the shared loop's
    (``task.build_model``, the variant, ``task.prepare_model``)."""
    family = FAMILY_OF[cfg.task.name]
    if hasattr(family, "without_data"):
        family.without_data(task)
    if hasattr(family, "build_as_trained"):
        return family.build_as_trained(task, cfg)
    model = task.build_model(cfg.backbone)
    attention.apply(model, attention.variant_from_config(cfg.attn))
    task.prepare_model(model)
    return model


def take_step(task: Task, cfg: DictConfig, model: nn.Module) -> tuple[Tensor, Any, Any]:
    """One training step of ``model`` on a synthetic batch of the task's sizes, on the current
    default device: ``(loss, output, the output's expected shapes)``. Loss and backward always;
    the optimizer and schedule of the config where the shared loop trains (detection's Runner
    builds its own)."""
    family = FAMILY_OF[cfg.task.name]
    batch, expected = family.synthetic_batch(task)
    loss, output = (family.step if hasattr(family, "step") else smoke.train_step)(task, model, batch)
    loss.backward()
    if type(task).fit is Task.fit:  # the shared loop
        optimizer = build_optimizer(cfg.optim, model)
        steps = cfg.trainer.max_steps or cfg.trainer.max_epochs  # one step per epoch
        scheduler = build_scheduler(cfg.sched, optimizer, steps, 1)
        optimizer.step()
        scheduler.step_update(1)
    return loss, output, expected


def shapes(output: Tensor | tuple | list) -> tuple[int, ...] | list:
    """The shape of a tensor, or the shapes of a tuple or list of them."""
    return tuple(output.shape) if isinstance(output, Tensor) else [shapes(o) for o in output]


def applied_variants(model: nn.Module) -> list[str]:
    """The names of the variants applied to ``model`` (or to the submodule that holds them)."""
    holder = next(m for m in model.modules() if hasattr(m, "attention_variants"))
    return [v.name for v in holder.attention_variants]


def on_meta(overrides: list[str], tmp_path: Path) -> tuple[DictConfig, nn.Module, Tensor, Any, Any]:
    """The composed config, the model built from it on the meta device, and its step there."""
    cfg = compose(overrides, tmp_path)
    check_compatible(cfg)
    attention.config.complete(cfg.attn)  # as train() does
    task = instantiate(cfg.task)
    with torch.device("meta"), MetaShapes():  # a call seen before: its remembered output shapes
        model = build_as_trained(task, cfg)
        loss, output, expected = take_step(task, cfg, model)
    return cfg, model, loss, output, expected


@functools.cache
def standard_sizes(task: str, backbone: str) -> tuple[int, int]:
    """``(parameters, attention modules)`` of the full-size model with ``attn=standard`` in the
    task's own configuration, built on the meta device."""
    cfg = compose([f"task={task}", f"backbone={backbone}", "attn=standard"], Path("unused"))
    with torch.device("meta"):
        model = build_as_trained(instantiate(cfg.task), cfg)
    return sum(p.numel() for p in model.parameters()), len(attention.find_sites(model))


def check_meta_step(model: nn.Module, loss: Tensor, output: Any, expected: Any) -> None:
    """The step's loss is a scalar, the output has the task's shapes, and every parameter of every
    attention module received a gradient of its own shape (the variant's ``original`` included)."""
    assert loss.device.type == "meta" and loss.shape == () and loss.dtype.is_floating_point
    assert shapes(output) == expected
    sites = attention.find_sites(model)
    assert sites
    for site in sites:
        for name, p in site.module.named_parameters():
            if p.requires_grad:
                assert p.grad is not None and p.grad.shape == p.shape, f"{site.name}.{name}"


@pytest.mark.parametrize("task, backbone, variant", list(combinations("meta")))
def test_full_size_combination_builds_and_steps_on_meta(task, backbone, variant, tmp_path):
    """The task's own configuration (no smoke overrides) with the full-size backbone composes,
    builds on the meta device with the variant applied as training applies it, and takes one
    step there; the variant adds no parameter to the model (``standard``'s count). What needs
    values is proven elsewhere: ``mimetic``'s initialisation at reduced width, the data path
    by the tiny backbones, one real full-size step per family (``FULL_SIZE_STEP``)."""
    cfg, model, loss, output, expected = on_meta(
        [f"task={task}", f"backbone={backbone}", f"attn={variant}"], tmp_path
    )
    assert (cfg.task.name, cfg.backbone.name, cfg.backbone.scale) == (task, backbone, "full")
    assert applied_variants(model) == [variant]
    check_meta_step(model, loss, output, expected)
    assert sum(p.numel() for p in model.parameters()) == standard_sizes(task, backbone)[0]


@pytest.mark.parametrize(
    "task, backbone", [pytest.param(*pair, marks=SKIPS.get(pair[0], [])) for pair in PAPER_SIZES]
)
def test_full_size_backbones_have_the_papers_sizes(task, backbone):
    """Built on the meta device in the paper's task, each full-size model has the parameters and
    the attention modules of the papers' (``PAPER_SIZES``)."""
    parameters, modules = standard_sizes(task, backbone)
    assert (parameters, modules) == PAPER_SIZES[task, backbone], f"{parameters:,} parameters"


def reduced_width_cases():
    """Each full-size backbone that trains nowhere for real but in its family's one step, on the
    first task of its meta combinations."""
    seen = {}
    for param in combinations("meta"):
        task, backbone, _ = param.values
        seen.setdefault(backbone, pytest.param(task, backbone, marks=param.marks, id=backbone))
    return list(seen.values())


@pytest.mark.slow
@pytest.mark.parametrize("task, backbone", reduced_width_cases())
def test_mimetic_initialises_each_full_size_architecture_at_reduced_width(task, backbone, tmp_path):
    """``mimetic`` factorises each head's target by an SVD of real values, and skips a weight on the
    meta device: here it initialises the full-size architecture (its depth, heads and stages) at 2-4
    channels per head (the family's ``REDUCED_WIDTH``) on the task's smoke sizes, real weights on the
    CPU. At every attention module W_O W_V = (α₂ Z − β₂ I)ᵀ: its diagonal averages −β₂ (±1/D); then
    a step's loss and gradients are finite."""
    family = FAMILY_OF[task]
    reduced = family.REDUCED_WIDTH[backbone]
    cfg = compose([f"task={task}", *SMOKE[task], f"backbone={backbone}", "attn=mimetic", *reduced], tmp_path)
    torch.manual_seed(0)
    task_obj = instantiate(cfg.task)
    model = build_as_trained(task_obj, cfg)
    beta2 = attention.variant_from_config(cfg.attn).beta2
    for site in attention.find_sites(model):
        with torch.no_grad():
            product = site.out.weight @ site.v.raw()  # (D_out, H*d) @ (H*d, D): (D_out, D)
        assert site.head_dim <= 4, site.name  # reduced
        assert abs(product.diagonal().mean().item() + beta2) < 0.1, site.name
    loss, output, expected = take_step(task_obj, cfg, model)
    assert shapes(output) == expected and torch.isfinite(loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


@functools.cache
def experiments() -> list[tuple[str, str, str]]:
    """Every experiment file, as ``(name, the scale of its backbone, its task)``."""
    found = []
    for path in sorted((CONF / "experiment").glob("**/*.yaml")):
        name = str(path.relative_to(CONF / "experiment").with_suffix(""))
        cfg = compose([f"experiment={name}"], Path("unused"))
        found.append((name, cfg.backbone.scale, cfg.task.name))
    return found


def experiment_params(which: str):
    """The experiments a test takes: ``tiny`` backbones, ``full`` size, or each family's ``step``."""
    for name, scale, task in experiments():
        wanted = {"tiny": scale != "full", "full": scale == "full", "step": name in FULL_SIZE_STEP}
        if wanted[which]:
            slow = [pytest.mark.slow] if which in ("full", "step") else []
            yield pytest.param(name, marks=slow + SKIPS.get(task, []), id=name)


@pytest.mark.parametrize("experiment", list(experiment_params("tiny")))
def test_experiment_composes_and_trains_two_steps(experiment, data_dir, tmp_path):
    task = compose([f"experiment={experiment}"], tmp_path).task.name
    cfg = compose([*smoke_overrides(task, data_dir), f"experiment={experiment}"], tmp_path)
    try:
        check_record(train(cfg, tmp_path / "run"), tmp_path / "run")
    finally:
        drop_weights(tmp_path / "run")


@pytest.mark.parametrize("experiment", list(experiment_params("full")))
def test_full_size_experiment_builds_and_steps_on_meta(experiment, tmp_path):
    """A full-size experiment as its file configures it (task, backbone, recipe) builds on the
    meta device and takes one step there (loss, backward, its optimizer and schedule). Pretrained
    weights (GLUE's, from its pretraining run) have values: none are loaded."""
    backbone = compose([f"experiment={experiment}"], tmp_path).backbone
    unweighted = ["backbone.model.pretrained=null"] if "pretrained" in backbone.model else []
    cfg, model, loss, output, expected = on_meta([f"experiment={experiment}", *unweighted], tmp_path)
    assert cfg.backbone.scale == "full"
    assert applied_variants(model) == attention.part_names(cfg.attn)
    check_meta_step(model, loss, output, expected)


@pytest.mark.parametrize("experiment", list(experiment_params("step")))
def test_full_size_experiment_trains_one_real_step(experiment, data_dir, tmp_path):
    """One real step per family at full size (``FULL_SIZE_STEP``): the experiment's full-size
    backbone, variant and recipe through ``train()`` on the family's tiny data, to the record:
    summary, checkpoint (then deleted), train, validation and monitor rows. Where no tokenizer
    sizes the model, the model it trained is the one the meta device builds (same parameters)."""
    task = compose([f"experiment={experiment}"], tmp_path).task.name
    tiny = [*SMOKE.get(task, []), *ONE_STEP, f"paths.data_dir={data_dir}"]
    cfg = compose([f"task={task}", *tiny, f"experiment={experiment}"], tmp_path)
    assert cfg.backbone.scale == "full"
    try:
        summary = train(cfg, tmp_path / "run")
        check_record(summary, tmp_path / "run", steps=1)
        assert (summary["task"], summary["backbone"]) == (task, cfg.backbone.name)
        assert summary["params"] > 4_000_000  # the full-size model: the smallest is 4.5M
        if not hasattr(FAMILY_OF[task], "without_data"):
            with torch.device("meta"):
                built = build_as_trained(instantiate(cfg.task), cfg)
            assert summary["params"] == sum(p.numel() for p in built.parameters())
    finally:
        drop_weights(tmp_path / "run")


# -- the rows of a paper experiment are distinct runs ---------------------------------------------


def grid_rows(experiment: str) -> list[list[list[str]]]:
    """A paper experiment's backbone rows, grouped by the task they run on: each row its overrides.
    From the file's sweep (``hydra.sweeper.params``: its ``backbone`` and ``task`` lists)."""
    found = OmegaConf.load(CONF / "experiment" / f"{experiment}.yaml")
    params = OmegaConf.select(found, "hydra.sweeper.params", default=None) or {}
    backbones, tasks = (str(params.get(key) or "").split(",") for key in ("backbone", "task"))
    return [
        [
            [f"experiment={experiment}", *([f"task={t.strip()}"] if t else []), f"backbone={b.strip()}"]
            for b in backbones
        ]
        for t in tasks
    ]


def row_key(overrides: list[str], tmp_path: Path) -> tuple[str, str]:
    """What a row trains: ``(the model's architecture, the recipe)``. The architecture is the model
    built on the meta device as training builds it (``attn=standard``): its modules, parameter names
    and shapes; the recipe, the resolved config without the row's names (``backbone.name`` and
    timm's ``backbone.model.model_name``)."""
    cfg = compose([*overrides, "attn=standard"], tmp_path)
    with torch.device("meta"):
        model = build_as_trained(instantiate(cfg.task), cfg)
    shapes = [(name, tuple(p.shape)) for name, p in model.named_parameters()]
    recipe = OmegaConf.to_container(cfg, resolve=True)
    recipe["backbone"].pop("name")
    recipe["backbone"]["model"].pop("model_name", None)
    return repr(model) + json.dumps(shapes), json.dumps(recipe, sort_keys=True, default=str)


PAPER_GRIDS = [
    name
    for name in sorted(p.stem for p in (CONF / "experiment" / "paper").glob("*.yaml"))
    if len(grid_rows(f"paper/{name}")[0]) > 1
]


@pytest.mark.slow  # the papers' full-size models built on the meta device: about 20 s
def test_no_two_backbone_rows_of_a_paper_experiment_train_the_same_model_and_recipe(tmp_path):
    """Each paper experiment that sweeps backbones (ImageNet, P4's convergence, COCO, LM) gives every
    backbone row of a task a model or a recipe of its own: a row under another name that built the
    same model with the same recipe would spend its runs on a copy of another row. The check finds
    the copy it was written for: ``deit_base`` is ``vit_base`` under the ImageNet recipe (the report
    sets the ViT-B runs beside DeiT-B's row instead: ``launch.analysis.paper.REPORTED_FROM``)."""
    assert PAPER_GRIDS == ["coco", "convergence", "imagenet", "lm"]
    for experiment in PAPER_GRIDS:
        for rows in grid_rows(f"paper/{experiment}"):
            keys = [row_key(row, tmp_path) for row in rows]
            duplicates = [
                (rows[i][-1], rows[j][-1]) for i in range(len(rows)) for j in range(i) if keys[i] == keys[j]
            ]
            assert not duplicates, f"paper/{experiment}: the same model and recipe in rows {duplicates}"
    twin = ["experiment=paper/imagenet", "backbone=deit_base"]
    assert row_key(twin, tmp_path) == row_key(["experiment=paper/imagenet", "backbone=vit_base"], tmp_path)
