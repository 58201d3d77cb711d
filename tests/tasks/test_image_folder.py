"""``task=imagefolder``: the recipe sized to the data, the stratified split fixed across seeds, the
label, and a run through the real entry point on a folder of real-size JPEGs without ``val/``."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from conftest import QUIET, compose, main_in_process, src_run_here
from hydra.utils import instantiate
from omegaconf import OmegaConf
from PIL import Image

from launch.analysis.records import read_run
from launch.plan import steps_of
from launch.tools.flops import planned_task
from src.errors import DataError
from src.image_folder import TIERS, Recipe, hold_out, label, recipe, split
from tasks.classification import ImageFolderTask, files_digest

COLOURS = [(200, 60, 50), (60, 180, 70), (50, 70, 200)]  # one per class, so that a few steps learn


@pytest.fixture(scope="session")
def pets(tmp_path_factory) -> Path:
    """``pets/train/<class>/*.jpg``: 3 classes of 100-102 JPEGs of 160-300 px a side, each a noisy
    field of its class's colour; no ``val/``."""
    root = tmp_path_factory.mktemp("folders") / "pets"
    rng = np.random.RandomState(0)
    for c, name in enumerate(["cat", "dog", "eel"]):
        folder = root / "train" / name
        folder.mkdir(parents=True)
        for i in range(100 + c):
            w, h = rng.randint(160, 300, size=2)
            pixels = np.asarray(COLOURS[c])[None, None, :] + rng.randn(h, w, 3) * 40
            Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(folder / f"{i}.jpg", quality=85)
    return root


# -- the sizing rule ------------------------------------------------------------------------------


def test_the_recipe_is_sized_by_the_images_and_the_workers_by_the_device():
    """A few hundred images: batch 16, 300 epochs (capped; about 100k images seen), crop and flip
    only, no workers, lr 1e-3 · √(16/128). ImageNet's size: batch 128, 10 epochs, DeiT's
    augmentation, lr 1e-3, 8 workers on a GPU with 16 CPUs, 2 on a CPU, never more than the CPUs
    less one. The learning rate grows as the square root of the batch (timm's rule for AdamW)."""
    assert recipe(303, gpu=False, cpus=2) == Recipe(
        16, 300, 15, None, 0.0, 0.0, 0.0, 0, 1e-3 * math.sqrt(16 / 128)
    )
    assert recipe(1_281_167, gpu=True, cpus=16) == Recipe(
        128, 10, 1, "rand-m9-mstd0.5-inc1", 0.25, 0.8, 1.0, 8, 1e-3
    )
    assert recipe(1_281_167, gpu=False, cpus=16).num_workers == 2
    assert recipe(1_281_167, gpu=True, cpus=4).num_workers == 3
    assert recipe(2_000, gpu=False, cpus=2) == Recipe(
        64, 50, 2, None, 0.0, 0.0, 0.0, 1, 1e-3 * math.sqrt(64 / 128)
    )
    assert recipe(20_000, gpu=True, cpus=16).auto_augment == TIERS[1][1]
    sizes = [10, 300, 1_000, 5_000, 20_000, 100_000, 1_000_000]
    sized = [recipe(n, gpu=True, cpus=16) for n in sizes]
    assert [r.batch_size for r in sized] == sorted(r.batch_size for r in sized)  # more images: larger batch
    for r in sized:  # lr / √batch is one constant
        assert r.lr / math.sqrt(r.batch_size) == pytest.approx(1e-3 / math.sqrt(128))
    epochs = [r.max_epochs for r in sized]
    assert epochs == sorted(epochs, reverse=True) and 10 <= min(epochs) and max(epochs) <= 300
    for cpus in (1, 2, 3):  # a device makes no difference to what is trained: batch, epochs, augmentation
        cpu, gpu = recipe(50_000, gpu=False, cpus=cpus), recipe(50_000, gpu=True, cpus=cpus)
        assert (cpu.batch_size, cpu.max_epochs, cpu.auto_augment) == (
            gpu.batch_size,
            gpu.max_epochs,
            gpu.auto_augment,
        )
        assert cpu.num_workers <= cpus - 1


def test_the_split_is_stratified_seeded_and_whole():
    files = tuple(tuple(f"{c}_{i}.jpg" for i in range(n)) for c, n in enumerate([100, 101, 102, 7, 2, 1]))
    train, val = split(files, 0.2, seed=0)
    for names, t, v in zip(files, train, val, strict=True):
        assert sorted(t + v) == sorted(names) and not set(t) & set(v)  # every file once
        if len(names) >= 2:
            assert abs(len(v) - 0.2 * len(names)) <= 1 and t and v  # stratified, both sides non-empty
    assert split(files, 0.2, seed=0) == (train, val)  # fixed by the split seed alone
    assert split(files, 0.2, seed=1)[1] != val


def test_the_test_split_is_held_out_of_what_validation_left_and_changes_no_validation_image():
    """hold_out: validation is :func:`split`'s (the same images as without a test split), test a
    stratified share of the rest, disjoint, fixed by the split seed; every class keeps an image to
    train on; without a fraction (test/ holds it) nothing is drawn."""
    files = tuple(tuple(f"{c}_{i}.jpg" for i in range(n)) for c, n in enumerate([100, 101, 102, 7, 3, 2, 1]))
    train, val, test = hold_out(files, 0.2, 0.1, seed=0)
    assert val == split(files, 0.2, seed=0)[1]
    for names, t, v, h in zip(files, train, val, test, strict=True):
        assert sorted(t + v + h) == sorted(names) and not set(t) & set(h) and not set(v) & set(h)
        assert t  # something left to train on, whatever the class's size
        if len(names) >= 10:
            assert abs(len(h) - 0.1 * len(names)) <= 1
    assert hold_out(files, 0.2, 0.1, seed=0) == (train, val, test)
    assert hold_out(files, 0.2, 0.1, seed=1)[2] != test
    assert hold_out(files, 0.2, None, seed=0) == (split(files, 0.2, seed=0)[0], val, None)
    alone, no_val, drawn = hold_out(files, None, 0.1, seed=0)
    assert no_val is None and [len(a) + len(d) for a, d in zip(alone, drawn, strict=True)] == [
        len(f) for f in files
    ]


#: what ImageFolderTask needs besides the folder (the config fills it in a run)
TASK = {
    "input": "image",
    "in_chans": 3,
    "num_classes": 2,
    "batch_size": 2,
    "eval_batch_size": 2,
    "img_size": 8,
}


def test_val_and_test_folders_are_read_where_they_exist(tmp_path):
    """``test/`` beside ``train/`` is the test split (nothing drawn out of train/), ``val/`` the
    validation; a ``test/`` with other classes is one error naming both folders."""
    root = tmp_path / "three"
    for split_name, n in (("train", 6), ("val", 2), ("test", 3)):
        for name in ("a", "b"):
            (root / split_name / name).mkdir(parents=True)
            for i in range(n):
                (root / split_name / name / f"{i}.png").touch()
    task = ImageFolderTask(data_dir=str(root), name="imagefolder-three", **TASK)
    found = task.samples()
    assert task.eval_splits == ("val", "test") and {k: len(v) for k, v in found.items()} == {
        "train": 12,
        "val": 4,
        "test": 6,
    }
    assert all("/test/" in path for path, _ in found["test"]) and task.train_size == 12
    assert task.split_statement["test_from"] == "test/" and task.split_statement["val_from"] == "val/"
    none = ImageFolderTask(data_dir=str(root / "none"), name="x", test_fraction=0, **TASK)
    for name in ("a", "b"):
        (root / "none" / "train" / name).mkdir(parents=True)
        (root / "none" / "train" / name / "0.png").touch()
    assert none.eval_splits == ("val",)
    for name in ("a", "b"):  # 2 images a class: one validates, none is left to test
        (root / "none" / "train" / name / "1.png").touch()
    too_few = ImageFolderTask(data_dir=str(root / "none"), name="x", **TASK)
    assert too_few.eval_splits == ("val",) and set(too_few.samples()) == {"train", "val"}
    (root / "test" / "c").mkdir()
    with pytest.raises(DataError, match=r"train/ and test/ have different class folders \(in one only: c\)"):
        ImageFolderTask(data_dir=str(root), name="imagefolder-three", **TASK).samples()


def test_the_label_is_the_folders_name_kept_short_and_safe(tmp_path):
    assert label(tmp_path / "my pets, 2024") == "imagefolder-my_pets_2024"
    assert label(str(tmp_path / ("x" * 80))) == "imagefolder-" + "x" * 40
    assert label(None) == "imagefolder"


# -- through the entry point ----------------------------------------------------------------------


def run_here(args: list[str], cwd: Path, capsys) -> tuple[int, str]:
    with src_run_here([*args, *QUIET], cwd) as cli:
        code, _, stderr = main_in_process(lambda _: cli(), capsys)
    return code, stderr


def test_own_folder_without_val_trains_is_labelled_by_its_name_and_states_its_split(pets, tmp_path, capsys):
    """``python -m src.run task=imagefolder task.data_dir=DIR`` on 303 real-size JPEGs without
    ``val/``, seeds 0 and 1: each trains, its folder, config, log lines and report row say
    ``imagefolder-pets`` (the folder's path is not in the run folder's name), and the split its
    summary states is stratified, the same for both seeds, and the one its task reads."""
    short = ["trainer.max_steps=4", "trainer.log_every=2", "trainer.monitor_every=0", "trainer.threads=1"]
    summaries = {}
    for seed in (0, 1):
        code, stderr = run_here(
            ["task=imagefolder", f"task.data_dir={pets}", f"seed={seed}", *short], tmp_path, capsys
        )
        assert code == 0, stderr
        run = tmp_path / "outputs" / "runs" / "imagefolder-pets" / "vit_micro" / "precond"
        run = run / f"seed={seed},trainer.log_every=2,trainer.max_steps=4,trainer.monitor_every=0"
        summary = json.loads((run / "summary.json").read_text())
        assert (summary["task"], summary["status"], summary["steps"]) == ("imagefolder-pets", "completed", 4)
        assert read_run(run).task == "imagefolder-pets"  # the report's row
        log = (run / "run.log").read_text()
        assert "train imagefolder-pets · vit_micro" in log and "done: val/acc" in log
        assert "imagefolder-pets: 3 classes, 213 training, 60 validation, 30 test images" in log
        statement = summary["statistics"]["split"]
        assert statement["val_from"] == "a stratified 0.2 of train/, split seed 0"
        assert statement["test_from"] == "a stratified 0.1 of train/, split seed 0"
        assert statement["classes"] == ["cat", "dog", "eel"]
        for n, t, v, h in zip(
            [100, 101, 102],
            statement["train_per_class"],
            statement["val_per_class"],
            statement["test_per_class"],
            strict=True,
        ):
            assert t + v + h == n and abs(v - 0.2 * n) <= 1 and abs(h - 0.1 * n) <= 1
        tested = json.loads((run / "eval-test.json").read_text())  # once, at the end (test_after)
        assert (tested["samples"], tested["checkpoint_step"]) == (30, 4)
        cfg = OmegaConf.load(run / ".hydra" / "config.yaml")  # the run's config, as resolved
        assert (cfg.task.name, cfg.task.num_classes, cfg.task.img_size) == ("imagefolder-pets", 3, 28)
        task = instantiate(cfg.task)
        _, val = task.datasets(Path("unused"))  # what the task reads: the stated split
        test = task.eval_dataset(Path("unused"), "test")
        for held, key in ((val, "val_files"), (test, "test_files")):
            assert (
                files_digest([str(Path(p).relative_to(pets / "train")) for p, _ in held.samples])
                == statement[key]
            )
        summaries[seed] = summary
    assert summaries[0]["statistics"] == summaries[1]["statistics"]  # seeds paired on the same images


def test_the_plan_counts_the_epochs_over_the_images_left_to_train_on(pets, tmp_path):
    """launch.plan's steps for the recipe: its epochs × ⌈213 training images / its batch⌉ (the
    folder's 303 less validation's 60 and test's 30), the count the run's data loader makes."""
    cfg = compose(["task=imagefolder", f"task.data_dir={pets}"], tmp_path)
    assert planned_task(cfg).train_size == 213
    assert steps_of(cfg) == cfg.trainer.max_epochs * math.ceil(213 / cfg.task.batch_size) > 0


@pytest.mark.parametrize(
    "make, expected",
    [
        (lambda root: root, "missing folder {root}/train"),
        (lambda root: (root / "train").mkdir(parents=True), "no class folders in {root}/train"),
        (lambda root: (root / "train" / "cat").mkdir(parents=True), "no images in {root}/train/cat"),
    ],
)
def test_a_missing_or_malformed_folder_is_one_line_and_exit_2(make, expected, tmp_path, capsys):
    root = tmp_path / "mine"
    make(root)
    with src_run_here(
        ["task=imagefolder", f"task.data_dir={root}", *QUIET], tmp_path, config_alone=True
    ) as cli:
        code, _, stderr = main_in_process(lambda _: cli(), capsys)
    (line,) = stderr.strip().splitlines()
    assert code == 2 and line.startswith("error: ") and expected.format(root=root) in line
    assert f"expected {root}/train/<class>/<image>" in line
    assert not (tmp_path / "outputs").exists()


def test_a_run_lists_the_folder_once(tmp_path, monkeypatch):
    """Training, the split checks and each evaluation ask for the samples: one listing serves all."""
    from src import image_folder

    for name in ("a", "b"):
        (tmp_path / "train" / name).mkdir(parents=True)
        for i in range(10):
            (tmp_path / "train" / name / f"{i}.png").touch()
    scans = []
    real_scan = image_folder.scan
    monkeypatch.setattr(image_folder, "scan", lambda root: scans.append(root) or real_scan(root))
    task = ImageFolderTask(data_dir=str(tmp_path), name="x", **TASK)
    train, val = task.datasets(tmp_path)
    test = task.eval_dataset(tmp_path, "test")
    assert task.eval_splits == ("val", "test") and len(train) + len(val) + len(test) == 20
    assert len(scans) == 1
