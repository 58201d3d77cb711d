"""The mmdet config of a run: mmdetection's own Mask R-CNN + FPN, COCO data and runtime files,
with the backbone, attention variant, recipe and trainer settings of the Hydra config.

The base files are mmdet's (``_base_/models/mask-rcnn_r50_fpn.py``,
``_base_/datasets/coco_instance.py``, ``_base_/default_runtime.py``), read from the installed
package by path (mmengine's ``mmdet::`` scope needs ``pkg_resources``, gone from recent
setuptools). The result is a plain mmdet config: the task dumps it as ``mmdet/config.py`` in
the run folder, where ``Config.fromfile`` + ``MODELS.build`` (or mmdet's ``tools/train.py``)
read it back.

How the suite's groups map onto it:

* ``optim`` (timm's names) -> ``optim_wrapper``: AdamW (``adamw``) or SGD (``momentum``/``sgd``)
  with the group's lr, weight decay, betas/momentum; no weight decay on norms, biases, position
  embeddings and Swin's relative position tables (as timm and Swin's detection configs do);
  ``trainer.clip_grad`` -> ``clip_grad``, ``trainer.accumulate`` -> ``accumulative_counts``.
  A step is one of mmengine's iterations (one batch per process), also under accumulation.
* ``trainer.precision=bf16`` (``task=coco``'s default) -> the model is
  :class:`src.models.detection.SuiteMaskRCNN`: the backbone and FPN under bf16 autocast, the
  heads, RoIAlign and NMS in fp32, no loss scaler; on the CPU and the GPU alike (its docstring
  says why not mmengine's ``AmpOptimWrapper``). ``fp32`` keeps mmdet's own ``MaskRCNN``.
* ``trainer.nonfinite=stop`` -> mmdet's ``CheckInvalidLossHook`` (the run stops at the first
  NaN/Inf loss); ``skip`` and ``trainer.ema`` are refused.
* The schedule is the task's (the papers' step schedule, not the ``sched`` group): linear
  warm-up over ``warmup_iters``, then ×0.1 at the schedule's milestones: ``schedule=1x`` at 8
  and 11 of 12 epochs, ``3x`` at 27 and 33 of 36 (``conf/task/coco.yaml`` sets
  ``trainer.max_epochs`` to the schedule's length). Another ``trainer.max_epochs`` scales the
  milestones with it; ``trainer.max_steps`` trains that many iterations instead (mmengine's
  ``IterBasedTrainLoop``, milestones at the same fractions of the run).
* Epoch-based runs validate every ``trainer.val_every_epochs`` epochs (default 1) and save a
  checkpoint at every epoch end; iteration-based runs validate every ``trainer.val_every`` and
  save every ``trainer.checkpoint_every`` iterations. ``trainer.eval_batches`` validates on the
  first ``eval_batches × eval_batch_size`` images only.

Longer than the suite's 300 lines: it is one translation, Hydra groups to one mmdet config;
its parts (model, data, schedule, runtime) each read the others' settings.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from src import attention
from src.errors import ConfigError

SCHEDULES = {"1x": (12, (8, 11)), "3x": (36, (27, 33))}
# Multi-scale training of Swin's and XCiT's COCO recipes: shorter side 480-800 in steps of 32.
MS_SCALES = [(1333, short) for short in range(480, 801, 32)]
NO_DECAY_KEYS = ("pos_embed", "cls_token", "relative_position_bias_table", "absolute_pos_embed")


def mmdet_base_dir() -> Path:
    """Where the installed mmdet keeps its ``configs/_base_`` files."""
    import mmdet

    return Path(mmdet.__file__).parent / ".mim" / "configs" / "_base_"


def base_config():
    """mmdet's Mask R-CNN R50-FPN model, COCO instance data and default runtime, merged."""
    from mmengine.config import Config

    base = mmdet_base_dir()
    cfg = Config(format_python_code=False)  # mmengine's yapf pass costs a second per dump, and it dumps often
    for name in ("models/mask-rcnn_r50_fpn.py", "datasets/coco_instance.py", "default_runtime.py"):
        cfg.merge_from_dict(Config.fromfile(base / name).to_dict())
    return cfg


def build_config(task, cfg: DictConfig, work_dir: Path, data_root: Path, resume_from: Path | None = None):
    """The mmengine ``Config`` of one run of ``task`` (a :class:`.CocoInstanceSegmentation`)."""
    from src.models.detection import out_channels

    from . import dataset  # noqa: F401  registers SuiteCocoDataset, which the config names

    mm = base_config()
    trainer = cfg.trainer
    backbone = backbone_dict(cfg)
    num_classes = len(task.classes)

    mm.custom_imports = dict(
        imports=["src.models.detection", "tasks.detection.dataset"], allow_failed_imports=False
    )
    mm.data_root = str(data_root)
    mm.model = detector(mm.model, backbone, out_channels(backbone), num_classes, task.detector)
    if trainer.precision == "bf16":
        mm.model.update(type="SuiteMaskRCNN", precision="bf16")
    mm.train_dataloader = train_dataloader(task, data_root, trainer, iter_based=trainer.max_steps is not None)
    mm.val_dataloader = val_dataloader(task, data_root, trainer)
    mm.test_dataloader = copy.deepcopy(mm.val_dataloader)
    mm.val_evaluator = dict(
        type="CocoMetric", ann_file=str(data_root / task.ann_file("val")), metric=["bbox", "segm"]
    )
    mm.test_evaluator = copy.deepcopy(mm.val_evaluator)
    mm.optim_wrapper = optim_wrapper(cfg.optim, trainer)
    loop, schedulers, by_epoch = schedule(task, trainer)
    mm.train_cfg, mm.param_scheduler = loop, schedulers
    mm.val_cfg, mm.test_cfg = dict(type="ValLoop"), dict(type="TestLoop")

    mm.default_hooks.logger = dict(type="LoggerHook", interval=trainer.log_every)
    mm.default_hooks.checkpoint = dict(
        type="CheckpointHook",
        by_epoch=by_epoch,
        interval=1 if by_epoch else trainer.checkpoint_every,
        max_keep_ckpts=1,
        save_last=True,
    )
    mm.log_processor = dict(type="LogProcessor", window_size=trainer.log_every, by_epoch=by_epoch)
    mm.log_level = "WARNING" if trainer.progress == "none" else "INFO"
    gpu = trainer.device != "cpu" and torch.cuda.is_available()
    mm.env_cfg.dist_cfg = dict(backend="nccl" if gpu else "gloo")  # when the suite has not started DDP itself
    if not gpu:  # mmengine's default DDP wrapper passes a GPU index, which a CPU module refuses
        mm.model_wrapper_cfg = dict(
            type="MMDistributedDataParallel", device_ids=None, broadcast_buffers=False
        )
    if gpu and torch.distributed.is_available() and torch.distributed.is_initialized():
        mm.sync_bn = "torch"  # XCiT's BatchNorms synchronised across processes, as XCiT's recipe does
    mm.randomness = dict(seed=cfg.seed, deterministic=False)
    mm.work_dir = str(work_dir)
    mm.resume = resume_from is not None
    mm.load_from = str(resume_from) if resume_from is not None else None
    if trainer.compile:
        mm.compile = True
    mm.custom_hooks = []
    if trainer.nonfinite == "stop":  # mmdet's own check: stops the run at the first NaN/Inf loss
        mm.custom_hooks.append(dict(type="CheckInvalidLossHook", interval=1))
    check_trainer(trainer)
    return mm


def check_trainer(trainer: DictConfig) -> None:
    """Refuse the shared loop's settings that mmengine's Runner cannot honour here."""
    unsupported = {
        "trainer.ema": trainer.ema,
        "trainer.nonfinite=skip": trainer.nonfinite == "skip",
        "trainer.device=cpu on a machine with a GPU (mmengine takes the GPU; hide it with "
        "CUDA_VISIBLE_DEVICES=)": trainer.device == "cpu" and torch.cuda.is_available(),
    }
    refused = [name for name, value in unsupported.items() if value]
    if refused:
        raise ConfigError(f"the detection tasks (mmengine's Runner) do not support {'; '.join(refused)}")


def backbone_dict(cfg: DictConfig) -> dict[str, Any]:
    """The registered backbone's config: ``backbone.model`` plus the run's attention variant."""
    model = OmegaConf.to_container(cfg.backbone.model, resolve=True)
    if "type" not in model:
        raise ConfigError(
            f"backbone={cfg.backbone.name}: a detection backbone's model needs a `type` registered in "
            "mmdet's MODELS (SuiteViT, SuiteXCiT, SuiteSwin)"
        )
    return {**model, "attn": attention.config.as_dict(cfg.attn)}


def detector(base: Mapping, backbone: dict, channels: list[int], num_classes: int, sizes: Mapping) -> dict:
    """mmdet's Mask R-CNN with ``backbone``, its FPN fed ``channels``, heads sized by ``sizes``."""
    model = copy.deepcopy(base.to_dict() if hasattr(base, "to_dict") else dict(base))
    width = sizes["neck_channels"]
    model["backbone"] = backbone
    model["neck"].update(in_channels=channels, out_channels=width)
    rpn = model["rpn_head"]
    rpn.update(in_channels=width, feat_channels=width)
    rpn["anchor_generator"]["scales"] = [sizes["anchor_scale"]]
    roi = model["roi_head"]
    roi["bbox_roi_extractor"]["out_channels"] = width
    roi["mask_roi_extractor"]["out_channels"] = width
    roi["bbox_head"].update(in_channels=width, fc_out_channels=sizes["fc_channels"], num_classes=num_classes)
    roi["mask_head"].update(
        in_channels=width, conv_out_channels=sizes["mask_channels"], num_classes=num_classes
    )
    train, test = model["train_cfg"], model["test_cfg"]
    # proposals kept per image after NMS, and boxes entering NMS (twice that in training, as mmdet's)
    train["rpn_proposal"].update(nms_pre=2 * sizes["train_proposals"], max_per_img=sizes["train_proposals"])
    test["rpn"].update(nms_pre=sizes["test_proposals"], max_per_img=sizes["test_proposals"])
    train["rcnn"]["sampler"]["num"] = sizes["roi_samples"]
    return model


def train_pipeline(task) -> list[dict]:
    """Load, flip, resize (one scale, multi-scale, or multi-scale with crops), pack."""
    load = [dict(type="LoadImageFromFile"), dict(type="LoadAnnotations", with_bbox=True, with_mask=True)]
    flip = dict(type="RandomFlip", prob=0.5)
    if task.augment == "single":
        resize = [dict(type="Resize", scale=tuple(task.img_scale), keep_ratio=True)]
    elif task.augment == "ms":
        resize = [dict(type="RandomChoiceResize", scales=MS_SCALES, keep_ratio=True)]
    elif task.augment == "ms_crop":  # Swin's and XCiT's 3x recipe (from DETR)
        crop = [
            dict(type="RandomChoiceResize", scales=[(1333, s) for s in (400, 500, 600)], keep_ratio=True),
            dict(
                type="RandomCrop", crop_type="absolute_range", crop_size=(384, 600), allow_negative_crop=True
            ),
            dict(type="RandomChoiceResize", scales=MS_SCALES, keep_ratio=True),
        ]
        resize = [
            dict(
                type="RandomChoice",
                transforms=[[dict(type="RandomChoiceResize", scales=MS_SCALES, keep_ratio=True)], crop],
            )
        ]
    else:
        raise ConfigError(f"task.augment={task.augment!r} is not one of single, ms, ms_crop")
    return [*load, flip, *resize, dict(type="PackDetInputs")]


def test_pipeline(task) -> list[dict]:
    return [
        dict(type="LoadImageFromFile"),
        dict(type="Resize", scale=tuple(task.img_scale), keep_ratio=True),
        dict(type="LoadAnnotations", with_bbox=True, with_mask=True),
        dict(
            type="PackDetInputs", meta_keys=("img_id", "img_path", "ori_shape", "img_shape", "scale_factor")
        ),
    ]


def dataset(task, data_root: Path, split: str, pipeline: list[dict], workers: int, **extra: Any) -> dict:
    return dict(
        type="SuiteCocoDataset",  # mmdet's CocoDataset, checked (tasks/detection/dataset.py)
        data_root=str(data_root),
        ann_file=task.ann_file(split),
        data_prefix=dict(img=task.image_folder(split) + "/"),
        metainfo=dict(classes=tuple(task.classes)),
        pipeline=pipeline,
        serialize_data=workers > 0,  # packed for sharing with worker processes; without them, no use
        **extra,
    )


def train_dataloader(task, data_root: Path, trainer: DictConfig, iter_based: bool) -> dict:
    data = dataset(
        task,
        data_root,
        "train",
        train_pipeline(task),
        trainer.num_workers,
        filter_cfg=dict(filter_empty_gt=True, min_size=task.min_size),
    )
    return dict(
        batch_size=task.batch_size,
        num_workers=trainer.num_workers,
        persistent_workers=trainer.num_workers > 0,
        sampler=dict(type="InfiniteSampler" if iter_based else "DefaultSampler", shuffle=True),
        batch_sampler=dict(type="AspectRatioBatchSampler"),
        dataset=data,
    )


def val_dataloader(task, data_root: Path, trainer: DictConfig) -> dict:
    extra = {"indices": trainer.eval_batches * task.eval_batch_size} if trainer.eval_batches else {}
    return dict(
        batch_size=task.eval_batch_size,
        num_workers=trainer.num_workers,
        persistent_workers=trainer.num_workers > 0,
        drop_last=False,
        sampler=dict(type="DefaultSampler", shuffle=False),
        dataset=dataset(
            task, data_root, "val", test_pipeline(task), trainer.num_workers, test_mode=True, **extra
        ),
    )


def optim_wrapper(optim: DictConfig, trainer: DictConfig) -> dict:
    """The suite's ``optim`` group (timm's names) as an mmengine optimizer wrapper."""
    name = optim.get("opt", "adamw")
    common = dict(lr=optim.lr, weight_decay=optim.get("weight_decay", 0.0))
    if name == "adamw":
        optimizer = dict(
            type="AdamW", betas=tuple(optim.get("betas", (0.9, 0.999))), eps=optim.get("eps", 1e-8)
        )
    elif name in ("momentum", "sgd"):
        optimizer = dict(type="SGD", momentum=optim.get("momentum", 0.9), nesterov=False)
    else:
        raise ConfigError(f"optim.opt={name!r}: the detection tasks take adamw, momentum or sgd")
    wrapper = dict(
        type="OptimWrapper",
        optimizer={**optimizer, **common},
        paramwise_cfg=dict(
            norm_decay_mult=0.0,
            bias_decay_mult=0.0,
            custom_keys={key: dict(decay_mult=0.0) for key in NO_DECAY_KEYS},
        ),
        accumulative_counts=trainer.accumulate,
    )
    if trainer.clip_grad:
        wrapper["clip_grad"] = dict(max_norm=trainer.clip_grad)
    return wrapper  # trainer.precision=bf16 is the model's (SuiteMaskRCNN), not the wrapper's


def schedule(task, trainer: DictConfig) -> tuple[dict, list[dict], bool]:
    """``(train_cfg, param_scheduler, by_epoch)``: warm-up then the step schedule (see the module)."""
    if task.schedule not in SCHEDULES:
        raise ConfigError(f"task.schedule={task.schedule!r} is not one of {', '.join(SCHEDULES)}")
    epochs, milestones = SCHEDULES[task.schedule]
    warmup = dict(type="LinearLR", start_factor=task.warmup_ratio, by_epoch=False, begin=0)
    if trainer.max_steps is not None:
        steps = int(trainer.max_steps)
        at = [round(steps * m / epochs) for m in milestones]
        loop = dict(type="IterBasedTrainLoop", max_iters=steps, val_interval=trainer.val_every or steps)
        steps_cfg = dict(type="MultiStepLR", by_epoch=False, begin=0, end=steps, milestones=at, gamma=0.1)
        return loop, [{**warmup, "end": min(task.warmup_iters, steps)}, steps_cfg], False
    if not trainer.max_epochs:
        raise ConfigError("the detection tasks need trainer.max_epochs or trainer.max_steps")
    total = int(trainer.max_epochs)
    at = [round(total * m / epochs) for m in milestones]
    loop = dict(type="EpochBasedTrainLoop", max_epochs=total, val_interval=int(trainer.val_every_epochs or 1))
    steps_cfg = dict(type="MultiStepLR", by_epoch=True, begin=0, end=total, milestones=at, gamma=0.1)
    return loop, [{**warmup, "end": task.warmup_iters}, steps_cfg], True
