"""mmcv 2.1.0 with its compiled ops for this interpreter, torch and machine, found in a cache or built once.

``python -m launch.tools.mmcv_build [--cache DIR] [--find-links DIR] [--jobs N] [--cpu] [--install]
[--dry-run]`` (``make detection``) leaves a fitting wheel in the cache (and, with ``--install``, installs it);
``--check`` runs the installed ops (:func:`tasks.detection.ops.ops_check`: ``roi_align`` and ``nms``
against torchvision's, on the CPU and, where torch sees a GPU, on ``cuda``). Why: PyPI has only
mmcv's source and mmdet 3.3.0 refuses mmcv >= 2.2.

0. target (:mod:`launch.tools.mmcv_target`): CPU ops, or CUDA ops (``FORCE_CUDA=1``) for the visible GPUs'
   architectures, or for a default list by CUDA major where nvcc is here but no GPU; a GPU without
   a matching nvcc is refused (exit 2) unless ``--cpu``; one line says which and why;
1. find: a wheel fits when its tags are this interpreter's, the torch recorded beside it
   (``<wheel>.json``, written here) is the installed one, and its recorded build (``cuda``,
   ``arch``; a record without them, or none: CPU ops) serves the target; wheels of each build
   sit in their own subfolder of the cache (``cpu/``, ``cuda12.8-sm90/``: the file names are
   equal); one from ``--find-links`` is copied there; ``--check`` catches a mismatch;
2. requirements: ``setuptools>=77.0.3,<81`` (mmcv imports ``pkg_resources``; torch needs >= 77.0.3),
   ``wheel``, ``ninja``, ``psutil``, into this environment: with build isolation mmcv sees no torch
   and silently skips its ops;
3. download: the sdist (``pip download --no-binary :all:``); 4. patch: ``-std=c++17`` -> ``-std=c++20``
   in ``setup.py`` only for torch >= 2.14, whose headers demand C++20 (2.13's: C++17); not always,
   since nvcc before CUDA 12 has no C++20;
5. compile: ``MMCV_WITH_OPS=1 FORCE_CUDA=0|1 [TORCH_CUDA_ARCH_LIST=…] MAX_JOBS=<jobs> pip wheel -v
   --no-deps --no-build-isolation`` (CPU ops: about 30 minutes on 2 cores; CUDA ops: longer, not
   measured here), its output in ``<cache>/mmcv-2.1.0-build.log``;
6. store: the wheel, checked to hold ``mmcv/_ext``, moves into the cache with its record;
7. install (``--install``): ``pip install --no-deps --force-reinstall`` of that wheel: an mmcv 2.1.0
   already installed (a CPU build) would otherwise satisfy pip and stay.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path

from packaging.tags import sys_tags
from packaging.version import Version

from launch.tools.mmcv_target import (  # noqa: F401  (the cache's lookups, re-exported)
    CPU_BUILD,
    MMCV,
    Build,
    Machine,
    Refusal,
    adopt,
    build_refusal,
    choose,
    find_wheel,
    probe,
    read_record,
    record_path,
    wheel_fits,
)
from src.command import command_parser, run_command
from src.engine.record import atomic

BUILD_REQUIREMENTS = ["setuptools>=77.0.3,<81", "wheel", "ninja", "psutil"]
#: Lines of mmcv 2.1.0's ``setup.py`` that the patch must find (as C++17, or already as C++20).
PATCH_ANCHORS = ("extra_compile_args['cxx'] = ['-std=c++17']", "extra_compile_args['nvcc'] += ['-std=c++17']")
CXX17, CXX20 = "'-std=c++17'", "'-std=c++20'"
LOG_NAME = f"mmcv-{MMCV}-build.log"
#: ``pip download`` of the sdist; without isolation, as pip's isolated setuptools lacks ``pkg_resources``.
DOWNLOAD = ["--no-deps", "--no-binary", ":all:", "--no-build-isolation", f"mmcv=={MMCV}"]


class BuildError(RuntimeError):
    """A stage failed; the message is the one line the user reads (what failed, what to do)."""


def default_cache() -> Path:
    """``$XDG_CACHE_HOME/conditioned-attention/wheels``: outside the repository, kept across clones."""
    root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(root) / "conditioned-attention" / "wheels"


def torch_version() -> str:
    """The installed torch's version, read from its metadata (importing torch takes seconds)."""
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        raise BuildError(
            "torch is not installed here: mmcv is built against it; run `make install` first"
        ) from None


def needs_cxx20(torch: str) -> bool:
    """Whether torch's headers demand C++20: from 2.14 (ATen.h of 2.13 still asks for C++17)."""
    return Version(torch).release[:2] >= (2, 14)


def patch_setup_py(text: str) -> str:
    """mmcv's ``setup.py`` with every ``'-std=c++17'`` made ``'-std=c++20'``; idempotent.

    Refuses a text lacking any of ``PATCH_ANCHORS`` (in either standard), so that a reshaped
    ``setup.py`` of another release is never built half-patched.
    """
    lines = {line.strip() for line in text.splitlines()}
    for anchor in PATCH_ANCHORS:
        if anchor not in lines and anchor.replace(CXX17, CXX20) not in lines:
            raise BuildError(
                f'mmcv setup.py has no line "{anchor}": not mmcv {MMCV}\'s; update PATCH_ANCHORS '
                "in launch/tools/mmcv_build.py for this release"
            )
    return text.replace(CXX17, CXX20)


class Progress:
    """One line per stage, ``[3/6 download +12 s] …``, timed from the start of the command."""

    def __init__(self, total: int) -> None:
        self.total, self.done, self.start = total, 0, time.monotonic()

    def stage(self, name: str, detail: str) -> None:
        self.done += 1
        elapsed = time.monotonic() - self.start
        print(f"[{self.done}/{self.total} {name} +{elapsed:.0f} s] {detail}", flush=True)


def run_logged(cmd: list[str], log: Path, stage: str, env: dict[str, str] | None = None) -> None:
    """Run ``cmd`` with its output appended to ``log``; on failure show the log's tail and raise."""
    with log.open("a") as out:
        out.write(f"\n$ {' '.join(cmd)}\n")
        out.flush()
        code = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env).returncode
    if code:
        tail = log.read_text(errors="replace").splitlines()[-25:]
        print("\n".join(tail), file=sys.stderr)
        raise BuildError(f"mmcv build failed at stage {stage} (exit {code}); full output in {log}")


def pip(*args: str) -> list[str]:
    """A pip command line for this interpreter's environment."""
    return [sys.executable, "-m", "pip", *args]


def unpack_and_patch(work: Path, torch: str, progress: Progress, dry_run: bool) -> Path:
    """Unpack the downloaded sdist under ``work/src`` and patch its ``setup.py``; the source folder."""
    src = work / "src" / f"mmcv-{MMCV}"
    detail = f"C++17 -> C++20 in setup.py (torch {torch} needs C++20)" if needs_cxx20(torch) else "not needed"
    progress.stage("patch", f"unpack into {src}; {detail}")
    if dry_run:
        return src
    with tarfile.open(work / "sdist" / f"mmcv-{MMCV}.tar.gz") as archive:
        kwargs = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        archive.extractall(work / "src", **kwargs)
    if needs_cxx20(torch):
        setup = src / "setup.py"
        setup.write_text(patch_setup_py(setup.read_text()))
    return src


def build(cache: Path, jobs: int, torch: str, target: Build, progress: Progress, dry_run: bool) -> Path:
    """Stages 2-6: requirements, download, patch, compile, store; the cached wheel's path."""
    log = cache / LOG_NAME
    with tempfile.TemporaryDirectory(prefix="mmcv-build-") as tmp:
        work = Path(tmp)
        steps = [
            ("requirements", pip("install", *BUILD_REQUIREMENTS)),
            ("download", pip("download", *DOWNLOAD, "-d", str(work / "sdist"))),
        ]
        if not dry_run:
            cache.mkdir(parents=True, exist_ok=True)
            log.write_text(f"mmcv {MMCV} build against torch {torch} ({target.why}), {sys.executable}\n")
        for stage, cmd in steps:
            progress.stage(stage, " ".join(cmd[2:]) + ("" if dry_run else f" (output in {log})"))
            if not dry_run:
                run_logged(cmd, log, stage)
        src = unpack_and_patch(work, torch, progress, dry_run)
        cmd = pip("wheel", "-v", "--no-deps", "--no-build-isolation", "-w", str(work / "dist"), str(src))
        length = "about 30 min on 2 cores" if target.cuda is None else "CUDA: longer, more per architecture"
        words = f"MMCV_WITH_OPS=1 {target.words()} MAX_JOBS={jobs} {' '.join(cmd[2:])}"
        progress.stage("compile", f"{words} ({length}; output in {log})")
        if dry_run:
            progress.stage("store", f"the wheel and its record into {cache / target.folder}")
            return cache / target.folder / f"mmcv-{MMCV}-<tags>.whl"
        run_logged(cmd, log, "compile", target.env(jobs))
        return store(next((work / "dist").glob("mmcv-*.whl")), cache, torch, target, progress, log)


def store(wheel: Path, cache: Path, torch: str, target: Build, progress: Progress, log: Path) -> Path:
    """Move a built ``wheel`` into the folder of ``target`` with its record, once it holds the ops."""
    folder = cache / target.folder
    progress.stage("store", f"{wheel.name} into {folder}")
    with zipfile.ZipFile(wheel) as archive:
        if not any(n.startswith("mmcv/_ext") for n in archive.namelist()):
            raise BuildError(f"the built mmcv wheel has no compiled ops (mmcv/_ext): see {log}")
    folder.mkdir(parents=True, exist_ok=True)
    target_path = folder / wheel.name
    shutil.move(str(wheel), target_path)
    record = {"torch": torch, "cxx20": needs_cxx20(torch), **target.key}
    atomic.write_text(record_path(target_path), json.dumps(record) + "\n")
    return target_path


def ensure_wheel(
    cache: Path, links: list[Path], jobs: int, dry_run: bool, force_cpu: bool = False,
    machine: Machine | None = None, install: bool = False,
) -> Path:  # fmt: skip
    """A fitting mmcv 2.1.0 wheel in ``cache``: found (cache first, then ``links``) or built; installed
    with ``install``. Raises :class:`Refusal` when the ops this machine needs cannot be built here."""
    torch = torch_version()
    machine = probe() if machine is None else machine
    target = choose(machine, torch, force_cpu, os.environ.get("TORCH_CUDA_ARCH_LIST"))
    print(f"target: {target.why}", flush=True)
    tag = next(iter(sys_tags()))
    found = find_wheel([cache, *links], torch, target)
    progress = Progress((1 if found else 6) + install)
    where = ", ".join(str(d) for d in [cache, *links])
    if found:
        progress.stage("find", f"reusing {found} (fits {tag.interpreter}, torch {torch}, {target.folder})")
        wheel = cache / target.folder / found.name if dry_run else adopt(found, cache, target)
    else:
        wanted = f"{tag.interpreter}, torch {torch}, {target.folder}"
        progress.stage("find", f"no mmcv {MMCV} wheel for {wanted} in {where}")
        refusal = build_refusal(machine, target, torch)
        if refusal:
            raise Refusal(refusal)
        wheel = build(cache, jobs, torch, target, progress, dry_run)
    if install:
        cmd = pip("install", "--no-deps", "--force-reinstall", str(wheel))
        progress.stage("install", " ".join(cmd[2:]))
        if not dry_run:
            run_logged(cmd, cache / LOG_NAME, "install")
    return wheel


def check_ops(cache: Path, devices: list[str] | None = None) -> int:
    """Whether the installed mmcv's ops load and run ``roi_align`` and ``nms`` as torchvision does on
    each of ``devices`` (default: the CPU, and ``cuda`` where torch sees a GPU): one line, 0 or 1."""
    try:
        import mmcv
        import mmcv.ops  # noqa: F401
        from mmcv import _ext  # noqa: F401
    except Exception as err:  # an ABI mismatch surfaces as ImportError or OSError
        log = cache / LOG_NAME
        hint = f"build log: {log}" if log.is_file() else f"no build log in {cache}"
        print(
            f"error: mmcv's compiled ops do not load ({type(err).__name__}: {err}); {hint}; "
            f"reinstall a wheel from {cache} with `pip install --force-reinstall --no-deps <wheel>` "
            "or remove it and rerun `make detection`",
            file=sys.stderr,
        )
        return 1
    import torch

    from tasks.detection.ops import FIX, mmcv_cuda_version, ops_check

    devices = devices or ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]
    cuda = mmcv_cuda_version()
    built = f"CUDA {cuda} ops" if cuda else "CPU ops only"
    for device in devices:
        result = ops_check(device)
        if not result["ok"]:
            fix = FIX if device != "cpu" else f"remove the wheel from {cache} and rerun `make detection`"
            print(f"error: mmcv {mmcv.__version__} ({built}): {result['error']}; run {fix}", file=sys.stderr)
            return 1
    on = ", ".join(devices)
    print(f"mmcv {mmcv.__version__} ({built}): roi_align and nms agree with torchvision's on {on}")
    return 0


def command_line() -> argparse.ArgumentParser:
    """The command line (see the module's docstring)."""
    parser = command_parser(__spec__.name, __doc__)
    parser.add_argument("--cache", type=Path, default=default_cache(), help="default: %(default)s")
    links = "another folder to look in for a wheel"
    parser.add_argument("--find-links", type=Path, action="append", default=[], metavar="DIR", help=links)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    parser.add_argument("--jobs", type=int, default=cores, help="parallel compilers (default: %(default)s)")
    cpu = "CPU ops even where torch sees a GPU (a detection run on that GPU then refuses)"
    parser.add_argument("--cpu", action="store_true", help=cpu)
    install = "pip install the wheel (over any installed mmcv)"
    parser.add_argument("--install", action="store_true", help=install)
    parser.add_argument("--dry-run", action="store_true", help="print the stages without running them")
    check = "only run the installed ops (roi_align, nms) on the CPU and any GPU, against torchvision's"
    parser.add_argument("--check", action="store_true", help=check)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Find or build the wheel (or, with ``--check``, test the installed ops); the exit status:
    1 for a failed stage or check, 2 for a machine that cannot build the ops it needs."""
    return run_command(command_line(), find_or_build, argv, expected=(Refusal,))


def find_or_build(args: argparse.Namespace) -> int:
    """The command's work: the wheel found or built (a failed stage: one line and 1), or the ops
    checked."""
    cache = args.cache.expanduser()
    if args.check:
        return check_ops(cache)
    links = [d for d in args.find_links if d.is_dir()]
    try:
        wheel = ensure_wheel(cache, links, args.jobs, args.dry_run, args.cpu, install=args.install)
    except BuildError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    done = f"install with `pip install --no-deps --force-reinstall {wheel}`"
    if args.install:
        done = "would be installed" if args.dry_run else "installed"
    print(f"{'would leave' if args.dry_run else 'ready'}: {wheel}; {done}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
