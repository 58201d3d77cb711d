"""``task=imagefolder``: the recipe sized to the data, the stratified split fixed across seeds, the
label, and a run through the real entry point on a folder of real-size JPEGs without ``val/``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import QUIET, main_in_process, src_run_here
from hydra.utils import instantiate
from omegaconf import OmegaConf
from PIL import Image

from launch.analysis.records import read_run
from src.image_folder import TIERS, Recipe, label, recipe, split
from tasks.classification import files_digest

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
    only, no workers. ImageNet's size: batch 128, 10 epochs, DeiT's augmentation, 8 workers on a
    GPU with 16 CPUs, 2 on a CPU, never more than the CPUs less one."""
    assert recipe(303, gpu=False, cpus=2) == Recipe(16, 300, 15, None, 0.0, 0.0, 0.0, 0)
    assert recipe(1_281_167, gpu=True, cpus=16) == Recipe(
        128, 10, 1, "rand-m9-mstd0.5-inc1", 0.25, 0.8, 1.0, 8
    )
    assert recipe(1_281_167, gpu=False, cpus=16).num_workers == 2
    assert recipe(1_281_167, gpu=True, cpus=4).num_workers == 3
    assert recipe(2_000, gpu=False, cpus=2) == Recipe(64, 50, 2, None, 0.0, 0.0, 0.0, 1)
    assert recipe(20_000, gpu=True, cpus=16).auto_augment == TIERS[1][1]
    sizes = [10, 300, 1_000, 5_000, 20_000, 100_000, 1_000_000]
    sized = [recipe(n, gpu=True, cpus=16) for n in sizes]
    assert [r.batch_size for r in sized] == sorted(r.batch_size for r in sized)  # more images: larger batch
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
        assert "imagefolder-pets: 3 classes, 243 training and 60 validation images" in log
        statement = summary["statistics"]["split"]
        assert statement["val_from"] == "a stratified 0.2 of train/, split seed 0"
        assert statement["classes"] == ["cat", "dog", "eel"]
        for n, t, v in zip(
            [100, 101, 102], statement["train_per_class"], statement["val_per_class"], strict=True
        ):
            assert t + v == n and abs(v - 0.2 * n) <= 1
        cfg = OmegaConf.load(run / ".hydra" / "config.yaml")  # the run's config, as resolved
        assert (cfg.task.name, cfg.task.num_classes, cfg.task.img_size) == ("imagefolder-pets", 3, 28)
        _, val = instantiate(cfg.task).datasets(Path("unused"))  # what the task reads: the stated split
        assert (
            files_digest([str(Path(p).relative_to(pets / "train")) for p, _ in val.samples])
            == statement["val_files"]
        )
        summaries[seed] = summary
    assert summaries[0]["statistics"] == summaries[1]["statistics"]  # seeds paired on the same images


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
