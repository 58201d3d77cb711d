"""Shared fixtures: tiny configurations of every timm family the attention variants support."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import pytest
import torch
from torch import nn

from src.attention.timm_families import FAMILIES

IMAGE = (3, 32, 32)

#: A tiny model of every family ``src/attention/timm_families.py`` registers (its ``tiny``), by name.
TINY_FAMILIES: dict[str, Callable[[], nn.Module]] = {name: family.tiny for name, family in FAMILIES.items()}


def tiny_model(family: str, seed: int = 0) -> nn.Module:
    """A tiny timm model of ``family`` with weights fixed by ``seed``."""
    torch.manual_seed(seed)
    return TINY_FAMILIES[family]()


def logits(output: torch.Tensor | tuple) -> torch.Tensor:
    """DeiT's distilled model returns (class, distillation) logits in training mode."""
    return sum(output) if isinstance(output, tuple) else output


#: the seconds a test without a ``minutes`` mark counts for, when the scopes are ordered
UNMARKED_S = 2.0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The scopes that take longest first. ``make test`` and ``make test-slow`` hand each module
    (a class: its own scope) whole to one of two processes, in this order (``--dist loadscope
    --no-loadscope-reorder``): a six-minute module handed out last keeps the other process idle for
    its six minutes. A scope's length is what its tests declare, ``@pytest.mark.minutes(n)``
    (about n minutes on the 2-core CI machine), and :data:`UNMARKED_S` for each other test; the
    tests of a scope keep their order (the sort is stable)."""
    scope = {item: item.nodeid.rsplit("::", 1)[0] for item in items}  # pytest-xdist's loadscope unit
    length: dict[str, float] = {}
    for item in items:
        mark = item.get_closest_marker("minutes")
        if mark is not None and not mark.args:
            raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.minutes(n) takes its minutes, n")
        length[scope[item]] = length.get(scope[item], 0.0) + (60.0 * mark.args[0] if mark else UNMARKED_S)
    items.sort(key=lambda item: -length[scope[item]])


@pytest.fixture
def images() -> torch.Tensor:
    torch.manual_seed(1)
    return torch.randn(2, *IMAGE)


def pink_noise_images(batch: int, size: int = 224, seed: int = 0) -> torch.Tensor:
    """Images with a natural-image-like 1/f amplitude spectrum, standardised per channel."""
    g = torch.Generator().manual_seed(seed)
    f = torch.fft.fftfreq(size)
    radius = (f[:, None] ** 2 + f[None, :] ** 2).sqrt().clamp_min(1 / size)
    spectrum = torch.randn(batch, 3, size, size, dtype=torch.complex64, generator=g) / radius
    img = torch.fft.ifft2(spectrum).real
    return (img - img.mean((2, 3), keepdim=True)) / img.std((2, 3), keepdim=True)


def real_looking_tokens(batch: int = 8, seed: int = 0) -> torch.Tensor:
    """Embedded tokens as a ViT-Ti/16 builds them from natural-looking images, ``(B, 197, 192)``.

    Patch embedding of 1/f-noise images plus position embedding and class token: their κ is
    about 10³, the figure P3 reports for embedded tokens.
    """
    import timm

    torch.manual_seed(seed)
    vit = timm.create_model("vit_tiny_patch16_224")
    with torch.no_grad():
        return vit._pos_embed(vit.patch_embed(pink_noise_images(batch, seed=seed)))


# -- composing the real config and running the real entry point -------------------------

import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
QUIET = ["trainer.progress=none"]


def compose(overrides: list[str], output_dir: Path):
    """The config ``python -m src.run <overrides>`` would run (:func:`src.configs.compose`), with
    outputs under ``output_dir`` and the tests' quiet progress."""
    from src.configs import compose as composed

    return composed([*overrides, *QUIET], output_dir)


def main_in_process(main: Callable[[list[str]], object], capsys, *args) -> tuple[int, str, str]:
    """A command's ``main(argv)`` called in this process: (exit status, stdout, stderr)."""
    try:
        code = main([str(a) for a in args]) or 0  # a command's status (src/command.py), or 0
    except SystemExit as exit_:  # argparse's --help and usage errors
        code = exit_.code
    out = capsys.readouterr()
    return code, out.out, out.err


@contextlib.contextmanager
def src_run_here(argv: list[str], cwd: Path, config_alone: bool = False) -> Iterator[Callable[[], None]]:
    """``python -m src.run ARGV`` from ``cwd``, as its ``cli()`` to call in this process. Hydra finds
    conf/ as it does under ``python -m src.run`` (from the main module's file, src/run.py).
    ``config_alone``: reaching Hydra's main fails the test."""
    import logging

    from hydra.core.hydra_config import HydraConfig

    from src import run

    def refused_before_main() -> None:
        pytest.fail(f"{argv} reached Hydra's main: not refused from the config alone")

    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(cwd)
        patch.setenv("WANDB_MODE", "disabled")
        patch.setattr(sys, "argv", [str(ROOT / "src" / "run.py"), *argv])
        patch.setattr(logging.root, "handlers", logging.root.handlers[:])  # Hydra's job logging,
        patch.setattr(logging.root, "level", logging.root.level)  # restored after the run, as is
        patch.setattr(HydraConfig.instance(), "cfg", HydraConfig.instance().cfg)  # the job's config
        if config_alone:
            patch.setattr(run, "main", refused_before_main)
        else:
            patch.setattr(run.main.__wrapped__, "__module__", "__main__")
            # under pytest-xdist the workers' __main__ has no file: set it there, removed after
            patch.setattr(sys.modules["__main__"], "__file__", str(ROOT / "src" / "run.py"), raising=False)
        yield run.cli


def report_in_a_bounded_process(folder: Path, out: Path) -> subprocess.CompletedProcess:
    """``python -m launch.analysis.report FOLDER --out OUT`` in its own process, at most 4 GB of
    address space and 120 s: code that reads /dev/zero until the memory runs out ends in a
    MemoryError there instead of taking the machine's memory, and one that waits on a FIFO times out."""
    import resource

    def limit_memory() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (4 * 2**30, 4 * 2**30))

    return subprocess.run(
        [sys.executable, "-m", "launch.analysis.report", str(folder), "--out", str(out)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        preexec_fn=limit_memory,
        timeout=120,
    )


def one_error_line(text: str) -> str:
    """``text`` (a command's stderr) as its one ``error:`` line."""
    lines = text.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


def run_cli(
    args: list[str], cwd: Path, env: dict | None = None, timeout: int = 600
) -> subprocess.CompletedProcess:
    """``python -m src.run <args>`` in a fresh process, from ``cwd``."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), "WANDB_MODE": "disabled", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "src.run", *args, *QUIET],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


#: P5's sandbox at a size a test trains in seconds: 8 steps an epoch at batch 32, no frames
SMALL_MODADD = ["task=modadd", "task.train_size=256", "task.test_size=128", "task.sandbox.frames=false"]


#: what a SLURM cluster's sbatch says to a partition it does not have
SBATCH_REFUSAL = "sbatch: error: Batch job submission failed: Invalid partition name specified"


def stand_in_slurm(folder: Path, sbatch: str) -> dict[str, str]:
    """Stand-ins for SLURM's commands in ``folder/bin`` (``sbatch`` runs the shell line ``sbatch``;
    ``sinfo`` names one partition, ``srun``, which submitit looks for, succeeds): the environment
    that puts them first on the PATH."""
    bin_dir = folder / "bin"
    bin_dir.mkdir()
    for name, script in {"sbatch": sbatch, "sinfo": "echo debug", "srun": "exit 0"}.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{script}\n")
        (bin_dir / name).chmod(0o700)
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}


def recorded_fsyncs_and_renames(monkeypatch, rename_as: Callable[[str, str], str]) -> list[tuple[str, str]]:
    """``os.fsync`` and ``os.replace`` recorded in order, as ``("fsync", the file's path)`` and
    ``("rename", rename_as(src, dst))``, each still done."""
    events: list[tuple[str, str]] = []
    fsync, replace = os.fsync, os.replace

    def recorded_fsync(fd: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        fsync(fd)

    def recorded_replace(src, dst) -> None:
        events.append(("rename", rename_as(str(src), str(dst))))
        replace(src, dst)

    monkeypatch.setattr(os, "fsync", recorded_fsync)
    monkeypatch.setattr(os, "replace", recorded_replace)
    return events


def make_image_folder(root: Path, classes: int = 3, per_class: int = 4, size: int = 40) -> Path:
    """A small ImageFolder in ImageNet's layout: ``root/imagenet/{train,val}/<class>/*.JPEG``."""
    from PIL import Image

    g = torch.Generator().manual_seed(0)
    for split in ("train", "val"):
        for c in range(classes):
            folder = root / "imagenet" / split / f"n0000{c}"
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                pixels = (torch.rand(size, size, 3, generator=g) * 255).to(torch.uint8).numpy()
                Image.fromarray(pixels).save(folder / f"{split}_{c}_{i}.JPEG", quality=90)
    return root


@pytest.fixture(scope="session")
def image_folder(tmp_path_factory) -> Path:
    return make_image_folder(tmp_path_factory.mktemp("data"))
