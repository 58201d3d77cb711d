"""COCO instance segmentation with Mask R-CNN, trained by mmengine's Runner.

The shared loop does not fit mmdetection: the task overrides :meth:`src.engine.task.Task.fit`,
which builds the mmdet config from the Hydra config (:mod:`.config`), hands it to mmengine's
``Runner`` and returns what the run reached; the hook of :mod:`.record` writes the record's
rows on the way, through the run's :class:`src.engine.record.recorder.Recorder` as the shared loop
does, and the pipeline (:func:`src.engine.experiment.train`) writes its summary and failures.

Data: COCO 2017 in its official layout, ``${paths.data_dir}/<folder>/annotations/
instances_{train,val}2017.json`` and ``<folder>/{train,val}2017/<image>``; COCO shapes
(:class:`CocoShapes`) is generated on first use in the same layout.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from torch import Tensor

from src.engine.task import Run, Task
from src.errors import ConfigError, DataError

from .annotations import category_names
from .ops import require_cuda_ops
from .shapes import CLASSES as SHAPE_CLASSES
from .shapes import ShapesSpec, ensure_coco_shapes

FROM_FILE = "from_file"  # task.classes: the categories of the training annotation file

#: the heads and proposals of mmdet's Mask R-CNN R50-FPN
DETECTOR_DEFAULTS = {
    "neck_channels": 256,  # FPN width, RPN and RoI feature channels
    "fc_channels": 1024,  # the box head's two shared FC layers
    "mask_channels": 256,  # the mask head's four convolutions
    "anchor_scale": 8,  # anchor side = scale × level stride (4 … 64)
    "train_proposals": 1000,  # RPN proposals kept per image in training
    "test_proposals": 1000,
    "roi_samples": 512,  # RoIs sampled per image for the box and mask heads
}

INSTALL_HINT = (
    "the detection tasks need the `detection` extra (mmcv 2.1.0 with its compiled ops, mmdet 3.3.0, "
    "mmengine, pycocotools): run `make detection` (builds mmcv once, about 30 minutes on 2 cores, "
    "kept in a cache) or `make install DETECTION=1`; docs/tasks.md, Detection (COCO), says more"
)


def require_detection_stack(task: str = "coco") -> None:
    """Fail with one message when mmdet or mmcv's compiled ops are missing, or when torch sees a GPU
    and mmcv's ops cannot run on it (:func:`.ops.require_cuda_ops`)."""
    try:
        import mmdet.apis  # noqa: F401
        from mmcv.ops import RoIAlign  # noqa: F401
    except ImportError as e:
        raise ConfigError(f"{INSTALL_HINT} ({type(e).__name__}: {e})") from e
    require_cuda_ops(task)


class CocoInstanceSegmentation(Task):
    """Mask R-CNN + FPN on a registered backbone (``conf/backbone/*_det.yaml``), COCO box and
    mask AP from pycocotools. ``metric`` (``coco/bbox_mAP``) is the main one; ``coco/segm_mAP``
    is the other number of the papers' table (``metrics``)."""

    metric = "coco/bbox_mAP"
    metrics = ("coco/bbox_mAP", "coco/segm_mAP")

    def __init__(
        self,
        name: str,
        input: str,
        folder: str = "coco",
        classes: Sequence[str] | str | None = None,
        splits: Mapping[str, str] | None = None,
        metric: str | None = None,
        batch_size: int = 2,
        eval_batch_size: int = 1,
        schedule: str = "3x",
        augment: str = "ms_crop",
        img_scale: Sequence[int] = (1333, 800),
        warmup_iters: int = 1000,
        warmup_ratio: float = 0.001,
        min_size: int = 32,
        detector: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(name, input, batch_size, eval_batch_size, metric)
        self.folder, self.schedule, self.augment, self.img_scale = folder, schedule, augment, tuple(img_scale)
        self.warmup_iters, self.warmup_ratio, self.min_size = warmup_iters, warmup_ratio, min_size
        self.splits = dict(_plain(splits) or {"train": "train2017", "val": "val2017"})
        if isinstance(classes, str) and classes != FROM_FILE:
            raise ConfigError(
                f"task.classes={classes!r}: give a list of category names, {FROM_FILE} (the categories of "
                "the training annotation file), or null (COCO's 80)"
            )
        self._classes = classes if classes == FROM_FILE else (tuple(classes) if classes else None)
        unknown = set(_plain(detector) or {}) - set(DETECTOR_DEFAULTS)
        if unknown:
            raise ConfigError(
                f"task.detector: unknown option(s) {', '.join(sorted(unknown))}; "
                f"valid: {', '.join(DETECTOR_DEFAULTS)}"
            )
        self.detector = {**DETECTOR_DEFAULTS, **(_plain(detector) or {})}

    @property
    def classes(self) -> tuple[str, ...]:
        """The category names, in label order (default: COCO's 80, as mmdet lists them;
        ``from_file``: the training annotation file's, by id, once :meth:`prepare_data` read it)."""
        if self._classes == FROM_FILE:
            raise ConfigError("task.classes=from_file is read from the annotation file by prepare_data")
        if self._classes is None:
            from mmdet.datasets import CocoDataset

            return tuple(CocoDataset.METAINFO["classes"])
        return self._classes

    def ann_file(self, split: str) -> str:
        return f"annotations/instances_{self.splits[split]}.json"

    def image_folder(self, split: str) -> str:
        return self.splits[split]

    def prepare_data(self, data_dir: Path) -> Path:
        """The data root, checked: one message naming every missing file and the official layout."""
        root = Path(data_dir) / self.folder
        wanted = [root / self.ann_file(s) for s in self.splits] + [
            root / self.image_folder(s) for s in self.splits
        ]
        missing = [str(p) for p in wanted if not (p.is_file() if p.suffix == ".json" else p.is_dir())]
        if missing:
            raise DataError(
                f"missing COCO files: {', '.join(missing)}. Expected the official COCO 2017 release "
                f"under {root}: annotations_trainval2017.zip unpacked to "
                "annotations/instances_{train,val}2017.json, train2017.zip to train2017/ and val2017.zip "
                "to val2017/ (https://cocodataset.org/#download). Set paths.data_dir (or DATA_DIR) to "
                f"the folder that holds {self.folder}/"
            )
        if self._classes == FROM_FILE:
            self._classes = tuple(category_names(root / self.ann_file("train")))
            if not self._classes:
                wanted = root / self.ann_file("train")
                raise DataError(f"{wanted} lists no categories (task.classes=from_file)")
        return root

    # -- what a plan asks (tasks/detection/planning.py) ---------------------------------------

    #: COCO train2017's images (instances_train2017.json), for a plan
    train_size: int | None = 118_287

    def example_inputs(self, device: str | torch.device = "cpu") -> tuple[Tensor]:
        """One typical training image as the recipe resizes it (:func:`.planning.typical_image`)."""
        from .planning import typical_image

        height, width = typical_image(self.img_scale, self.augment)
        return (torch.zeros(1, 3, height, width, device=device),)  # (1, 3, H, W)

    def planned_model(self, cfg: DictConfig, device: str = "meta") -> tuple[Any, str]:
        """mmdet's Mask R-CNN of the run, the variant in its backbone, computing in its parts
        (:func:`.planning.planned_detector`); classes: the task's, or COCO's 80 where they are
        COCO's or read from the annotation file (unknown without it)."""
        from .planning import planned_detector

        classes = len(self._classes) if isinstance(self._classes, tuple) else 80
        return planned_detector(cfg, classes, self.detector, device)

    def fit(self, run: Run) -> dict[str, Any]:
        """Train and validate with mmengine's Runner; what the run reached, for ``summary.json``."""
        require_detection_stack(self.name)  # before the Runner, the data and the first step
        from mmengine.runner import Runner

        import src.models.detection  # noqa: F401  registers the backbones

        from .checkpoints import mmengine_checkpoints_load
        from .config import build_config
        from .record import SuiteRecordHook

        cfg, dist, record = run.cfg, run.dist, run.session.record
        run.recorder.start()
        root = self.prepare_data(Path(cfg.paths.data_dir)).resolve()
        work_dir = (record.dir / "mmdet").resolve()
        resume_from = latest_checkpoint(record.checkpoint, work_dir)
        mm = build_config(self, cfg, work_dir, root, resume_from)
        mm.launcher = "pytorch" if dist.world > 1 else "none"
        # mmengine's logger, message hub and visualizer are process-wide instances found by name:
        # a second run in the same process must not write through the first one's
        mm.experiment_name = mm.visualizer.name = f"{self.name}_{time.time_ns()}"
        if dist.main:
            work_dir.mkdir(parents=True, exist_ok=True)
            mm.dump(str(work_dir / "config.py"))
        hook = SuiteRecordHook(
            run.recorder,
            self.metric,
            self.metric_mode,
            self.metrics,
            log_every=cfg.trainer.log_every,
            monitor_every=cfg.trainer.monitor_every or 0,
            images_per_iter=self.batch_size * dist.world,
            resume_from=resume_from,
        )
        started = time.monotonic()
        with mmengine_checkpoints_load():
            runner = Runner.from_cfg(mm)
            runner.register_hook(hook)
            runner.train()
        model = runner.model.module if hasattr(runner.model, "module") else runner.model
        return {
            "steps": runner.iter,
            "final": hook.last_val,
            "best": hook.best,
            "metrics": list(self.metrics),
            "wall_s": hook.elapsed(),
            "session_s": time.monotonic() - started,
            "steps_per_epoch": len(runner.train_dataloader),
            "params": sum(p.numel() for p in model.parameters()),
            "device": str(next(model.parameters()).device),
            "work_dir": "mmdet",
        }


class CocoShapes(CocoInstanceSegmentation):
    """Squares, circles and triangles in COCO's format (:mod:`.shapes`), generated on first use
    into ``${paths.data_dir}/<folder>`` (again when ``generate`` changes): the detection family's
    embedded default, a tiny Mask R-CNN learns it on a CPU in minutes."""

    def __init__(self, generate: Mapping[str, int] | None = None, **kwargs: Any) -> None:
        if kwargs.get("classes") is None:
            kwargs["classes"] = SHAPE_CLASSES
        super().__init__(**kwargs)
        self.spec = ShapesSpec(**(_plain(generate) or {}))

    @property
    def train_size(self) -> int:
        """The generated training images (``generate.num_train``)."""
        return self.spec.num_train

    def prepare_data(self, data_dir: Path) -> Path:
        ensure_coco_shapes(Path(data_dir) / self.folder, self.spec)
        return super().prepare_data(data_dir)


def latest_checkpoint(link: Path, work_dir: Path) -> Path | None:
    """The checkpoint a rerun resumes from: ``checkpoints/last.pt``'s target, or mmengine's own
    pointer when it is newer (a kill between mmengine's save and the link's update); either
    only when it lies inside the run's ``mmdet/`` folder."""
    from .record import pointed_checkpoint

    linked = link.resolve() if link.exists() else None
    existing = [
        p
        for p in (linked, pointed_checkpoint(work_dir))
        if p is not None and p.is_file() and p.is_relative_to(work_dir.resolve())
    ]
    return max(existing, key=lambda p: p.stat().st_mtime_ns) if existing else None


def _plain(value: Any) -> Any:
    return OmegaConf.to_container(value, resolve=True) if isinstance(value, DictConfig) else value
