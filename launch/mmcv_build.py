"""mmcv 2.1.0 with its compiled ops for this interpreter and torch, found in a cache or built once.

``python -m launch.mmcv_build [--cache DIR] [--find-links DIR] [--jobs N] [--dry-run]`` (``make
detection``) leaves a fitting wheel in the cache for ``pip install --find-links``; ``--check`` says
whether the installed ops load. Why: PyPI has only mmcv's source and mmdet 3.3.0 refuses mmcv >= 2.2.

1. find: a wheel fits when its tags are this interpreter's and the torch recorded beside it
   (``<wheel>.json``, written here) is the installed one; one with no record (``--find-links``) is
   trusted on its tags and copied into the cache; ``--check`` catches a mismatch;
2. requirements: ``setuptools>=77.0.3,<81`` (mmcv imports ``pkg_resources``; torch needs >= 77.0.3),
   ``wheel``, ``ninja``, ``psutil``, into this environment: with build isolation mmcv sees no torch
   and silently skips its ops;
3. download: the sdist (``pip download --no-binary :all:``); 4. patch: ``-std=c++17`` -> ``-std=c++20``
   in ``setup.py`` only for torch >= 2.14, whose headers demand C++20 (2.13's: C++17); not always,
   since nvcc before CUDA 12 has no C++20;
5. compile: ``MMCV_WITH_OPS=1 FORCE_CUDA=0 MAX_JOBS=<jobs> pip wheel -v --no-deps --no-build-isolation``
   (about 30 minutes on 2 cores), its output in ``<cache>/mmcv-2.1.0-build.log``;
6. store: the wheel, checked to hold ``mmcv/_ext``, moves into the cache with its torch record.
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
from collections.abc import Iterable
from pathlib import Path

from packaging.tags import Tag, sys_tags
from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import Version

MMCV = Version("2.1.0")
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
                "in launch/mmcv_build.py for this release"
            )
    return text.replace(CXX17, CXX20)


def record_path(wheel: Path) -> Path:
    """Where the torch a wheel was built against is recorded: ``<wheel>.json`` beside it."""
    return wheel.with_name(wheel.name + ".json")


def wheel_fits(wheel: Path, torch: str, supported: set[Tag]) -> bool:
    """Whether ``wheel`` is mmcv 2.1.0 for one of ``supported`` tags and (if recorded) for ``torch``."""
    try:
        name, version, _, tags = parse_wheel_filename(wheel.name)
    except InvalidWheelFilename:
        return False
    if name != "mmcv" or version != MMCV or not tags & supported:
        return False
    record = record_path(wheel)
    return not record.is_file() or json.loads(record.read_text()).get("torch") == torch


def find_wheel(dirs: Iterable[Path], torch: str, supported: set[Tag] | None = None) -> Path | None:
    """The first fitting mmcv 2.1.0 wheel in ``dirs`` (in order), or None."""
    supported = set(sys_tags()) if supported is None else supported
    for folder in dirs:
        for wheel in sorted(Path(folder).glob("mmcv-*.whl")):
            if wheel_fits(wheel, torch, supported):
                return wheel
    return None


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


def compile_env(jobs: int) -> dict[str, str]:
    """The build's environment: ops on, ``jobs`` parallel compilers, CUDA only where a GPU is seen."""
    return {
        **os.environ,
        "FORCE_CUDA": os.environ.get("FORCE_CUDA", "0"),
        "MMCV_WITH_OPS": "1",
        "MAX_JOBS": str(jobs),
    }


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


def build(cache: Path, jobs: int, torch: str, progress: Progress, dry_run: bool) -> Path:
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
            log.write_text(f"mmcv {MMCV} build against torch {torch}, {sys.executable}\n")
        for stage, cmd in steps:
            progress.stage(stage, " ".join(cmd[2:]) + ("" if dry_run else f" (output in {log})"))
            if not dry_run:
                run_logged(cmd, log, stage)
        src = unpack_and_patch(work, torch, progress, dry_run)
        cmd = pip("wheel", "-v", "--no-deps", "--no-build-isolation", "-w", str(work / "dist"), str(src))
        progress.stage(
            "compile",
            f"MMCV_WITH_OPS=1 FORCE_CUDA=0 MAX_JOBS={jobs} {' '.join(cmd[2:])} "
            f"(about 30 min on 2 cores; output in {log})",
        )
        if dry_run:
            progress.stage("store", f"the wheel and its torch record into {cache}")
            return cache / f"mmcv-{MMCV}-<tags>.whl"
        run_logged(cmd, log, "compile", compile_env(jobs))
        return store(next((work / "dist").glob("mmcv-*.whl")), cache, torch, progress, log)


def store(wheel: Path, cache: Path, torch: str, progress: Progress, log: Path) -> Path:
    """Move a built ``wheel`` into ``cache`` with its torch record, once it is known to hold the ops."""
    progress.stage("store", f"{wheel.name} into {cache}")
    with zipfile.ZipFile(wheel) as archive:
        if not any(n.startswith("mmcv/_ext") for n in archive.namelist()):
            raise BuildError(f"the built mmcv wheel has no compiled ops (mmcv/_ext): see {log}")
    target = cache / wheel.name
    shutil.move(str(wheel), target)
    record_path(target).write_text(json.dumps({"torch": torch, "cxx20": needs_cxx20(torch)}) + "\n")
    return target


def adopt(wheel: Path, cache: Path) -> Path:
    """``wheel`` itself when in ``cache``, else a copy there (a hard link where possible)."""
    target = cache / wheel.name
    if wheel.parent.resolve() == cache.resolve():
        return wheel
    cache.mkdir(parents=True, exist_ok=True)
    target.unlink(missing_ok=True)
    try:
        os.link(wheel, target)
    except OSError:
        shutil.copy2(wheel, target)
    if record_path(wheel).is_file():
        shutil.copy2(record_path(wheel), record_path(target))
    else:
        record_path(target).unlink(missing_ok=True)
    return target


def ensure_wheel(cache: Path, links: list[Path], jobs: int, dry_run: bool) -> Path:
    """A fitting mmcv 2.1.0 wheel in ``cache``: found (cache first, then ``links``) or built."""
    torch = torch_version()
    tag = next(iter(sys_tags()))
    found = find_wheel([cache, *links], torch)
    progress = Progress(1 if found else 6)
    where = ", ".join(str(d) for d in [cache, *links])
    if found:
        progress.stage("find", f"reusing {found} (fits {tag.interpreter}, torch {torch})")
        return cache / found.name if dry_run else adopt(found, cache)
    progress.stage("find", f"no mmcv {MMCV} wheel for {tag.interpreter} and torch {torch} in {where}")
    return build(cache, jobs, torch, progress, dry_run)


def check_ops(cache: Path) -> int:
    """Whether the installed mmcv's compiled ops load: one line either way, exit status 0 or 1."""
    try:
        import mmcv
        import mmcv.ops  # noqa: F401
        from mmcv import _ext
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
    print(f"mmcv {mmcv.__version__} with its compiled ops: {Path(_ext.__file__).name} loads")
    return 0


def parse(argv: list[str] | None) -> argparse.Namespace:
    """The command line (see the module's docstring)."""
    parser = argparse.ArgumentParser(prog="python -m launch.mmcv_build", description=__doc__.split("\n")[0])
    parser.add_argument("--cache", type=Path, default=default_cache(), help="default: %(default)s")
    links = "another folder to look in for a wheel"
    parser.add_argument("--find-links", type=Path, action="append", default=[], metavar="DIR", help=links)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    parser.add_argument("--jobs", type=int, default=cores, help="parallel compilers (default: %(default)s)")
    parser.add_argument("--dry-run", action="store_true", help="print the stages without running them")
    parser.add_argument("--check", action="store_true", help="only say whether the installed ops load")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Find or build the wheel (or, with ``--check``, test the installed ops); the exit status."""
    args = parse(argv)
    cache = args.cache.expanduser()
    if args.check:
        return check_ops(cache)
    try:
        wheel = ensure_wheel(cache, [d for d in args.find_links if d.is_dir()], args.jobs, args.dry_run)
    except BuildError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(f"{'would leave' if args.dry_run else 'ready'}: {wheel}; install with --find-links {cache}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
