"""What a sweep will cost, before launching it: ``python -m launch.plan <the sweep's overrides>``.

    python -m launch.plan experiment=paper/imagenet
    python -m launch.plan experiment=paper/glue task=mlm seed=0 --gpu A100-SXM --gpus 64
    python -m launch.plan -m task=digits attn=standard,spectral seed=0,1,2 --measured gpu_check.json

The grid is the one ``python -m src.run -m <the same overrides>`` runs (Hydra's basic sweeper over
the experiment's ``hydra.sweeper.params`` and the command line's lists, expanded as
:func:`launch.wandb_sweep.grid` does). For each distinct run (the seeds of one config are one row),
without data and without training:

- **FLOPs per optimizer step**: the run's model built on the meta device (the backbone's
  ``model`` node with what its task adds from its data, taken from the config or a table here,
  and ``cfg.attn``'s variant applied where that works on meta), one sample's forward and backward
  counted by :class:`torch.utils.flop_counter.FlopCounterMode` (a multiply-add counts 2), times
  the global batch (``task.batch_size × trainer.accumulate``; for detection, per process × the
  processes of ``resources``). Only matmul-like operations count: a variant's decompositions
  (SVD, eigenvalues) and the optimizer are not in it, nor is the data pipeline. A model that
  cannot run on meta (``torch.autocast`` knows no meta device) runs on fake CPU tensors, which
  hold no data either. Masked-LM pretraining decodes only its masked positions, as the task does.
  Detection trains in mmdet's Runner: its rows count the timm backbone alone at the task's
  ``img_scale`` (a lower bound, said in the row).
- **steps**: ``trainer.max_steps``, else ``trainer.max_epochs`` × ⌈train-set size / global
  batch⌉ with the sizes of :data:`TRAIN_SIZES`.
- **GPU-hours**: total FLOPs / (the GPU's dense bf16 peak, :data:`GPUS`, × the MFU), or, where
  ``--measured FILE`` gives a step time for the run's backbone (and variant), steps × that time
  (the table's ``from`` column says which). A step too short at the MFU to fill a GPU
  (:data:`SMALL_STEP_S`) says its hours are a floor.
- **storage**: what the trainer keeps per run (``last.pt`` and ``previous.pt``: fp32 weights and
  AdamW's two fp32 moments, plus the EMA's weights if any; ``best.pt``: the weights and EMA) and
  its record's rows (:data:`RECORD_ROW_BYTES` per row, **[reading]**).
- **wall time**: a run on the GPUs its ``resources`` ask for, and the whole sweep at ``--gpus N``,
  both at perfect scaling (**[reading]**: a lower bound).

Where a paper states its compute (:data:`PAPER_COMPUTE`), the row shows it beside ours. Bad input
is one ``error: …`` line and exit status 2.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from src.errors import ConfigError

#: Dense bf16 tensor-core peak, FLOP/s, from each vendor datasheet (V100 has no bf16: its fp16).
GPUS: dict[str, tuple[float, str]] = {
    "H200": (
        989e12,
        "NVIDIA H200 Tensor Core GPU datasheet (2024): BF16 1,979 TFLOPS with sparsity, 989 dense",
    ),
    "H100-SXM": (
        989e12,
        "NVIDIA H100 Tensor Core GPU datasheet (2023): BF16 1,979 TFLOPS with sparsity, 989 dense",
    ),
    "A100-SXM": (312e12, "NVIDIA A100 Tensor Core GPU datasheet (2021): BF16 312 TFLOPS dense"),
    "A6000": (154.8e12, "NVIDIA RTX A6000 datasheet (2021): FP16/BF16 tensor 154.8 TFLOPS dense"),
    "V100": (125e12, "NVIDIA V100 datasheet (2020): FP16 tensor 125 TFLOPS (no bf16)"),
}
DEFAULT_GPU = "A100-SXM"
#: **[reading]** PaLM's model-FLOP utilisation (Chowdhery et al., 2022, "PaLM", Table 3: 46.2% for
#: 540B on TPU v4). A large LM's figure: an 86M ViT's step on one GPU is smaller and its data
#: loading heavier, so the true MFU is likely lower and these GPU-hours a lower bound. ``--mfu``.
DEFAULT_MFU = 0.462
MFU_SOURCE = "PaLM's 46.2% (Chowdhery et al., 2022, Table 3) [reading]"

#: Training-set sizes (samples) of tasks that count their budget in epochs.
TRAIN_SIZES: dict[str, tuple[int, str]] = {
    "imagenet": (1_281_167, "ImageNet-1k train (ILSVRC-2012; Russakovsky et al., 2015)"),
    "coco": (118_287, "COCO train2017 (instances_train2017.json)"),
    "glue_cola": (8_551, "GLUE CoLA train (Wang et al., 2019; HF datasets glue card)"),
    "glue_sst2": (67_349, "GLUE SST-2 train"),
    "glue_mrpc": (3_668, "GLUE MRPC train"),
    "glue_stsb": (5_749, "GLUE STS-B train"),
    "glue_qqp": (363_846, "GLUE QQP train"),
    "glue_mnli": (392_702, "GLUE MNLI train"),
    "glue_qnli": (104_743, "GLUE QNLI train"),
    "glue_rte": (2_490, "GLUE RTE train"),
    "glue_wnli": (635, "GLUE WNLI train"),
}

#: Compute a paper states for one run, keyed ``task`` or ``task/backbone``: (GPU-hours, the GPU of
#: :data:`GPUS` it ran on, the source); the suite quotes both (conf/task/mlm.yaml, conf/task/imagenet.yaml).
DEIT_B = (424.0, "V100", "DeiT-B 300 epochs: 53 h on 8 V100 (Touvron et al., 2021, sec. 6)")
PAPER_COMPUTE: dict[str, tuple[float, str, str]] = {
    # [reading] the A6000: the paper's main GPU as we recall it (it also reports an RTX 2080 Ti and A4000)
    "mlm/crammed_bert": (24.0, "A6000", "Cramming: one GPU-day on one RTX A6000 (Geiping & Goldstein, 2022)"),
    "imagenet/deit_base": DEIT_B,
    "imagenet/vit_base": DEIT_B,
}
#: **[reading]** a step shorter than this at the MFU (a model of a few million parameters) leaves a
#: GPU waiting on kernel launches and data, not compute: its hours are a floor, said in the row.
SMALL_STEP_S = 0.02
#: **[reading]** bytes per row of metrics.jsonl (a JSON line of a dozen numbers and their keys).
RECORD_ROW_BYTES = 400
#: Vocabulary of a tokenizer named in a task config, where the task reads it from files.
TOKENIZER_VOCAB = {"gpt2": 50_257}


@dataclass
class Row:
    """One distinct run of the sweep (its seeds are ``runs``) and what it costs."""

    task: str
    backbone: str
    attn: str
    runs: int
    params: int | None
    flops_per_step: float | None
    steps: int | None
    gpus_per_run: int
    storage_bytes: float | None
    gpu_hours: float | None = None
    source: str = ""
    note: str = ""
    paper: str = ""


# -- FLOPs ----------------------------------------------------------------------------------------


def count_flops(model: Any, inputs: tuple, backward: bool = False) -> int:
    """FLOPs of ``model(*inputs)`` (and of the backward of its output's sum), a multiply-add as 2."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        out = model(*inputs)
        if backward:
            out = out[0] if isinstance(out, tuple | list) else out
            out.float().sum().backward()
    return int(counter.get_total_flops())


def forward_flops(model: Any, img_size: int = 224, in_chans: int = 3, inputs: tuple | None = None) -> int:
    """FLOPs of one sample's forward pass (a multiply-add counted as 2), counted on the meta device.

    ``model``: a timm model name (built on meta at ``img_size``, no weights) or a built model;
    ``inputs``: its positional inputs for one sample (default: one ``in_chans × img_size²`` image
    on the model's device)."""
    import torch

    if isinstance(model, str):
        import timm

        with torch.device("meta"):
            model = timm.create_model(model, pretrained=False, img_size=img_size, in_chans=in_chans)
    if inputs is None:
        device = next(model.parameters()).device
        inputs = (torch.zeros(1, in_chans, img_size, img_size, device=device),)
    with torch.no_grad():
        return count_flops(model, inputs)


def model_and_inputs(cfg: Any, device: str = "meta") -> tuple[Any, tuple, str]:
    """The run's model without weights (on ``device``: meta, or the CPU inside a
    :class:`FakeTensorMode <torch._subclasses.fake_tensor.FakeTensorMode>`), one sample's inputs,
    and a note on what was approximated."""
    import torch
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from src import attention

    cfg = copy.deepcopy(cfg)
    task, kind = cfg.task, str(cfg.backbone.get("kind"))
    if OmegaConf.to_container(cfg.backbone.model, resolve=False).get("pretrained") is not None:
        # weights change no FLOPs, and GLUE's ${pretrained_by:…} names a run folder only a run has
        OmegaConf.update(cfg, "backbone.model.pretrained", None)
    extra: dict[str, Any] = {}
    note = ""
    if kind in ("image", "detection"):
        side = (task.img_size, task.img_size) if kind == "image" else detection_input(task)
        x = (torch.zeros(1, task.get("in_chans", 3), *side, device=device),)
    elif kind in ("causal_lm", "text"):
        tok = task.get("tokenizer")
        vocab = TOKENIZER_VOCAB.get(str(tok)) or task.get("vocab_size") or task.get("bpe_vocab_size")
        extra["vocab_size"] = int(vocab)
        if kind == "text" and task.name != "mlm":
            extra["num_labels"] = 1 if task.name == "glue_stsb" else 3 if task.name == "glue_mnli" else 2
        x = (torch.zeros(1, task.seq_len, dtype=torch.long, device=device),)
    elif kind == "sequence":
        built = instantiate(task, _convert_="all")
        extra = dict(
            vocab_size=built.vocab_size,
            num_classes=built.num_classes,
            max_positions=built.pad_length,
            dual=built.dual,
        )
        ids = torch.zeros(1, built.pad_length, dtype=torch.long, device=device)
        mask = torch.ones(1, built.pad_length, dtype=torch.bool, device=device)
        x = (ids, mask, ids, mask) if built.dual else (ids, mask)
    else:
        raise ValueError(f"no inputs known for a {kind} backbone")
    with torch.device(device):
        if kind == "detection":  # mmdet builds the detector; its backbone is timm's model
            import timm

            model = timm.create_model(cfg.backbone.model.model_name, pretrained=False, num_classes=0)
            note = "the backbone only (Mask R-CNN's FPN and heads not counted: a lower bound)"
        else:
            model = instantiate(cfg.backbone.model, _convert_="all", **extra)
    try:
        attention.apply(model, attention.variant_from_config(cfg.attn))
    except Exception as e:  # noqa: BLE001  a variant whose setup needs real weights
        skipped = f"{cfg.attn.variant} not applied ({type(e).__name__}): the backbone's FLOPs"
        note = "; ".join(w for w in (note, skipped) if w)
    if kind == "text" and task.get("mask_prob"):
        model = MaskedLM(model, float(task.mask_prob))
    return model, x, note


class MaskedLM:
    """Masked-LM pretraining's model as tasks/mlm/task.py calls it: the encoder on every position,
    the tied decoder only on the masked ones (``mask_prob`` of them: the mean; **[reading]**)."""

    def __init__(self, model: Any, mask_prob: float) -> None:
        self.model, self.mask_prob = model, mask_prob

    def __call__(self, ids: Any) -> Any:
        hidden = self.model.encode(ids)  # (B, N, D)
        masked = max(1, round(self.mask_prob * ids.shape[1]))
        return self.model.mlm_logits(hidden[:, :masked])  # (B, M, V)

    def parameters(self) -> Any:
        return self.model.parameters()

    def train(self) -> None:
        self.model.train()


def detection_input(task: Any) -> tuple[int, int]:
    """``(H, W)`` of a detection image: the task's ``img_scale`` (longer, shorter), padded to 32."""
    longer, shorter = (int(v) for v in task.img_scale)
    return tuple(32 * math.ceil(v / 32) for v in (shorter, longer))


def step_cost(cfg: Any) -> tuple[int | None, float | None, str]:
    """``(parameters, FLOPs of one sample's forward + backward, note)`` of the run of ``cfg``: on
    the meta device, or where a model cannot run there (``torch.autocast`` knows no meta device:
    the Nyströmformer), on fake CPU tensors, which hold no data either."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    try:
        try:
            model, x, note = model_and_inputs(cfg)
            model.train()
            flops = count_flops(model, x, backward=True)
        except RuntimeError:
            with FakeTensorMode(allow_non_fake_inputs=True):
                model, x, note = model_and_inputs(cfg, device="cpu")
                model.train()
                flops = count_flops(model, x, backward=True)
    except Exception as e:  # noqa: BLE001  said in the table, not fatal to the plan
        return None, None, f"not counted: {str(e).splitlines()[0][:80]}"
    return sum(p.numel() for p in model.parameters()), float(flops), note


# -- steps, storage, hours ------------------------------------------------------------------------


def global_batch(cfg: Any) -> int:
    """Samples per optimizer step; detection's batch is per process (mmdetection's convention)."""
    batch = int(cfg.task.batch_size) * int(cfg.trainer.get("accumulate") or 1)
    if cfg.task.get("input") == "detection":
        batch *= processes(cfg)
    return batch


def processes(cfg: Any) -> int:
    """The GPUs one run asks for (``resources``)."""
    res = cfg.get("resources") or {}
    return max(1, int(res.get("nodes") or 1) * int(res.get("gpus_per_node") or 1))


def steps_of(cfg: Any) -> int | None:
    """Optimizer steps of the recipe: ``max_steps``, else epochs × steps per epoch."""
    trainer = cfg.trainer
    if trainer.get("max_steps"):
        return int(trainer.max_steps)
    epochs = trainer.get("max_epochs")
    size = TRAIN_SIZES.get(str(cfg.task.name))
    if not epochs or size is None:
        return None
    return int(epochs) * math.ceil(size[0] / global_batch(cfg))


def checkpoint_bytes(params: int, ema: bool = False) -> float:
    """Bytes of the checkpoints one run keeps (src/engine/record/checkpoint.py): ``last.pt`` and
    ``previous.pt`` (fp32 weights, AdamW's fp32 ``exp_avg`` and ``exp_avg_sq``, the EMA's weights)
    and ``best.pt`` (the weights and the EMA's); the RNG states and the loop's are kilobytes."""
    weights = 4.0 * params
    last = weights * (3 + ema)
    best = weights * (1 + ema)
    return 2 * last + best


def storage_bytes(params: int, cfg: Any, steps: int | None) -> float:
    """Bytes one run keeps: its checkpoints (none with ``trainer.checkpoints=false``) and its
    record's rows (one per log, validation and monitor step)."""
    trainer = cfg.trainer
    ckpt = checkpoint_bytes(params, bool(trainer.get("ema"))) if trainer.get("checkpoints", True) else 0.0
    rows = 0
    for every in ("log_every", "val_every", "monitor_every"):
        if steps and trainer.get(every):
            rows += steps // int(trainer.get(every))
    return ckpt + rows * RECORD_ROW_BYTES


def measured_step(measured: dict[str, Any], row: Row, batch: int) -> float | None:
    """Seconds per optimizer step from a ``launch.gpu_check`` JSON, for ``backbone/attn`` or the
    backbone: ``{"seconds_per_step": {key: s}}`` (at the recipe's global batch) or
    ``{"samples_per_s": {key: n}}`` (one GPU)."""
    for key in (f"{row.backbone}/{row.attn}", row.backbone):
        if key in measured.get("seconds_per_step", {}):
            return float(measured["seconds_per_step"][key])
        if key in measured.get("samples_per_s", {}):
            return batch / float(measured["samples_per_s"][key])
    return None


# -- the sweep ------------------------------------------------------------------------------------


def jobs(arguments: list[str]) -> list[tuple[list[str], int]]:
    """The sweep's distinct runs as ``(overrides, seeds)``: the grid of
    :func:`launch.wandb_sweep.grid` with the seeds folded into a count (a seed changes no cost)."""
    import src.engine.schema  # noqa: F401  the trainer schema the config is composed with
    from launch.wandb_sweep import grid
    from src.cli import check_selections

    check_selections(arguments)
    values, _ = grid(arguments)
    seeds = len(values.pop("seed", [None]))
    keys = list(values)
    return [
        ([f"{k}={v}" for k, v in zip(keys, combo, strict=True)], seeds)
        for combo in itertools.product(*values.values())
    ]


def per_experiment(arguments: list[str]) -> list[list[str]]:
    """``arguments`` once per experiment where they sweep it (``experiment=paper/lra,paper/lm``):
    one grid, one table each."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    import src.engine.schema  # noqa: F401  the trainer schema the config is composed with
    from src.cli import config_loader

    parsed = OverridesParser.create(config_loader=config_loader()).parse_overrides(arguments)
    for i, override in enumerate(parsed):
        if override.get_key_element() == "experiment" and override.is_sweep_override():
            return [
                [*arguments[:i], f"experiment={v}", *arguments[i + 1 :]]
                for v in override.sweep_string_iterator()
            ]
    return [arguments]


def compose(overrides: list[str]) -> Any:
    """The config ``python -m src.run <overrides>`` composes (resolved lazily)."""
    from hydra.types import RunMode

    import src.engine.schema  # noqa: F401  the trainer schema the config is composed with
    from src import resolvers  # noqa: F401  the configs' resolvers
    from src.cli import config_loader

    return config_loader().load_configuration("config", overrides=overrides, run_mode=RunMode.RUN)


def as_text(node: Any) -> str:
    """``node`` as YAML, resolved where it can be."""
    from omegaconf import OmegaConf

    try:
        return OmegaConf.to_yaml(node, resolve=True)
    except Exception:  # noqa: BLE001  an interpolation only a run resolves
        return OmegaConf.to_yaml(node)


def plan(
    arguments: list[str], gpu: str = DEFAULT_GPU, mfu: float = DEFAULT_MFU, measured: dict | None = None
) -> list[Row]:
    """One :class:`Row` per distinct run of the sweep of ``arguments``."""
    peak = GPUS[gpu][0]
    rows, costs = [], {}
    for overrides, seeds in jobs(arguments):
        cfg = compose(overrides)
        key = (str(cfg.task.name), str(cfg.backbone.name), str(cfg.attn.variant), global_batch(cfg))
        same = (key[0], as_text(cfg.task), as_text(cfg.backbone), as_text(cfg.attn))  # a seed changes nothing
        if same not in costs:
            costs[same] = step_cost(cfg)
        params, flops, note = costs[same]
        steps = steps_of(cfg)
        row = Row(
            task=key[0],
            backbone=key[1],
            attn=key[2],
            runs=seeds,
            params=params,
            flops_per_step=flops * key[3] if flops is not None else None,
            steps=steps,
            gpus_per_run=processes(cfg),
            storage_bytes=storage_bytes(params, cfg, steps) if params is not None else None,
            note=note if steps is not None else (note or "no step count: no max_steps and no train-set size"),
        )
        seconds = measured_step(measured or {}, row, key[3])
        if seconds is not None and steps is not None:
            row.gpu_hours, row.source = steps * seconds / 3600, "measured"
        elif row.flops_per_step is not None and steps is not None:
            row.gpu_hours, row.source = row.flops_per_step * steps / (peak * mfu) / 3600, "MFU"
            step_s = row.flops_per_step / (peak * mfu)
            if step_s < SMALL_STEP_S:
                small = f"{step_s * 1e3:.2g} ms a step: too small to fill a GPU, the hours a floor (measure)"
                row.note = "; ".join(w for w in (row.note, small) if w)
        stated = PAPER_COMPUTE.get(f"{row.task}/{row.backbone}") or PAPER_COMPUTE.get(row.task)
        if stated is not None:
            ours = row.flops_per_step * steps / (GPUS[stated[1]][0] * mfu) / 3600 if row.gpu_hours else None
            beside = f", ours {ours:,.0f} {stated[1]}-h at this MFU" if ours is not None else ""
            row.paper = f"paper: {stated[0]:g} {stated[1]}-h{beside} ({stated[2]})"
        rows.append(row)
    return rows


def short(value: float) -> str:
    """A total for the eye: one decimal from 10 on, three significant digits below."""
    return f"{value:,.1f}" if value >= 10 else f"{value:.3g}"


COLUMNS = (
    "task", "backbone", "attn", "runs", "params (M)", "PFLOP/step", "steps", "GPU-h/run", "GPU-h", "from",
    "wall h/run", "storage GB", "paper, note",
)  # fmt: skip


def table(rows: list[Row], gpus: int) -> str:
    """The plan as a Markdown table with a totals row (the wall time of the whole sweep at ``gpus``)."""

    def num(v: float | None, fmt: str) -> str:
        return "n/a" if v is None else format(v, fmt)

    def hrs(v: float | None) -> str:
        return "n/a" if v is None else short(v)

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(cells) + " |"

    lines = [line(list(COLUMNS)), "|" + "---|" * len(COLUMNS)]
    for r in rows:
        hours = r.gpu_hours
        lines.append(
            line([
                r.task, r.backbone, r.attn, str(r.runs),
                num(r.params and r.params / 1e6, ".1f"),
                num(r.flops_per_step and r.flops_per_step / 1e15, ".3g"),
                num(r.steps, ","),
                hrs(hours),
                hrs(hours * r.runs if hours is not None else None),
                r.source or "n/a",
                hrs(hours / r.gpus_per_run if hours is not None else None),
                num(r.storage_bytes * r.runs / 1e9 if r.storage_bytes is not None else None, ",.2f"),
                "; ".join(w for w in (r.paper, r.note) if w),
            ])
        )  # fmt: skip
    hours = sum(r.gpu_hours * r.runs for r in rows if r.gpu_hours is not None)
    store = sum(r.storage_bytes * r.runs for r in rows if r.storage_bytes is not None) / 1e9
    missing = sum(r.runs for r in rows if r.gpu_hours is None)
    words = f"{short(hours / 24)} GPU-days" + (f"; {missing} runs not counted" if missing else "")
    wall = f"{short(hours / gpus)} at {gpus} GPUs"
    total = ["**total**", "", "", str(sum(r.runs for r in rows)), "", "", "", "", short(hours), "", wall]
    lines.append(line([*total, f"{store:,.2f}", words]))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Print the plan; one ``error:`` line and 2 on bad input."""
    from src.precheck import precheck

    parser = argparse.ArgumentParser(prog="python -m launch.plan", description=__doc__.splitlines()[0])
    parser.add_argument(
        "overrides", nargs="*", metavar="key=value", help="the sweep's overrides (-m is optional)"
    )
    parser.add_argument(
        "--gpu", default=DEFAULT_GPU, help=f"one of {', '.join(GPUS)} (default {DEFAULT_GPU})"
    )
    parser.add_argument(
        "--mfu",
        type=float,
        default=DEFAULT_MFU,
        help=f"model-FLOP utilisation (default {MFU_SOURCE.replace('%', '%%')})",
    )
    parser.add_argument(
        "--gpus", type=int, default=8, help="GPUs the sweep runs on at once, for its wall time"
    )
    parser.add_argument(
        "--measured", type=Path, help="a launch.gpu_check JSON: step times used instead of the MFU"
    )
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args([a for a in argv if a not in ("-m", "--multirun")])
    try:
        if args.gpu not in GPUS:
            raise ConfigError(f"--gpu {args.gpu}: not in the table; one of {', '.join(GPUS)}")
        if not 0 < args.mfu <= 1 or args.gpus < 1:
            raise ConfigError("--mfu is a fraction in (0, 1] and --gpus at least 1")
        measured = json.loads(args.measured.read_text()) if args.measured else None
        if measured is not None and (not isinstance(measured, dict) or measured.get("dry")):
            raise ConfigError(
                f"--measured {args.measured}: not a real launch.gpu_check result (a --dry one times "
                "tiny shapes): run python -m launch.gpu_check on a CUDA GPU"
            )
        precheck(["-m", *args.overrides])  # src.run's refusals: a key no config has (did you mean …), …
        plans = [(each, plan(each, args.gpu, args.mfu, measured)) for each in per_experiment(args.overrides)]
    except (ConfigError, OSError, json.JSONDecodeError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except Exception as error:  # noqa: BLE001  Hydra's grammar and composition errors
        print(f"error: {type(error).__name__}: {str(error).splitlines()[0]}", file=sys.stderr)
        return 2
    for each, rows in plans:
        if len(plans) > 1:
            print(f"\n## {' '.join(each)}\n")
        print(table(rows, args.gpus))
    source = "measured step times where marked, else " if measured else ""
    print(
        f"\nGPU-hours: {source}FLOPs / ({args.gpu} {GPUS[args.gpu][0] / 1e12:g} TFLOP/s × MFU {args.mfu:.3g})"
    )
    print(f"  {args.gpu}: {GPUS[args.gpu][1]}; MFU default: {MFU_SOURCE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
