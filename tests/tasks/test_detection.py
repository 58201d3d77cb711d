"""Detection tasks: the COCO-shapes generator, the COCO loader on a fixture in the official
format, the mmdet config built from the suite's groups, the run record, exact resume, and the
embedded default's training run (slow).

Longer than 300 lines: the detection family end to end, on shared fixtures.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

pytest.importorskip("pycocotools")

from pycocotools.coco import COCO  # noqa: E402
from scipy import ndimage  # noqa: E402

from tasks.detection.shapes import CLASSES, ShapesSpec, ensure_coco_shapes, generated_with, write_coco_shapes  # noqa: E402,I001

SPEC = ShapesSpec(num_train=6, num_val=3, img_size=64, min_size=12, max_size=28, seed=3)


def test_shapes_annotations_describe_their_pictures(tmp_path):
    write_coco_shapes(tmp_path, SPEC)
    coco = COCO(str(tmp_path / "annotations" / "instances_train2017.json"))
    assert [c["name"] for c in coco.loadCats(coco.getCatIds())] == list(CLASSES)
    assert len(coco.getImgIds()) == SPEC.num_train and coco.getAnnIds()
    for ann in coco.loadAnns(coco.getAnnIds()):
        info = coco.loadImgs(ann["image_id"])[0]
        pixels = np.asarray(Image.open(tmp_path / "train2017" / info["file_name"]), dtype=float)
        assert pixels.shape == (SPEC.img_size, SPEC.img_size, 3)
        mask = coco.annToMask(ann).astype(bool)
        x, y, w, h = ann["bbox"]
        xy = np.asarray(ann["segmentation"][0]).reshape(-1, 2)
        assert np.allclose([x, y, x + w, y + h], [*xy.min(0), *xy.max(0)], atol=0.01)
        assert SPEC.min_size / 2 <= max(w, h) <= SPEC.max_size
        assert abs(mask.sum() - ann["area"]) <= w + h  # rasterised polygon vs its exact area
        rows, cols = np.nonzero(mask)
        assert (
            x - 1 <= cols.min()
            and cols.max() <= x + w + 1
            and y - 1 <= rows.min()
            and rows.max() <= y + h + 1
        )
        inside = ndimage.binary_erosion(mask, iterations=2)
        ring = ndimage.binary_dilation(mask, iterations=4) & ~ndimage.binary_dilation(mask, iterations=2)
        if inside.sum() >= 4 and ring.sum() >= 4:  # the shape is drawn there, in a contrasting colour
            assert np.linalg.norm(pixels[inside].mean(0) - pixels[ring].mean(0)) > 50
            assert pixels[inside].std(0).max() < 20


def test_shapes_are_deterministic_and_regenerated_only_for_a_new_spec(tmp_path):
    write_coco_shapes(tmp_path / "a", SPEC)
    write_coco_shapes(tmp_path / "b", SPEC)
    for name in (
        "annotations/instances_train2017.json",
        "annotations/instances_val2017.json",
        "val2017/000000000007.jpg",
    ):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    ann = tmp_path / "a" / "annotations" / "instances_val2017.json"
    ensure_coco_shapes(tmp_path / "a", SPEC)  # written without its spec: generated again, with it
    assert generated_with(tmp_path / "a") == SPEC
    stamp = ann.stat().st_mtime_ns
    ensure_coco_shapes(tmp_path / "a", SPEC)  # already there: untouched
    assert ann.stat().st_mtime_ns == stamp
    other = ShapesSpec(**{**vars(SPEC), "num_val": 2})
    with pytest.warns(UserWarning, match="generating again"):
        ensure_coco_shapes(tmp_path / "a", other)
    assert generated_with(tmp_path / "a") == other
    assert len(json.loads(ann.read_text())["images"]) == 2


# -- the rest needs the detection stack -------------------------------------------------------

mmdet = pytest.importorskip("mmdet")
pytest.importorskip("mmcv.ops")

from conftest import compose, run_cli  # noqa: E402
from hydra.utils import instantiate  # noqa: E402
from mmdet.datasets import CocoDataset  # noqa: E402
from mmdet.registry import DATASETS, MODELS  # noqa: E402
from mmdet.utils import register_all_modules  # noqa: E402
from mmengine.config import Config  # noqa: E402
from smoke.detection import OVERRIDES, SHAPES_AS, write_coco_fixture  # noqa: E402

from src.engine import train  # noqa: E402
from src.engine.record.files import read_metrics  # noqa: E402
from src.engine.record.recorder import Recorder  # noqa: E402
from src.errors import ConfigError, DataError  # noqa: E402
from tasks.detection.config import build_config  # noqa: E402
from tasks.detection.record import SuiteRecordHook  # noqa: E402

register_all_modules()


def test_coco_loader_reads_the_official_format(tmp_path):
    names = write_coco_fixture(tmp_path / "coco", SPEC)
    cfg = compose(["task=coco", *OVERRIDES["coco"], f"paths.data_dir={tmp_path}"], tmp_path / "out")
    task = instantiate(cfg.task)
    root = task.prepare_data(tmp_path)
    mm = build_config(task, cfg, tmp_path / "work", root)
    train_set = DATASETS.build(mm.train_dataloader.dataset)
    raw = json.loads((root / "annotations" / "instances_train2017.json").read_text())
    assert [c["id"] for c in raw["categories"]][:12] == [*range(1, 12), 13]  # COCO's ids skip 12
    classes = CocoDataset.METAINFO["classes"]
    annotated = {a["image_id"] for a in raw["annotations"]}
    assert len(train_set) == len(annotated)  # images without objects are filtered, as for COCO
    labels = set()
    for i in range(len(train_set)):
        info = train_set.get_data_info(i)
        anns = [a for a in raw["annotations"] if a["image_id"] == info["img_id"]]
        assert len(info["instances"]) == len(anns)
        for inst, ann in zip(info["instances"], anns, strict=True):
            x, y, w, h = ann["bbox"]
            assert inst["bbox"] == pytest.approx([x, y, x + w, y + h])
            assert classes[inst["bbox_label"]] == names[ann["category_id"]]
            assert inst["mask"] == ann["segmentation"]
            labels.add(inst["bbox_label"])
    assert labels <= {classes.index(n) for n in SHAPES_AS} and labels
    val_item = DATASETS.build(mm.val_dataloader.dataset)[0]
    assert tuple(val_item["inputs"].shape) == (3, SPEC.img_size, SPEC.img_size)


def test_missing_coco_files_stop_the_run_naming_them(tmp_path):
    cfg = compose(["task=coco", *OVERRIDES["coco"], f"paths.data_dir={tmp_path}"], tmp_path / "out")
    with pytest.raises(DataError) as error:
        train(cfg, tmp_path / "run")
    message = str(error.value)
    for wanted in ("annotations/instances_train2017.json", "annotations/instances_val2017.json", "train2017"):
        assert str(tmp_path / "coco" / wanted) in message
    assert "cocodataset.org" in message


def mm_config(tmp_path, *overrides: str):
    cfg = compose(["task=coco", *overrides], tmp_path / "out")
    return build_config(instantiate(cfg.task), cfg, tmp_path / "work", tmp_path / "coco")


def test_config_maps_the_papers_recipe_and_the_suites_groups(tmp_path):
    mm = mm_config(tmp_path)  # XCiT-S, the 3x schedule with multi-scale crops
    assert mm.train_cfg == dict(type="EpochBasedTrainLoop", max_epochs=36, val_interval=1)
    warmup, steps = mm.param_scheduler
    assert (warmup["type"], warmup["end"], warmup["by_epoch"]) == ("LinearLR", 1000, False)
    assert (steps["milestones"], steps["gamma"], steps["by_epoch"]) == ([27, 33], 0.1, True)
    assert mm.optim_wrapper.optimizer == dict(
        type="AdamW", lr=1e-4, weight_decay=0.05, betas=(0.9, 0.999), eps=1e-8
    )
    assert mm.model.neck.in_channels == [384] * 4  # XCiT-S12's width at every level (XCiT's pyramid)
    assert mm.model.backbone.out_blocks == [3, 5, 7, 11] and mm.model.backbone.attn["variant"] == "precond"
    assert mm.model.roi_head.bbox_head.num_classes == mm.model.roi_head.mask_head.num_classes == 80
    assert mm.train_dataloader.dataset.pipeline[3]["type"] == "RandomChoice"
    assert mm_config(tmp_path, "task.schedule=1x").param_scheduler[1]["milestones"] == [8, 11]
    assert mm_config(tmp_path, "trainer.max_epochs=24").param_scheduler[1]["milestones"] == [18, 22]
    short = mm_config(tmp_path, "task.schedule=1x", "trainer.max_steps=120", "trainer.val_every=40")
    assert short.train_cfg == dict(type="IterBasedTrainLoop", max_iters=120, val_interval=40)
    assert short.param_scheduler[1]["milestones"] == [80, 110] and not short.param_scheduler[1]["by_epoch"]
    tuned = mm_config(tmp_path, "optim=sgd", "trainer.clip_grad=1.0", "trainer.eval_batches=3")
    assert tuned.optim_wrapper.optimizer.type == "SGD" and tuned.optim_wrapper.clip_grad == dict(max_norm=1.0)
    assert tuned.val_dataloader.dataset.indices == 3 * tuned.val_dataloader.batch_size
    assert tuned.custom_hooks == [dict(type="CheckInvalidLossHook", interval=1)]  # trainer.nonfinite=stop
    # task=coco trains in bf16: the backbone and FPN under autocast (SuiteMaskRCNN), no loss scaler,
    # on the CPU as on a GPU; fp32 is mmdet's own MaskRCNN
    assert (mm.model.type, mm.model.precision) == ("SuiteMaskRCNN", "bf16")
    assert mm.optim_wrapper.type == "OptimWrapper"
    fp32 = mm_config(tmp_path, "trainer.precision=fp32")
    assert fp32.model.type == "MaskRCNN" and "precision" not in fp32.model
    with pytest.raises(ConfigError, match="adamw, momentum or sgd"):
        mm_config(tmp_path, "optim.opt=lamb")


def tiny_run(data_dir: Path, out: Path, *overrides: str):
    steps = ["trainer.max_steps=3", "trainer.val_every=1", "trainer.log_every=1", "trainer.monitor_every=2",
             "trainer.checkpoint_every=1", "trainer.eval_batches=1"]  # fmt: skip
    return compose(
        ["task=coco_shapes", *OVERRIDES["coco_shapes"], *steps, f"paths.data_dir={data_dir}", *overrides], out
    )


@pytest.mark.slow  # three short runs: about 30 s
def test_a_resumed_run_continues_as_the_uninterrupted_one(tmp_path, monkeypatch):
    straight = train(tiny_run(tmp_path, tmp_path), tmp_path / "straight")
    assert straight["steps"] == 3

    started = SuiteRecordHook.before_train_iter

    def killed_at_step_3(self, runner, batch_idx, data_batch=None):
        if runner.iter == 2:
            raise KeyboardInterrupt  # as a kill after step 2's checkpoint and validation
        started(self, runner, batch_idx, data_batch)

    monkeypatch.setattr(SuiteRecordHook, "before_train_iter", killed_at_step_3)
    with pytest.raises(KeyboardInterrupt):
        train(tiny_run(tmp_path, tmp_path), tmp_path / "resumed")
    assert (tmp_path / "resumed" / "checkpoints" / "last.pt").resolve().name == "iter_2.pth"
    monkeypatch.setattr(SuiteRecordHook, "before_train_iter", started)
    resumed = train(tiny_run(tmp_path, tmp_path), tmp_path / "resumed")

    # every row (losses, lr, κ, COCO metrics) as the uninterrupted run logged it; the clock aside
    rows = {name: without_clock(read_metrics(tmp_path / name)) for name in ("straight", "resumed")}
    assert {r["split"] for r in rows["straight"]} == {"train", "val", "monitor"}
    assert rows["resumed"] == rows["straight"]
    for key in ("steps", "final", "best", "params"):
        assert resumed[key] == straight[key], key


def without_clock(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "throughput"} for r in rows]


def test_the_dumped_config_is_a_plain_mmdet_config(tmp_path):
    overrides = ["trainer.max_steps=1", "attn=spectral", "trainer.precision=bf16"]  # task=coco's precision
    summary = train(tiny_run(tmp_path, tmp_path, *overrides), tmp_path / "run")
    cfg = Config.fromfile(str(tmp_path / "run" / "mmdet" / "config.py"))  # custom_imports included
    model = MODELS.build(cfg.model)
    assert type(model).__name__ == "SuiteMaskRCNN" and model.precision == "bf16"
    assert sum(p.numel() for p in model.parameters()) == summary["params"]
    assert [v.name for v in model.backbone.attention_variants] == ["spectral"]
    assert summary["metrics"] == ["coco/bbox_mAP", "coco/segm_mAP"] and summary["metric"] == "coco/bbox_mAP"


@pytest.mark.slow  # the embedded default: about 10 minutes on 2 CPU cores
@pytest.mark.minutes(6)
def test_embedded_default_learns_the_shapes(tmp_path):
    result = run_cli(
        [
            "task=coco_shapes",
            "attn=standard",
            f"paths.data_dir={tmp_path / 'data'}",
            f"paths.output_dir={tmp_path}",
        ],
        cwd=tmp_path,
        timeout=3600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = next(tmp_path.glob("runs/coco_shapes/xcit_micro_det/standard/seed=0*"))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["final"]["coco/bbox_mAP"] > 0.1 and summary["final"]["coco/segm_mAP"] > 0.1
    assert {r["split"] for r in read_metrics(run_dir)} == {"train", "val", "monitor"}


def test_a_validation_without_any_prediction_is_recorded_as_ap_zero(tmp_path):
    from types import SimpleNamespace

    from src.engine.record.files import RunRecord
    from src.engine.record.identity import Identity
    from src.engine.record.session import Opening, Session

    session = Session(RunRecord(tmp_path), Identity({}), Opening("fresh", "id"))
    hook = SuiteRecordHook(
        Recorder(session), "coco/bbox_mAP", "max", ["coco/bbox_mAP", "coco/segm_mAP"], 1, 0, 2
    )
    hook.after_val_epoch(SimpleNamespace(iter=4), metrics={})  # what mmdet returns for no box at all
    hook.after_val_epoch(SimpleNamespace(iter=8), metrics={"coco/bbox_mAP": 0.25, "coco/segm_mAP": 0.5})
    rows = read_metrics(tmp_path)
    assert rows[0] == {"step": 4, "split": "val", "coco/bbox_mAP": 0.0, "coco/segm_mAP": 0.0}
    assert hook.last_val == {"coco/bbox_mAP": 0.25, "coco/segm_mAP": 0.5}
    assert hook.best == {**hook.last_val, "step": 8}


@pytest.mark.slow  # two processes under torchrun: about a minute
def test_ddp_on_cpu_writes_one_record(tmp_path):
    import os
    import subprocess
    import sys

    from conftest import QUIET, ROOT

    steps = ["trainer.max_steps=2", "trainer.val_every=2", "trainer.log_every=1", "trainer.monitor_every=1"]
    data = [f"paths.data_dir={tmp_path / 'data'}", f"paths.output_dir={tmp_path}"]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    ddp = subprocess.run(  # the tiny sizes of experiment=smoke/coco (the folder name stays short)
        [*torchrun, "-m", "src.run", "experiment=smoke/coco", *steps, *data, *QUIET],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    run_dir = next(tmp_path.glob("runs/coco_shapes/**/summary.json")).parent
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["steps"] == 2 and "coco/segm_mAP" in summary["final"]
    rows = [(r["step"], r["split"]) for r in read_metrics(run_dir)]
    assert (
        sorted(rows)
        == sorted(set(rows))
        == [(1, "monitor"), (1, "train"), (2, "monitor"), (2, "train"), (2, "val")]
    )
    assert (run_dir / "checkpoints" / "last.pt").resolve().is_file()


# -- reading a user's data and the run's own files safely ----------------------------------------


def coco_task(tmp_path, *overrides: str):
    data = f"paths.data_dir={tmp_path}"
    cfg = compose(["task=coco", *OVERRIDES["coco"], data, *overrides], tmp_path / "out")
    return cfg, instantiate(cfg.task)


def train_dataset(tmp_path, *overrides: str):
    cfg, task = coco_task(tmp_path, *overrides)
    root = task.prepare_data(tmp_path)
    return DATASETS.build(build_config(task, cfg, tmp_path / "work", root).train_dataloader.dataset), task


@pytest.mark.parametrize("name", ["../../../etc/hostname", "/etc/hostname", "a/../../b.jpg", "C:\\x.jpg"])
def test_a_file_name_that_leaves_the_image_folder_is_refused_naming_the_image(tmp_path, name):
    write_coco_fixture(tmp_path / "coco", SPEC)
    ann = tmp_path / "coco" / "annotations" / "instances_train2017.json"
    raw = json.loads(ann.read_text())
    raw["images"][1]["file_name"] = name
    ann.write_text(json.dumps(raw))
    image_id = raw["images"][1]["id"]
    with pytest.raises(DataError, match=rf"image {image_id} has file_name .*which leaves the image folder"):
        train_dataset(tmp_path)


def test_categories_that_match_no_class_are_one_clear_error(tmp_path):
    write_coco_shapes(tmp_path / "coco", SPEC)  # square, circle, triangle: none of COCO's 80 names
    with pytest.raises(DataError) as error:
        train_dataset(tmp_path)
    message = str(error.value)
    assert "none of its 3 categories (square, circle, triangle) is one of the task's 80 classes" in message
    assert "task.classes=from_file" in message


def test_classes_from_file_train_a_users_own_coco_format_data(tmp_path):
    """A COCO-format data set of one's own, with its own categories, by one override."""
    write_coco_shapes(tmp_path / "coco", SPEC)
    dataset, task = train_dataset(tmp_path, "task.classes=from_file")  # declared: no `+` needed
    assert task.classes == CLASSES and dataset.metainfo["classes"] == CLASSES
    infos = [dataset.get_data_info(i) for i in range(len(dataset))]
    labels = {inst["bbox_label"] for info in infos for inst in info["instances"]}
    assert labels and labels <= {0, 1, 2}
    cfg, _ = coco_task(tmp_path, "task.classes=from_file", "trainer.max_steps=1", "trainer.val_every=1")
    summary = train(cfg, tmp_path / "run")
    assert summary["status"] == "completed" and summary["steps"] == 1
    mm = Config.fromfile(str(tmp_path / "run" / "mmdet" / "config.py"))
    assert mm.model.roi_head.bbox_head.num_classes == 3


class ReachesThroughGetattr:
    """Unpickled, calls ``getattr`` on an allowed type: the first step of reaching anything."""

    def __reduce__(self):
        import collections

        return (getattr, (collections.Counter, "fromkeys"))


def test_mmengine_checkpoints_load_without_getattr(tmp_path):
    """mmengine pickles its history buffers' statistics methods through ``getattr``; the suite's
    checkpoints hold them without, and the safe loader admits no such function."""
    from types import SimpleNamespace

    from mmengine.logging import MessageHub

    from src.engine.record.files import RunRecord
    from src.engine.record.identity import Identity
    from src.engine.record.session import Opening, Session
    from tasks.detection.checkpoints import mmengine_checkpoints_load, mmengine_globals

    assert getattr not in mmengine_globals() and not {eval, exec, __import__} & set(mmengine_globals())
    hub = MessageHub.get_instance(f"test_{tmp_path.name}")
    for value in (1.0, 2.0, 4.0):
        hub.update_scalar("train/loss", value)
    saved = {"meta": {"iter": 3}, "message_hub": hub.state_dict()}
    torch.save({"meta": {}, "message_hub": hub.state_dict()}, tmp_path / "as_mmengine_saves.pth")
    session = Session(RunRecord(tmp_path), Identity({"a": 1}), Opening("fresh", "id"))
    SuiteRecordHook(Recorder(session), "coco/bbox_mAP", "max", [], 1, 0, 2).before_save_checkpoint(
        SimpleNamespace(iter=3), saved
    )
    torch.save(saved, tmp_path / "suite.pth")
    torch.save({"meta": ReachesThroughGetattr()}, tmp_path / "crafted.pth")
    with mmengine_checkpoints_load():
        loaded = torch.load(tmp_path / "suite.pth", weights_only=True)
        with pytest.raises(Exception, match="GLOBAL getattr was not an allowed global"):
            torch.load(tmp_path / "crafted.pth", weights_only=True)
        with pytest.raises(Exception, match="GLOBAL mmengine.logging.history_buffer.HistoryBuffer"):
            torch.load(tmp_path / "as_mmengine_saves.pth", weights_only=True)
    resumed = MessageHub.get_instance(f"resumed_{tmp_path.name}")
    resumed.load_state_dict(loaded["message_hub"])
    assert resumed.get_scalar("train/loss").mean() == pytest.approx(7 / 3)
    assert resumed.get_scalar("train/loss").current() == 4.0
    assert loaded["meta"]["suite"]["record"]["identity"] == Identity({"a": 1}).hash


def test_a_checkpoint_pointer_outside_the_run_folder_is_ignored(tmp_path):
    from tasks.detection.task import latest_checkpoint

    work = tmp_path / "run" / "mmdet"
    work.mkdir(parents=True)
    outside = tmp_path / "elsewhere.pth"
    outside.write_bytes(b"not this run's")
    (work / "last_checkpoint").write_text(str(outside))
    with pytest.warns(UserWarning, match="points outside the run folder"):
        assert latest_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt", work) is None
    inside = work / "iter_2.pth"
    inside.write_bytes(b"this run's")
    (work / "last_checkpoint").write_text(str(inside))
    assert latest_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt", work) == inside.resolve()
