"""What a sweep will cost, before launching it: ``python -m launch.plan <the sweep's overrides>``.

    python -m launch.plan experiment=paper/imagenet
    python -m launch.plan experiment=paper/glue task=mlm seed=0 --gpu A100-SXM --gpus 64
    python -m launch.plan -m task=digits attn=standard,spectral seed=0,1,2 --measured gpu_check.json
    python -m launch.plan --all --gpu H100-SXM        # every paper table, and their total
    python -m launch.plan --references                # the MFU the published costs imply, the CPU rate
    python -m launch.plan -m attn=standard,precond seed=0,1,2   # a CPU-sized sweep: its CPU time too

The grid is the one ``python -m src.run -m <the same overrides>`` runs (Hydra's basic sweeper over
the experiment's ``hydra.sweeper.params`` and the command line's lists, expanded as
:func:`src.configs.grid` does). For each distinct run (the seeds of one config are one row),
without data and without training:

- **FLOPs and kernel launches per optimizer step** (:mod:`launch.tools.flops`): one sample's forward
  and backward on the meta device, FLOPs times the global batch (``task.batch_size ×
  trainer.accumulate``; for detection, per process × the processes of ``resources``), launches
  times the forward-backward passes of a step on all its processes (:func:`micro_batches`).
  Detection counts Mask R-CNN whole: backbone, FPN, RPN head, box and mask heads.
- **steps**: ``trainer.max_steps``, else ``trainer.max_epochs`` × ⌈train-set size / global
  batch⌉ with the size the run's task states (:attr:`src.engine.task.Task.train_size`).
- **GPU-hours**: steps × (FLOPs / (the GPU's dense bf16 peak, :data:`GPUS`, × the MFU) +
  launches × :data:`LAUNCH_S`): a small model's step is its launches (LRA, GLUE), a large
  one's its FLOPs. The default MFU, :data:`DEFAULT_MFU`, is the one the published costs of the
  plan's own reference rows imply (:data:`REFERENCES`, :func:`reference_mfu`: DeiT-B's 424
  V100-hours, Cramming's A6000-day). Where ``--measured FILE`` (a ``launch.tools.gpu_check`` JSON)
  times the run's backbone (and variant), steps × that time instead: the suite's own loop
  (``loop_samples_per_s``) before a bare step (``seconds_per_step``, ``samples_per_s``); the
  table's ``from`` column says which (``loop``, ``step``, ``MFU``), and the file's measured
  host cost per launch replaces :data:`LAUNCH_S`.
- **storage**: what the trainer keeps per run (``last.pt`` and ``previous.pt``: fp32 weights and
  AdamW's two fp32 moments, plus the EMA's weights if any; ``best.pt``: the weights and EMA) and
  its record's rows (:data:`RECORD_ROW_BYTES` per row, **[reading]**).
- **wall time**: a run on the GPUs its ``resources`` ask for, and the whole sweep at ``--gpus N``,
  both at perfect scaling (**[reading]**: a lower bound).
- **CPU time**, where every run is CPU-sized (:func:`cpu_sized`: at most :data:`CPU_SIZED_S` on
  one core): each run on one core at steps × (FLOPs / :data:`CPU_FLOP_S` + launches ×
  :data:`CPU_LAUNCH_S`), the rate fitted to the suite's own timed runs (:data:`CPU_REFERENCES`,
  ``--references``), and the sweep's wall time with one run a core on the cores this process may
  use (:func:`cpu_table`).

Where a paper states its compute (a reference's :attr:`Reference.rows`), the row shows it beside
ours on its GPU. No task is named here: what a task's runs need (its training set's size, its
model's arguments, one sample's shape) each task states itself (:class:`src.engine.task.Task`),
so that a new task is planned without an edit here. Several experiments (``experiment=a,b`` or
``--all``) end with a totals table. Bad input is one ``error: …`` line and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launch.tools.flops import step_cost
from src.command import command_parser, run_command
from src.configs import axes, combinations, compose, loader
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


@dataclass(frozen=True)
class Reference:
    """A published run the plan can price itself: its overrides, the GPU-hours its paper states,
    and the plan's rows (``task/backbone``) that run its recipe and model, which show its cost."""

    name: str
    overrides: tuple[str, ...]
    hours: float
    gpu: str
    source: str
    rows: tuple[str, ...] = ()


#: The published costs the plan is calibrated on (the suite quotes both: conf/task/imagenet.yaml,
#: conf/task/mlm.yaml). DeiT trained with DeiT's recipe on ``deit_base``; the suite's ``vit_base``
#: row runs the same recipe and cost. Cramming's GPU: **[reading]** the paper's main one, an RTX
#: A6000 (it also reports an RTX 2080 Ti and an A4000).
REFERENCES: tuple[Reference, ...] = (
    Reference(
        "DeiT-B",
        ("experiment=paper/imagenet", "backbone=deit_base", "attn=standard", "seed=0"),
        424.0,
        "V100",
        "DeiT-B 300 epochs: 53 h on one node of 8 V100 (Touvron et al., 2021, sec. 6)",
        ("imagenet/deit_base", "imagenet/vit_base"),
    ),
    Reference(
        "Cramming",
        ("experiment=paper/glue", "task=mlm", "attn=standard", "seed=0"),
        24.0,
        "A6000",
        "Cramming: one GPU-day on one RTX A6000 (Geiping & Goldstein, 2022)",
        ("mlm/crammed_bert",),
    ),
)
#: **[reading]** host seconds per kernel launch in an eager training step: PyTorch's dispatch,
#: autograd's bookkeeping and the launch itself, which a GPU waits on when its kernels are small.
#: Measured 25 µs per aten operation for a whole bare step (forward, backward, AdamW) of a
#: 2-block, width-8 ViT at batch 1 on the suite's 2-core CI machine's CPU, where the compute is
#: nil; a server core is faster and a CUDA launch adds a few µs: 20 µs. ``launch.tools.gpu_check``
#: measures it on the GPU (``launch.seconds_per_op``), and ``--measured`` uses that.
LAUNCH_S = 20e-6
#: Model-FLOP utilisation: the geometric mean of what the reference rows' published costs imply
#: on their GPUs with :data:`LAUNCH_S` (``python -m launch.plan --references``, a test holds it to
#: :func:`derived_mfu`): DeiT-B 0.218 on V100, Cramming 0.216 on A6000 (see the docstring of
#: :func:`reference_mfu`). ``--mfu`` overrides it.
DEFAULT_MFU = 0.217
MFU_SOURCE = "the reference rows' (DeiT-B on V100, Cramming on A6000): --references"

#: Every paper table, as ``--all`` plans it: (name, the sweep's overrides). GLUE's masked-LM
#: pretraining is its own sweep (conf/experiment/paper/glue.yaml's first command).
TABLES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("ImageNet", ("experiment=paper/imagenet",)),
    ("COCO", ("experiment=paper/coco",)),
    ("LM", ("experiment=paper/lm",)),
    ("GLUE pretraining", ("experiment=paper/glue", "task=mlm", "seed=0")),
    ("GLUE", ("experiment=paper/glue",)),
    ("LRA", ("experiment=paper/lra",)),
)
#: **[reading]** bytes per row of metrics.jsonl (a JSON line of a dozen numbers and their keys).
RECORD_ROW_BYTES = 400


@dataclass(frozen=True)
class CpuReference:
    """A run of the suite timed on one CPU core: its overrides, its seconds, where that is stated."""

    name: str
    overrides: tuple[str, ...]
    seconds: float
    source: str


#: The suite's own runs timed on the 2-core machine it is developed on (``trainer.threads=1``, one
#: core, beside another job), which the CPU estimate is fitted to (:func:`cpu_rate`).
CPU_REFERENCES: tuple[CpuReference, ...] = (
    CpuReference(
        "digits 500 steps",
        ("experiment=readings/digits", "reading=standard", "seed=0"),
        11.0,
        "conf/experiment/readings/digits.yaml: 11 s a run, one thread per run",
    ),
    CpuReference(
        "lm_char 1,000 steps",
        ("experiment=budgets/lm_char_1000", "reading=standard", "seed=200"),
        180.0,
        "conf/experiment/budgets/lm_char_1000.yaml: about 3 minutes a run on one core",
    ),
)
#: **[reading]** host seconds per aten operation of an eager step on one of the suite's CPU cores:
#: the 25 µs measured for a whole bare step of a tiny ViT (:data:`LAUNCH_S`'s measurement).
CPU_LAUNCH_S = 25e-6
#: One core's FLOP/s in the suite's loop, as the CPU references' times imply with
#: :data:`CPU_LAUNCH_S` (their geometric mean, :func:`cpu_rate`; a test holds it to it): digits
#: 53 GFLOP/s, lm_char 67. It covers what a step does beside its forward and backward (AdamW,
#: the batch, validation and the record at the runs' own intervals).
CPU_FLOP_S = 60e9
#: A sweep is CPU-sized where every one of its runs takes at most this long on one core: then
#: the plan adds its CPU estimate (:func:`cpu_table`).
CPU_SIZED_S = 3600.0


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
    launches_per_step: int | None = None
    gpu_hours: float | None = None
    source: str = ""
    note: str = ""
    paper: str = ""

    def cpu_seconds(self) -> float | None:
        """Seconds of the whole run on one CPU core (``trainer.threads=1``): its steps at
        :data:`CPU_FLOP_S` and :data:`CPU_LAUNCH_S` a launch."""
        if self.flops_per_step is None or self.steps is None:
            return None
        return self.steps * (self.flops_per_step / CPU_FLOP_S + (self.launches_per_step or 0) * CPU_LAUNCH_S)

    def step_seconds(self, peak: float, mfu: float, launch_s: float) -> float | None:
        """GPU-seconds of one optimizer step: its FLOPs at ``mfu`` of ``peak``, plus its launches."""
        if self.flops_per_step is None:
            return None
        return self.flops_per_step / (peak * mfu) + (self.launches_per_step or 0) * launch_s


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
    size = train_size(cfg) if epochs else None
    if size is None:
        return None
    return int(epochs) * math.ceil(size / global_batch(cfg))


def train_size(cfg: Any) -> int | None:
    """The training set's size as the run's task states it (:attr:`src.engine.task.Task.train_size`):
    None where only its data tells, or where the task cannot be built before the run (an
    interpolation only a run resolves); the task's :class:`ConfigError` where it refuses its config,
    as ``python -m src.run`` would."""
    key = as_text(cfg.task) + as_text(cfg.paths)  # a sweep's jobs share their task: built once
    if key not in _TRAIN_SIZES:
        _TRAIN_SIZES[key] = _stated_size(cfg)
    return _TRAIN_SIZES[key]


_TRAIN_SIZES: dict[str, int | None] = {}


def _stated_size(cfg: Any) -> int | None:
    """:func:`train_size`'s work: the task built without its data, asked its size."""
    from launch.tools.flops import planned_task

    try:
        size = planned_task(cfg).train_size
    except Exception as error:  # noqa: BLE001  Hydra's instantiate wraps what a task raises
        cause: BaseException | None = error
        while cause is not None and not isinstance(cause, ConfigError):
            cause = cause.__cause__
        if cause is not None:
            raise cause from None
        return None
    return None if size is None else int(size)


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


def micro_batches(cfg: Any) -> int:
    """Forward-backward passes one optimizer step runs, summed over its processes: each launches
    the model's kernels once (:func:`src.engine.loop.batching.plan_batch`'s split)."""
    from src.engine.loop.batching import plan_batch

    world, accumulate = processes(cfg), int(cfg.trainer.get("accumulate") or 1)
    if cfg.task.get("input") == "detection":
        return world * accumulate
    try:
        return world * plan_batch(int(cfg.task.batch_size), accumulate, world).accumulate
    except ConfigError:  # a world that cannot keep the batch: src.run refuses it; priced as written
        return world * accumulate


def measured_step(measured: dict[str, Any], row: Row, batch: int) -> tuple[float, str] | None:
    """GPU-seconds per optimizer step from a ``launch.tools.gpu_check`` JSON for ``backbone/attn`` or the
    backbone, and where they come from: the suite's loop (``{"loop_samples_per_s": {key: n}}``, one
    GPU) before a bare step (``{"seconds_per_step": {key: s}}`` at the recipe's global batch, or
    ``{"samples_per_s": {key: n}}``); only for the file's ``task`` where it names one."""
    if measured.get("task") not in (None, row.task):  # the check times one task's shapes (ImageNet's)
        return None
    keys = (f"{row.backbone}/{row.attn}", row.backbone)
    for key in keys:
        if key in measured.get("loop_samples_per_s", {}):
            return batch / float(measured["loop_samples_per_s"][key]), "loop"
    for key in keys:
        if key in measured.get("seconds_per_step", {}):
            return float(measured["seconds_per_step"][key]), "step"
        if key in measured.get("samples_per_s", {}):
            return batch / float(measured["samples_per_s"][key]), "step"
    return None


def measured_launch(measured: dict[str, Any] | None) -> float | None:
    """The host seconds per kernel launch a ``launch.tools.gpu_check`` JSON measured, if it did."""
    value = ((measured or {}).get("launch") or {}).get("seconds_per_op")
    return float(value) if isinstance(value, int | float) and value > 0 else None


# -- the sweep ------------------------------------------------------------------------------------


def jobs(arguments: list[str]) -> list[tuple[list[str], int]]:
    """The sweep's distinct runs as ``(overrides, seeds)``: the grid of :func:`src.configs.grid`
    with the seeds folded into a count (a seed changes no cost)."""
    values, _ = axes(arguments)
    seeds = len(values.pop("seed", [None]))
    return [(overrides, seeds) for overrides in combinations(values)]


def per_experiment(arguments: list[str]) -> list[list[str]]:
    """``arguments`` once per experiment where they sweep it (``experiment=paper/lra,paper/lm``):
    one grid, one table each."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create(config_loader=loader()).parse_overrides(arguments)
    for i, override in enumerate(parsed):
        if override.get_key_element() == "experiment" and override.is_sweep_override():
            return [
                [*arguments[:i], f"experiment={v}", *arguments[i + 1 :]]
                for v in override.sweep_string_iterator()
            ]
    return [arguments]


def check_job(cfg: Any, overrides: list[str]) -> None:
    """Refuse a job ``python -m src.run`` would refuse before any work, by the same checks: its
    values' ranges and choices, its task and backbone, its task's own options, and (where the task
    states its training set's size, :func:`train_size`) a global batch of more epochs than a step
    may span. A plan or a W&B sweep of such a job would count hours, or hand agents runs, that
    never train."""
    from src.engine.compatible import check_compatible
    from src.engine.loop.batching import check_global_batch, plan_for
    from src.engine.schema import check_values

    for check in (check_values, check_compatible):
        try:
            check(cfg)
        except ConfigError as error:
            raise ConfigError(in_job(error, overrides)) from None
        except Exception:  # noqa: BLE001  an interpolation only a run resolves: the run checks again
            pass
    try:
        size = train_size(cfg)
        batch = plan_for(cfg, 1)  # None: detection's batch is per process, and nothing splits it
        if size is not None and batch is not None:
            check_global_batch(batch, size)
    except ConfigError as error:
        raise ConfigError(in_job(error, overrides)) from None


def in_job(error: ConfigError, overrides: list[str]) -> str:
    """``error``'s line, naming the job of a grid it belongs to where that is more than one key."""
    return f"{error} (the job {' '.join(overrides)})" if len(overrides) > 1 else str(error)


def as_text(node: Any) -> str:
    """``node`` as YAML, resolved where it can be."""
    from omegaconf import OmegaConf

    try:
        return OmegaConf.to_yaml(node, resolve=True)
    except Exception:  # noqa: BLE001  an interpolation only a run resolves
        return OmegaConf.to_yaml(node)


def step_key(cfg: Any) -> tuple[str, str, str, str]:
    """What one step's cost (:func:`launch.tools.flops.step_cost`) depends on: the task's and the
    backbone's config and the variant's, where a variant changes what a step computes. One that
    only writes weights at initialization (every target ``init``: ``cond_init``, ``mimetic``) or
    changes nothing (``standard``) runs the backbone's own step, and on the meta device it writes
    nothing: those share one count, the same numbers each would get by itself."""
    from src.attention import variant_from_config

    variant = as_text(cfg.attn)
    try:
        parts = getattr(chosen := variant_from_config(cfg.attn), "parts", (chosen,))
        if all(how == "init" for part in parts for how in part.touches().values()):
            variant = "the backbone's own step"
    except Exception:  # noqa: BLE001  a config the count refuses in its own words (its note)
        pass
    return str(cfg.task.name), as_text(cfg.task), as_text(cfg.backbone), variant


def plan(
    arguments: list[str],
    gpu: str = DEFAULT_GPU,
    mfu: float = DEFAULT_MFU,
    measured: dict | None = None,
    launch_s: float | None = None,
    costs: dict | None = None,
) -> list[Row]:
    """One :class:`Row` per distinct run of the sweep of ``arguments``. ``launch_s``: host seconds
    per kernel launch (default: ``measured``'s, else :data:`LAUNCH_S`); ``costs``: a cache of
    step costs shared between calls (one per distinct task, backbone and variant)."""
    peak = GPUS[gpu][0]
    if launch_s is None:
        launch_s = measured_launch(measured) or LAUNCH_S
    rows, costs = [], {} if costs is None else costs
    for overrides, seeds in jobs(arguments):
        cfg = compose(overrides)
        check_job(cfg, overrides)  # what src.run refuses (trainer.max_steps=-5) has no hours
        same = step_key(cfg)  # a seed changes nothing, nor does a variant that only initializes
        if same not in costs:
            costs[same] = step_cost(cfg)
        key = (str(cfg.task.name), str(cfg.backbone.name), str(cfg.attn.variant), global_batch(cfg))
        params, flops, kernels, note = costs[same]
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
            launches_per_step=kernels * micro_batches(cfg) if kernels is not None else None,
            note=note if steps is not None else (note or "no step count: no max_steps and no train-set size"),
        )
        timed = measured_step(measured or {}, row, key[3])
        seconds = row.step_seconds(peak, mfu, launch_s)
        if timed is not None and steps is not None:
            row.gpu_hours, row.source = steps * timed[0] / 3600, timed[1]
        elif seconds is not None and steps is not None:
            row.gpu_hours, row.source = steps * seconds / 3600, "MFU"
            share = (row.launches_per_step or 0) * launch_s / seconds
            if share >= 0.5:
                bound = f"launch-bound: {share:.0%} of its step is {row.launches_per_step:,} launches"
                row.note = "; ".join(w for w in (row.note, bound) if w)
        stated = next((ref for ref in REFERENCES if f"{row.task}/{row.backbone}" in ref.rows), None)
        if stated is not None:
            theirs = row.step_seconds(GPUS[stated.gpu][0], mfu, launch_s)
            ours = steps * theirs / 3600 if theirs is not None and steps is not None else None
            beside = f", ours {ours:,.0f} {stated.gpu}-h at this MFU" if ours is not None else ""
            row.paper = f"paper: {stated.hours:g} {stated.gpu}-h{beside} ({stated.source})"
        rows.append(row)
    return rows


# -- the MFU from the reference rows --------------------------------------------------------------


def reference_row(ref: Reference, mfu: float = DEFAULT_MFU, launch_s: float = LAUNCH_S, costs=None) -> Row:
    """The plan's own row for a reference run, priced on the reference's GPU."""
    (row,) = plan(list(ref.overrides), gpu=ref.gpu, mfu=mfu, launch_s=launch_s, costs=costs)
    return row


def reference_mfu(ref: Reference, launch_s: float = LAUNCH_S, costs=None) -> float:
    """The MFU at which the plan's row for ``ref`` costs what its paper states on its GPU: its
    FLOPs over (the peak × the published seconds less the row's launches). At 20 µs a launch:
    DeiT-B's 375,600 steps of 1,024 images (105 GFLOPs each) on 8 V100s in 424 GPU-hours, 0.218;
    Cramming's 4,300 steps of 8,192 sequences on an A6000 in 24 hours, 0.216."""
    row = reference_row(ref, 1.0, launch_s, costs)
    if row.flops_per_step is None or row.steps is None:
        raise ConfigError(f"reference {ref.name}: the plan cannot count its row ({row.note})")
    launches = (row.launches_per_step or 0) * launch_s * row.steps
    return row.flops_per_step * row.steps / (GPUS[ref.gpu][0] * (ref.hours * 3600 - launches))


def derived_mfu(launch_s: float = LAUNCH_S, costs=None) -> float:
    """The geometric mean of the reference rows' MFUs (:func:`reference_mfu`)."""
    values = [reference_mfu(ref, launch_s, costs) for ref in REFERENCES]
    return math.exp(sum(math.log(v) for v in values) / len(values))


def references_table(mfu: float, launch_s: float) -> str:
    """Each reference: its published GPU-hours, the plan's at ``mfu`` on the same GPU, the MFU
    its cost implies."""
    costs: dict = {}
    lines = [
        "| reference | GPU | paper GPU-h | plan GPU-h | plan / paper | MFU it implies | source |",
        "|---|---|---|---|---|---|---|",
    ]
    for ref in REFERENCES:
        row = reference_row(ref, mfu, launch_s, costs)
        hours = "n/a" if row.gpu_hours is None else f"{row.gpu_hours:,.0f}"
        ratio = "n/a" if row.gpu_hours is None else f"{row.gpu_hours / ref.hours:.2f}"
        implied = reference_mfu(ref, launch_s, costs)
        lines.append(
            f"| {ref.name} | {ref.gpu} | {ref.hours:g} | {hours} | {ratio} | {implied:.3f} | {ref.source} |"
        )
    lines.append(f"\ngeometric mean: MFU {derived_mfu(launch_s, costs):.3f} (the default: {DEFAULT_MFU})")
    launch = f"{CPU_LAUNCH_S * 1e6:g} µs"
    lines += [
        f"\n| CPU reference | steps | seconds | plan's seconds | GFLOP/s it implies ({launch} a launch) |"
        " source |",
        "|---|---|---|---|---|---|",
    ]
    for ref in CPU_REFERENCES:
        (row,) = plan(list(ref.overrides), costs=costs)
        implied, ours = cpu_rate(costs, (ref,)) / 1e9, row.cpu_seconds()
        lines.append(
            f"| {ref.name} | {row.steps:,} | {ref.seconds:g} | {ours:.3g} | {implied:.3g} | {ref.source} |"
        )
    rate = cpu_rate(costs) / 1e9
    lines.append(f"\ngeometric mean: {rate:.3g} GFLOP/s a core (the default: {CPU_FLOP_S / 1e9:g})")
    return "\n".join(lines)


def cpu_rate(costs: dict | None = None, references: tuple[CpuReference, ...] = CPU_REFERENCES) -> float:
    """The FLOP/s of one core at which the plan's rows for ``references`` take their measured
    times (the geometric mean over them), with :data:`CPU_LAUNCH_S` a launch."""
    rates = []
    for ref in references:
        (row,) = plan(list(ref.overrides), costs=costs)
        launches = row.steps * (row.launches_per_step or 0) * CPU_LAUNCH_S
        rates.append(row.flops_per_step * row.steps / (ref.seconds - launches))
    return math.exp(sum(math.log(r) for r in rates) / len(rates))


def cpu_cores() -> int:
    """The CPU cores this process may run on (its affinity): the runs of a CPU sweep, side by side."""
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def cpu_sized(rows: list[Row]) -> bool:
    """Every run of ``rows`` is counted and takes at most :data:`CPU_SIZED_S` on one core."""
    return bool(rows) and all((r.cpu_seconds() or math.inf) <= CPU_SIZED_S for r in rows)


def minutes(seconds: float) -> str:
    """``seconds`` for the eye: seconds up to 2 minutes, minutes up to 2 hours, then hours."""
    if seconds < 120:
        return f"{seconds:.3g} s"
    return f"{short(seconds / 60)} min" if seconds < 7200 else f"{short(seconds / 3600)} h"


def cpu_table(rows: list[Row], cores: int) -> str:
    """The CPU estimate of a CPU-sized sweep: each row's run on one core, and the sweep's wall time
    with one run per core on ``cores`` (at most one per run; no faster than its longest run)."""
    lines = [
        "| task | backbone | attn | runs | steps | CPU ms/step | CPU/run | CPU |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        each = r.cpu_seconds() or 0.0
        lines.append(
            f"| {r.task} | {r.backbone} | {r.attn} | {r.runs} | {r.steps:,} | {1e3 * each / r.steps:.3g} "
            f"| {minutes(each)} | {minutes(each * r.runs)} |"
        )
    total = sum((r.cpu_seconds() or 0.0) * r.runs for r in rows)
    runs = sum(r.runs for r in rows)
    used = min(cores, runs)
    wall = max(total / used, max(r.cpu_seconds() or 0.0 for r in rows))
    lines.append(f"| **total** |  |  | {runs} |  |  |  | {minutes(total)}: {minutes(wall)} at {used} cores |")
    return "\n".join(lines)


# -- output ---------------------------------------------------------------------------------------


def short(value: float) -> str:
    """A total for the eye: one decimal from 10 on, three significant digits below."""
    return f"{value:,.1f}" if value >= 10 else f"{value:.3g}"


COLUMNS = (
    "task", "backbone", "attn", "runs", "params (M)", "PFLOP/step", "launches/step", "steps", "GPU-h/run",
    "GPU-h", "from", "wall h/run", "storage GB", "paper, note",
)  # fmt: skip


def hours_of(rows: list[Row]) -> float:
    """GPU-hours of every run the rows price."""
    return sum(r.gpu_hours * r.runs for r in rows if r.gpu_hours is not None)


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
                num(r.launches_per_step, ","),
                num(r.steps, ","),
                hrs(hours),
                hrs(hours * r.runs if hours is not None else None),
                r.source or "n/a",
                hrs(hours / r.gpus_per_run if hours is not None else None),
                num(r.storage_bytes * r.runs / 1e9 if r.storage_bytes is not None else None, ",.2f"),
                "; ".join(w for w in (r.paper, r.note) if w),
            ])
        )  # fmt: skip
    hours = hours_of(rows)
    store = sum(r.storage_bytes * r.runs for r in rows if r.storage_bytes is not None) / 1e9
    missing = sum(r.runs for r in rows if r.gpu_hours is None)
    words = f"{short(hours / 24)} GPU-days" + (f"; {missing} runs not counted" if missing else "")
    wall = f"{short(hours / gpus)} at {gpus} GPUs"
    total = ["**total**", "", "", str(sum(r.runs for r in rows)), "", "", "", "", "", short(hours), "", wall]
    lines.append(line([*total, f"{store:,.2f}", words]))
    return "\n".join(lines)


def totals(plans: list[tuple[str, list[Row]]], gpus: int, gpu: str) -> str:
    """One line per table and their sum: runs, GPU-hours, GPU-days, wall time at ``gpus``."""
    lines = [f"| table | runs | {gpu} GPU-h | GPU-days | wall days at {gpus} GPUs |", "|---|---|---|---|---|"]
    every = [r for _, rows in plans for r in rows]
    for name, rows in [*plans, ("**all**", every)]:
        hours = hours_of(rows)
        missing = sum(r.runs for r in rows if r.gpu_hours is None)
        runs = f"{sum(r.runs for r in rows)}" + (f" ({missing} not counted)" if missing else "")
        lines.append(f"| {name} | {runs} | {hours:,.0f} | {short(hours / 24)} | {short(hours / gpus / 24)} |")
    return "\n".join(lines)


def command_line() -> argparse.ArgumentParser:
    """The command line (see the module's docstring)."""
    parser = command_parser(__spec__.name, __doc__)
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="the sweep's overrides")
    parser.add_argument("-m", "--multirun", action="store_true", help="optional: a sweep is planned as one")
    parser.add_argument(
        "--gpu", default=DEFAULT_GPU, help=f"one of {', '.join(GPUS)} (default {DEFAULT_GPU})"
    )
    parser.add_argument(
        "--mfu",
        type=float,
        default=DEFAULT_MFU,
        help=f"model-FLOP utilisation (default {DEFAULT_MFU}: {MFU_SOURCE})",
    )
    parser.add_argument(
        "--launch-us",
        type=float,
        default=None,
        help=f"host µs per kernel launch (default: --measured's, else {LAUNCH_S * 1e6:g})",
    )
    parser.add_argument(
        "--gpus", type=int, default=8, help="GPUs the sweep runs on at once, for its wall time"
    )
    parser.add_argument(
        "--measured", type=Path, help="a launch.tools.gpu_check JSON: step times used instead of the MFU"
    )
    parser.add_argument(
        "--all", action="store_true", help="every paper table (the overrides join each) and their total"
    )
    parser.add_argument(
        "--references", action="store_true", help="the reference rows against their published costs"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Print the plan; one ``error:`` line and 2 on bad input (Hydra's grammar and composition
    errors with their type)."""
    return run_command(
        command_line(),
        print_plan,
        argv,
        intermixed=True,
        expected=(OSError, json.JSONDecodeError),
        named=(Exception,),
    )


def print_plan(args: argparse.Namespace) -> int:
    """The command's work: the sweeps' costs computed, then tabled."""
    from src.precheck import precheck

    if args.gpu not in GPUS:
        raise ConfigError(f"--gpu {args.gpu}: not in the table; one of {', '.join(GPUS)}")
    if not 0 < args.mfu <= 1 or args.gpus < 1 or (args.launch_us is not None and args.launch_us < 0):
        raise ConfigError("--mfu is a fraction in (0, 1], --gpus at least 1 and --launch-us at least 0")
    measured = json.loads(args.measured.read_text()) if args.measured else None
    if measured is not None and (not isinstance(measured, dict) or measured.get("dry")):
        raise ConfigError(
            f"--measured {args.measured}: not a real launch.tools.gpu_check result (a --dry one times "
            "tiny shapes): run python -m launch.tools.gpu_check on a CUDA GPU"
        )
    launch_s = measured_launch(measured) or LAUNCH_S
    if args.launch_us is not None:
        launch_s = args.launch_us * 1e-6
    if args.references:
        print(references_table(args.mfu, launch_s))
        return 0
    if args.all:
        sweeps = [(name, [*overrides, *args.overrides]) for name, overrides in TABLES]
    else:
        sweeps = [(" ".join(each), each) for each in per_experiment(args.overrides)]
    costs: dict = {}
    plans = []
    for name, each in sweeps:
        precheck(["-m", *each])  # src.run's refusals: a key no config has (did you mean …), …
        plans.append((name, plan(each, args.gpu, args.mfu, measured, launch_s, costs)))
    cores = cpu_cores()
    on_cpu = False
    for name, rows in plans:
        if len(plans) > 1:
            print(f"\n## {name}\n")
        print(table(rows, args.gpus))
        if cpu_sized(rows):
            on_cpu = True
            print(f"\nOn this machine's CPU (one run a core, trainer.threads=1):\n\n{cpu_table(rows, cores)}")
    if len(plans) > 1:
        print(f"\n## total\n\n{totals(plans, args.gpus, args.gpu)}")
    source = f"measured step times ({measured.get('gpu', '?')}) where marked, else " if measured else ""
    peak = GPUS[args.gpu][0]
    print(
        f"\nGPU-hours: {source}FLOPs / ({args.gpu} {peak / 1e12:g} TFLOP/s × MFU {args.mfu:.3g})"
        f" + launches × {launch_s * 1e6:.3g} µs"
    )
    print(f"  {args.gpu}: {GPUS[args.gpu][1]}; MFU default {DEFAULT_MFU}: {MFU_SOURCE}")
    if on_cpu:
        fitted = ", ".join(r.name for r in CPU_REFERENCES)
        print(
            f"CPU time: steps × (FLOPs / {CPU_FLOP_S / 1e9:g} GFLOP/s + launches × {CPU_LAUNCH_S * 1e6:g} µs)"
            f" on one core, fitted to the suite's timed runs ({fitted}: --references); wall time at the"
            f" {cores} cores this process may use"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
