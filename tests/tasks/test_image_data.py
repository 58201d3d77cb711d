"""ImageNet's data path on real-size images of every kind an ImageFolder holds: decoded, augmented
by the recipe's transforms, batched by the loop's stream and finished on the device.

A fixture of 16 images hides a crash of one draw in 700 (RandAugment's posterize at 0 bits under
Pillow 13); so the recipe's training transform is drawn 10,000 times here, through the task's own
``datasets()`` and the loop's :class:`~src.engine.loop.data.BatchStream`, from 500×375 JPEGs and the
other modes real folders hold (greyscale, CMYK, palette, EXIF-rotated, a PNG named ``.JPEG``, …).
"""

from __future__ import annotations

import io
import json
import math
import os
import random
import signal
from collections import Counter
from pathlib import Path

import numpy as np
import PIL
import pytest
import torch
from conftest import CONF, compose, make_image_folder, run_cli
from hydra.utils import instantiate
from omegaconf import OmegaConf
from PIL import Image
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD, auto_augment, create_transform

from src.engine import train
from src.engine.loop.data import BatchStream, Position
from src.engine.loop.preemption import Preempted
from src.engine.record import checkpoint
from src.engine.record.files import read_metrics
from tasks.classification import ImageNet, augment_ops, posterize, safe_augment

RECIPE_AUGMENT = "rand-m9-mstd0.5-inc1"  # conf/task/imagenet.yaml


def photo(rng: np.random.RandomState, width: int, height: int) -> Image.Image:
    """An RGB image with a photograph's statistics: smooth colour fields and sensor noise (what a
    JPEG of a real scene decodes like; uniform noise decodes several times slower)."""
    coarse = Image.fromarray((rng.rand(height // 25 + 2, width // 25 + 2, 3) * 255).astype(np.uint8))
    smooth = np.asarray(coarse.resize((width, height), Image.BICUBIC), dtype=np.float32)
    return Image.fromarray(np.clip(smooth + rng.randn(height, width, 3) * 8, 0, 255).astype(np.uint8))


def with_exif_rotation(image: Image.Image) -> bytes:
    """A JPEG stored sideways with EXIF orientation 6 (rotate 90° to view), as phones write them."""
    exif = Image.Exif()
    exif[0x0112] = 6
    out = io.BytesIO()
    image.transpose(Image.Transpose.ROTATE_90).save(out, "JPEG", quality=90, exif=exif)
    return out.getvalue()


#: every kind of file of a real ImageFolder: (name, writer of the bytes from a 500×375 photo)
KINDS = {
    "rgb.JPEG": lambda im: save(im, "JPEG"),
    "portrait.JPEG": lambda im: save(im.transpose(Image.Transpose.ROTATE_90), "JPEG"),
    "grey.JPEG": lambda im: save(im.convert("L"), "JPEG"),
    "cmyk.JPEG": lambda im: save(im.convert("CMYK"), "JPEG"),
    "progressive.JPEG": lambda im: save(im, "JPEG", progressive=True),
    "exif_rotated.JPEG": with_exif_rotation,
    "png_named.JPEG": lambda im: save(im, "PNG"),  # ImageNet's train set has one such file
    "palette.png": lambda im: save(im.convert("P"), "PNG"),
    "alpha.png": lambda im: save(im.convert("RGBA"), "PNG"),
    "grey16.png": lambda im: save(Image.fromarray(np.asarray(im.convert("L"), np.uint16) * 257), "PNG"),
    "small.JPEG": lambda im: save(im.resize((60, 45)), "JPEG"),  # smaller than the crop
    "panorama.JPEG": lambda im: save(im.resize((1200, 150)), "JPEG"),
}


def save(image: Image.Image, fmt: str, **options) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt, **({"quality": 90} if fmt == "JPEG" else {}), **options)
    return out.getvalue()


def write_real_size_folder(root: Path, copies: int = 2, classes: int = 3, seed: int = 0) -> Path:
    """``root/imagenet/{train,val}/<class>/*``: ``copies`` of every kind in :data:`KINDS` per split
    (different photos), dealt round ``classes`` class folders."""
    rng = np.random.RandomState(seed)
    for split in ("train", "val"):
        for copy in range(copies):
            for k, (name, write) in enumerate(KINDS.items()):
                folder = root / "imagenet" / split / f"n{(k + copy) % classes:08d}"
                folder.mkdir(parents=True, exist_ok=True)
                (folder / f"{copy}_{name}").write_bytes(write(photo(rng, 500, 375)))
    return root


@pytest.fixture(scope="module")
def real_size_folder(tmp_path_factory) -> Path:
    return write_real_size_folder(tmp_path_factory.mktemp("real_size"))


def recipe_task(data_dir: Path, tmp_path: Path, *overrides: str) -> ImageNet:
    """The ImageNet task of the real config (conf/task/imagenet.yaml), its classes cut to the folder's."""
    cfg = compose(["task=imagenet", "task.num_classes=3", f"paths.data_dir={data_dir}", *overrides], tmp_path)
    return instantiate(cfg.task)


# -- posterize: the op Pillow 13 refuses, done at the recipe's magnitude -------------------------


def test_posterize_keeps_no_bit_as_black_and_every_other_count_as_pillow():
    """0 bits kept: a black image of the same mode and size (Pillow < 13's mask and TensorFlow's
    shift by 8); 1-8 bits: exactly Pillow's ``ImageOps.posterize`` (timm's op)."""
    image = photo(np.random.RandomState(1), 64, 48)
    black = posterize(image, 0)
    assert (black.mode, black.size) == (image.mode, image.size) and black.getextrema() == ((0, 0),) * 3
    for bits in range(1, 9):
        assert np.array_equal(
            np.asarray(posterize(image, bits)), np.asarray(auto_augment.posterize(image, bits))
        )


def test_the_recipes_augmentation_is_timms_with_posterize_alone_replaced(tmp_path):
    """The composed recipe: the same ops, probabilities, magnitudes and noise as timm's
    ``rand-m9-mstd0.5-inc1``; only posterize's function is the suite's."""
    task = recipe_task(Path("unused"), tmp_path)
    assert task.augment["auto_augment"] == RECIPE_AUGMENT
    ours = augment_ops(task.transforms()[0])
    timms = augment_ops(
        create_transform(input_size=(3, 224, 224), is_training=True, auto_augment=RECIPE_AUGMENT)
    )
    assert [(o.name, o.prob, o.magnitude, o.magnitude_std) for o in ours] == [
        (o.name, o.prob, o.magnitude, o.magnitude_std) for o in timms
    ]
    assert [o.name for o in ours if o.aug_fn is posterize] == ["PosterizeIncreasing"]
    assert all(o.aug_fn is t.aug_fn for o, t in zip(ours, timms, strict=True) if o.aug_fn is not posterize)


def recipe_transform(size: int):
    """timm's training transform with the recipe's RandAugment, as timm builds it."""
    return create_transform(input_size=(3, size, size), is_training=True, auto_augment=RECIPE_AUGMENT)


def seeded(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


@pytest.mark.skipif(PIL.__version__ < "13", reason="Pillow < 13 posterizes 0 bits without complaint")
def test_a_seeded_draw_that_crashes_timms_transform_passes_the_suites():
    """Some seed in the first 5,000 makes timm's recipe transform raise Pillow 13's ``bits must be
    between or equal to 1 and 8`` (about one in 700); the suite's transform, drawing the same numbers,
    keeps 0 bits there and returns the recipe's image."""
    image = photo(np.random.RandomState(2), 48, 40)
    timms = recipe_transform(32)
    for seed in range(5000):
        seeded(seed)
        try:
            timms(image)
        except ValueError as error:
            assert "bits must be between" in str(error)
            break
    else:
        pytest.fail("no draw of 5,000 asked for 0 bits")
    ours = safe_augment(
        create_transform(input_size=(3, 32, 32), is_training=True, auto_augment=RECIPE_AUGMENT)
    )
    calls = count_posterize(ours)
    seeded(seed)
    out = ours(image)
    assert calls[0] == 1 and out.shape == (3, 32, 32)


def count_posterize(transform) -> Counter:
    """Wrap the suite's posterize inside ``transform`` to count its calls by bits kept."""
    calls: Counter = Counter()

    def counted(img, bits_to_keep, **kwargs):
        calls[bits_to_keep] += 1
        return posterize(img, bits_to_keep, **kwargs)

    for op in augment_ops(transform):
        if op.aug_fn is posterize:
            op.aug_fn = counted
    return calls


# -- every kind of file through the task's own data path ----------------------------------------


def test_every_kind_of_file_reads_to_the_recipes_uint8_image(real_size_folder, tmp_path):
    """Each file, once through the training and once through the evaluation transform: a uint8
    ``(3, 224, 224)`` image; normalised on the device, float32 with ImageNet's statistics."""
    task = recipe_task(real_size_folder, tmp_path)
    train, val = task.datasets(real_size_folder)
    assert len(train) == len(val) == 2 * len(KINDS)
    for dataset in (train, val):
        images = torch.stack([dataset[i][0] for i in range(len(dataset))])
        assert images.dtype == torch.uint8 and images.shape == (len(dataset), 3, 224, 224)
    normalised, _ = task.on_device((images, torch.zeros(len(images), dtype=torch.long)), train=False)
    mean, std = (torch.tensor(v).view(1, 3, 1, 1) for v in (IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD))
    expected = (images.float() / 255 - mean) / std
    assert normalised.dtype == torch.float32
    torch.testing.assert_close(normalised, expected, rtol=1e-5, atol=1e-5)


def configured_image_tasks() -> list[str]:
    """Every task config whose training transform is configured (``task.augment`` a mapping of
    timm's ``create_transform`` keys, RandAugment's fixed): the ones the 10,000-draw test draws from
    (``task=imagefolder`` sizes its own, DeiT's at ImageNet's size: the same transform). Read from the
    files (a global package each), so that collecting the tests composes nothing."""
    found = []
    for path in sorted((CONF / "task").glob("*.yaml")):
        task = OmegaConf.load(path).get("task") or {}
        augment = task.get("augment")
        fixed = OmegaConf.is_dict(augment) and not OmegaConf.is_interpolation(
            augment, "auto_augment"
        )  # imagefolder's is sized
        if str(task.get("_target_", "")).startswith("tasks.classification.") and fixed:
            found.append(path.stem)
    return found


def test_the_configured_image_transforms_are_the_ones_drawn_below():
    assert configured_image_tasks() == ["imagenet"]


@pytest.mark.slow  # 10,000 draws of real-size images on one core: about 100 s
@pytest.mark.parametrize("task_name", configured_image_tasks())
@pytest.mark.minutes(1.5)
def test_ten_thousand_draws_of_the_training_transform_never_raise(task_name, real_size_folder, tmp_path):
    """10,008 draws of the recipe's training transform (417 batches of the 24 files, each epoch
    reshuffled and reseeded) through ``datasets()`` and the loop's stream, finished on the device:
    none raises; every batch is uint8 ``(24, 3, 224, 224)`` from the loader and finite float32
    after :meth:`ImageNet.on_device`; and the draws include posterize at 0 bits, the one in ~700
    that crashed under Pillow 13."""
    cfg = compose([f"task={task_name}", "task.num_classes=3"], tmp_path)
    task = instantiate(cfg.task)
    train, _ = task.datasets(real_size_folder)
    calls = count_posterize(train.transform)
    stream, drawn, batches = BatchStream(train, len(train), seed=0), Counter(), 417
    size = cfg.task.img_size
    for _, (images, labels) in zip(range(batches), stream, strict=False):
        assert images.dtype == torch.uint8 and images.shape == (len(train), 3, size, size)
        drawn.update(labels.tolist())
        finished, _ = task.on_device((images, labels), train=True)
        assert finished.dtype == torch.float32 and torch.isfinite(finished).all()
    assert stream.position == Position(batches - 1, 1)  # each batch a whole epoch: every file, reseeded
    assert sum(drawn.values()) == batches * len(train) >= 10_000
    assert calls[0] >= 1, dict(calls)


# -- the loop on ImageNet-style data: resume, and a real run -----------------------------------


def stop_at(monkeypatch, step: int) -> None:
    """SIGTERM (a preemption) to this process during ``step`` of an ImageNet run."""

    def hook(self, model, at, loss):
        if at == step:
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(ImageNet, "after_backward", hook)


def comparable(run: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "throughput"} for r in read_metrics(run)]


def test_a_preempted_imagenet_run_resumes_to_what_an_uninterrupted_one_computes(
    tmp_path, tmp_path_factory, monkeypatch
):
    """The DeiT recipe on 270 small JPEGs, repeated augmentation on (DeiT's epoch: 256 images, 32
    steps of 8): preempted at step 5, then resumed, it logs and ends with what an uninterrupted run
    does, bit for bit: the same batches, copies, RandAugment, mixup and cutmix, and random erasing
    drawn on the device from the global RNGs that the checkpoint carries."""
    for key in [k for k in os.environ if k.startswith("SLURM_")]:
        monkeypatch.delenv(key)
    data = make_image_folder(tmp_path_factory.mktemp("data"), per_class=90)
    args = ["task=imagenet", "backbone=vit_micro", "task.img_size=32", "task.num_classes=3"]
    args += ["task.batch_size=8", "trainer.accumulate=1", "task.eval_batch_size=64", f"paths.data_dir={data}"]
    args += ["trainer.max_steps=12", "trainer.log_every=1", "trainer.val_every=6", "trainer.monitor_every=0"]
    args += ["trainer.checkpoint_every=1000", "trainer.threads=1", "trainer.num_workers=0"]
    cfg = compose(args, tmp_path / "outputs")
    assert cfg.task.repeated_aug == 3 and cfg.task.augment.re_prob > 0 and cfg.task.mixup
    whole = train(cfg, tmp_path / "whole")
    stop_at(monkeypatch, 5)
    with pytest.raises(Preempted):
        train(cfg, tmp_path / "stopped")
    monkeypatch.undo()
    resumed = train(cfg, tmp_path / "stopped")
    assert whole["steps_per_epoch"] == 32 and resumed["steps"] == 12
    assert whole["final"] == resumed["final"]
    assert comparable(tmp_path / "whole") == comparable(tmp_path / "stopped")
    a, b = (checkpoint.load(tmp_path / r / "checkpoints" / "last.pt")["model"] for r in ("whole", "stopped"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def write_training_folder(root: Path, train_images: int, val_images: int, seed: int = 0) -> Path:
    """``root/imagenet/{train,val}/<class>/*``, 10 classes: 500×375 photos as JPEGs, every 25th
    file another kind of :data:`KINDS` (greyscale, CMYK, palette, …). The photos are crops of a few
    large ones, so that 2,000 files take seconds to write."""
    rng = np.random.RandomState(seed)
    sources = [photo(rng, 1000, 750) for _ in range(4)]
    kinds = list(KINDS.values())
    for split, count in (("train", train_images), ("val", val_images)):
        for i in range(count):
            folder = root / "imagenet" / split / f"n{i % 10:08d}"
            folder.mkdir(parents=True, exist_ok=True)
            left, top = rng.randint(0, 500), rng.randint(0, 375)
            image = sources[i % 4].crop((left, top, left + 500, top + 375))
            data = kinds[(i // 25) % len(kinds)](image) if i % 25 == 0 else save(image, "JPEG")
            (folder / f"{split}_{i}.JPEG").write_bytes(data)
    return root


@pytest.mark.slow  # 200 steps of 16 real-size images through two worker processes: about 2 minutes
@pytest.mark.minutes(1)
def test_imagenet_trains_200_steps_on_2000_real_size_jpegs(tmp_path):
    """``python -m src.run task=imagenet``: the DeiT recipe as configured (224 px, RandAugment,
    mixup/cutmix, random erasing on the device, repeated augmentation, bf16) at batch 16 on 2,000
    real-size JPEGs with two worker processes, through two epochs (DeiT's: 1,792 images, 112 steps)
    and two validations: no error; 200 steps, every loss finite, and the stream where 200 steps of
    112 a epoch leave it."""
    data = write_training_folder(tmp_path / "data", 2000, 200)
    args = ["task=imagenet", "backbone=vit_micro", "backbone.model.patch_size=16", "task.num_classes=10"]
    args += [
        "task.batch_size=16",
        "trainer.accumulate=1",
        "task.eval_batch_size=50",
        f"paths.data_dir={data}",
    ]
    args += [
        "trainer.max_steps=200",
        "trainer.val_every=100",
        "trainer.log_every=20",
        "trainer.num_workers=2",
    ]
    done = run_cli(args, cwd=tmp_path, env={"OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    (summary_file,) = tmp_path.glob("outputs/**/summary.json")
    summary, run = json.loads(summary_file.read_text()), summary_file.parent
    assert (summary["status"], summary["steps"], summary["steps_per_epoch"]) == ("completed", 200, 112)
    losses = [r["train/loss"] for r in read_metrics(run) if r["split"] == "train"]
    assert len(losses) == 10 and all(math.isfinite(x) for x in losses)
    assert checkpoint.load(run / "checkpoints" / "last.pt")["loop"]["position"] == {"epoch": 1, "batch": 88}
    assert summary["final"]["val/acc"] >= 0 and "Traceback" not in done.stderr
