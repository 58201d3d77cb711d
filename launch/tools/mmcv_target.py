"""Which mmcv ops this machine needs (CPU, or CUDA for which GPU architectures), how to compile them,
and which cached wheels serve them (:func:`find_wheel`; used by :mod:`launch.tools.mmcv_build`).

:func:`probe` reads the machine: torch's CUDA version, the visible GPUs' compute capabilities,
the CUDA toolkit (``CUDA_HOME``, ``CUDA_PATH``, ``nvcc`` on ``PATH``, ``/usr/local/cuda``: where
torch's extension builder looks, in its order) and nvcc's release. :func:`choose` turns it into a
:class:`Build`, the request a cached wheel must fit (:meth:`Build.fits`, on the wheel's
``<wheel>.json`` record) and the compile's environment (:meth:`Build.env`):

* ``--cpu`` (``make detection MMCV_CPU=1``), or a torch without CUDA: CPU ops;
* a visible GPU: CUDA ops for the GPUs' architectures (``TORCH_CUDA_ARCH_LIST``, when set,
  wins); building them needs nvcc of torch's CUDA major, else :func:`build_refusal` says what
  to install or how to force CPU ops (exit 2): CPU ops would fail at the first RoIAlign there;
* no GPU but nvcc of torch's CUDA major (a login node): CUDA ops for :data:`DEFAULT_ARCHS` of
  that major;
* otherwise CPU ops, as the one line says.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from packaging.tags import Tag, sys_tags
from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import Version

from src.engine.record import atomic

MMCV = Version("2.1.0")

#: ``TORCH_CUDA_ARCH_LIST`` when no GPU is visible, by the torch build's CUDA major. **[reading]**
#: the data-centre and workstation GPUs each toolkit still compiles for (NVIDIA's CUDA release
#: notes: 12.x builds sm_50–sm_90; 13.0 dropped everything below sm_75): V100 7.0, T4 7.5, A100 8.0,
#: A10/RTX 30 8.6, L4/L40/RTX 40 8.9, H100 9.0, B200 10.0, RTX 50 12.0; ``+PTX`` lets newer GPUs
#: compile the last one at load time. Set TORCH_CUDA_ARCH_LIST to build for others.
DEFAULT_ARCHS = {
    11: ("7.0", "7.5", "8.0", "8.6+PTX"),
    12: ("7.0", "7.5", "8.0", "8.6", "8.9", "9.0+PTX"),
    13: ("7.5", "8.0", "8.6", "8.9", "9.0", "10.0", "12.0+PTX"),
}
CPU = "cpu"
#: headers a toolkit must hold: torch's ``ATen/cuda/CUDAContextLight.h`` includes them, and mmcv's CUDA
#: ops include that (a toolkit of nvcc and the runtime alone, as some images ship, lacks them)
TOOLKIT_HEADERS = ("cuda_runtime.h", "cusparse.h", "cublas_v2.h", "cusolverDn.h")


@dataclass(frozen=True)
class Machine:
    """What :func:`probe` found: torch's CUDA (None: a CPU torch), the GPUs' capabilities ("9.0"),
    nvcc's path and release ("12.8") in a complete toolkit, or what an incomplete one lacks; tests
    build one by hand."""

    torch_cuda: str | None = None
    gpu_archs: tuple[str, ...] = ()
    nvcc: Path | None = None
    nvcc_release: str | None = None
    incomplete: str | None = None  # "/usr/local/cuda lacks include/cusparse.h"

    def no_toolkit(self) -> str:
        """What was found instead of a usable nvcc, in words."""
        if self.nvcc is not None:
            return f"nvcc {self.nvcc_release} at {self.nvcc}"
        return (
            f"no complete CUDA toolkit ({self.incomplete})" if self.incomplete else "no CUDA toolkit (nvcc)"
        )


@dataclass(frozen=True)
class Build:
    """The ops a wheel must hold here: CPU (``cuda`` None) or CUDA ``cuda`` for ``archs``; ``why``
    is the one line that says so."""

    cuda: str | None
    archs: tuple[str, ...]
    why: str
    nvcc: Path | None = None

    @property
    def key(self) -> dict[str, str]:
        """The fields of a wheel's record that say what it was built for (``"cpu"`` for CPU ops)."""
        return {"cuda": self.cuda or CPU, "arch": ";".join(self.archs) or CPU}

    @property
    def folder(self) -> str:
        """The cache's subfolder for wheels of this build (one name per build, the same file name)."""
        if self.cuda is None:
            return CPU
        return f"cuda{self.cuda}-sm" + "-".join(a.replace(".", "") for a in self.archs)

    def fits(self, record: dict) -> bool:
        """Whether a wheel recorded as ``record`` serves this build: CPU for CPU; the same CUDA and
        every architecture asked for. A record without these fields (older ones, or none) is CPU."""
        cuda, arch = record.get("cuda", CPU), record.get("arch", CPU)
        if self.cuda is None or cuda == CPU:
            return self.cuda is None and cuda == CPU
        return cuda == self.cuda and {bare(a) for a in self.archs} <= {bare(a) for a in split_archs(arch)}

    def env(self, jobs: int, base: dict[str, str] | None = None) -> dict[str, str]:
        """The compile's environment: ops on, ``jobs`` compilers; CUDA with its arch list and toolkit,
        or CPU with the GPUs hidden (mmcv's setup.py builds CUDA ops whenever torch sees a GPU)."""
        env = {**(os.environ if base is None else base), "MMCV_WITH_OPS": "1", "MAX_JOBS": str(jobs)}
        if self.cuda is None:
            env.pop("TORCH_CUDA_ARCH_LIST", None)
            return {**env, "FORCE_CUDA": "0", "CUDA_VISIBLE_DEVICES": ""}
        env.update(FORCE_CUDA="1", TORCH_CUDA_ARCH_LIST=";".join(self.archs))
        if self.nvcc is not None:
            env["CUDA_HOME"] = str(self.nvcc.parent.parent)
        return env

    def words(self) -> str:
        """The compile's settings as a shell would show them."""
        if self.cuda is None:
            return "FORCE_CUDA=0 CUDA_VISIBLE_DEVICES="
        home = f" CUDA_HOME={self.nvcc.parent.parent}" if self.nvcc is not None else ""
        return f"FORCE_CUDA=1 TORCH_CUDA_ARCH_LIST='{';'.join(self.archs)}'{home}"


class Refusal(RuntimeError):
    """This machine cannot build the ops it needs; the message is the one line (exit status 2)."""


def bare(arch: str) -> str:
    """An architecture without its ``+PTX``: "9.0+PTX" -> "9.0"."""
    return arch.split("+")[0]


def split_archs(text: str) -> tuple[str, ...]:
    """A ``TORCH_CUDA_ARCH_LIST`` ("8.0;9.0+PTX", or space-separated) as its entries."""
    return tuple(a for a in re.split(r"[;\s]+", text.strip()) if a)


def major(version: str | None) -> int | None:
    """12 for "12.8"; None for None."""
    return int(version.split(".")[0]) if version else None


def choose(machine: Machine, torch: str, force_cpu: bool = False, arch_list: str | None = None) -> Build:
    """The build this machine needs (module docstring); ``arch_list``: ``TORCH_CUDA_ARCH_LIST``."""
    cuda, gpus = machine.torch_cuda, machine.gpu_archs
    matching = machine.nvcc if major(machine.nvcc_release) == major(cuda) and cuda else None
    asked = split_archs(arch_list) if arch_list else ()
    if force_cpu:
        note = " although torch sees a GPU (a detection run there refuses them)" if gpus else ""
        return Build(None, (), f"CPU ops, as --cpu asks{note}")
    if cuda is None:
        return Build(None, (), f"CPU ops: torch {torch} was built without CUDA")
    if gpus:
        archs, source = (asked, "TORCH_CUDA_ARCH_LIST") if asked else (gpus, "the visible GPUs'")
        return Build(cuda, archs, f"CUDA {cuda} ops for {source} architectures {';'.join(archs)}", matching)
    if matching is None:
        found = machine.no_toolkit() + (f", not CUDA {major(cuda)} as torch's" if machine.nvcc else "")
        why = f"CPU ops: no GPU visible and {found}; `make detection` on the GPU machine builds CUDA ops"
        return Build(None, (), why)
    archs = asked or DEFAULT_ARCHS.get(major(cuda), ())
    if not archs:
        return Build(None, (), f"CPU ops: no GPU visible and no default architectures for CUDA {cuda}: "
                     "set TORCH_CUDA_ARCH_LIST for CUDA ops")  # fmt: skip
    source = "TORCH_CUDA_ARCH_LIST" if asked else f"no GPU visible: the default list for CUDA {major(cuda)}"
    why = f"CUDA {cuda} ops for {';'.join(archs)} ({source}; nvcc at {matching})"
    return Build(cuda, archs, why, matching)


def build_refusal(machine: Machine, build: Build, torch: str) -> str | None:
    """Why ``build`` cannot be compiled here (CUDA ops without nvcc of torch's CUDA major), or None."""
    if build.cuda is None or build.nvcc is not None:
        return None
    cuda = build.cuda
    if machine.nvcc:
        found = f"nvcc at {machine.nvcc} is CUDA {machine.nvcc_release}, not {major(cuda)}.x"
    elif machine.incomplete:
        found = f"no complete CUDA toolkit was found ({machine.incomplete})"
    else:
        found = "no CUDA toolkit (nvcc) was found (CUDA_HOME, CUDA_PATH, PATH, /usr/local/cuda)"
    return (
        f"torch sees a GPU and {found}: mmcv with CPU ops only would fail at the first RoIAlign there; "
        f"install the CUDA {cuda} toolkit torch {torch} was built with (e.g. `module load cuda/{cuda}`, or "
        f"`conda install -c nvidia cuda-toolkit={cuda}`) and set CUDA_HOME, or build CPU ops anyway with "
        "`make detection MMCV_CPU=1` (python -m launch.tools.mmcv_build --cpu)"
    )


def cuda_home(
    env: dict[str, str] | None = None, fallback: Path = Path("/usr/local/cuda")
) -> tuple[Path | None, str | None]:
    """The CUDA toolkit's folder: the first of ``CUDA_HOME``, ``CUDA_PATH``, the folder above ``nvcc``'s
    on ``PATH`` and ``/usr/local/cuda`` (torch's extension builder's order) that holds ``bin/nvcc`` and
    :data:`TOOLKIT_HEADERS`; else None and what the most complete one with nvcc lacks. Torch takes the first
    that exists: an ``nvcc`` on ``PATH`` that is a wrapper script (``/usr/local/bin/nvcc``) would make
    it ``/usr/local``, and a toolkit of nvcc and the runtime alone stops the compile at ``cusparse.h``."""
    env = os.environ if env is None else env
    nvcc = shutil.which("nvcc", path=env.get("PATH"))
    candidates = [env.get("CUDA_HOME"), env.get("CUDA_PATH"), nvcc and Path(nvcc).resolve().parent.parent]
    closest: tuple[int, str] | None = None  # (headers missing, what) of the most complete one
    for home in [*(Path(c) for c in candidates if c), fallback]:
        if not (home / "bin" / "nvcc").is_file():
            continue
        missing = [h for h in TOOLKIT_HEADERS if not (home / "include" / h).is_file()]
        if not missing:
            return home, None
        if closest is None or len(missing) < closest[0]:
            closest = (len(missing), f"{home} lacks include/{missing[0]}")
    return None, closest[1] if closest else None


def nvcc_release(nvcc: Path) -> str | None:
    """nvcc's "release 12.8" as "12.8", or None when it does not run or say so."""
    try:
        out = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    found = re.search(r"release (\d+\.\d+)", out)
    return found.group(1) if found else None


def probe() -> Machine:
    """This machine, as :func:`choose` reads it (imports torch; initialises CUDA where there is a GPU)."""
    import torch

    cuda = torch.version.cuda
    count = torch.cuda.device_count() if cuda and torch.cuda.is_available() else 0
    archs = sorted({"{}.{}".format(*torch.cuda.get_device_capability(i)) for i in range(count)}, key=float)
    home, incomplete = cuda_home()
    nvcc = home / "bin" / "nvcc" if home is not None else None
    return Machine(cuda, tuple(archs), nvcc, nvcc_release(nvcc) if nvcc else None, incomplete)


#: what a machine without CUDA asks for, and what a wheel without a record holds
CPU_BUILD = Build(None, (), "CPU ops")


# -- the cache: wheels and their records ---------------------------------------------------------


def record_path(wheel: Path) -> Path:
    """Where what a wheel was built for is recorded: ``<wheel>.json`` beside it."""
    return wheel.with_name(wheel.name + ".json")


def read_record(wheel: Path) -> dict:
    """A wheel's record (``torch``, ``cxx20``, ``cuda``, ``arch``); ``{}`` where there is none."""
    record = record_path(wheel)
    return json.loads(record.read_text()) if record.is_file() else {}


def wheel_fits(wheel: Path, torch: str, supported: set[Tag], build: Build = CPU_BUILD) -> bool:
    """Whether ``wheel`` is mmcv 2.1.0 for one of ``supported`` tags, (if recorded) for ``torch``,
    and holds the ops ``build`` asks for (a wheel without a record: CPU ops, as ``../shared/wheels``')."""
    try:
        name, version, _, tags = parse_wheel_filename(wheel.name)
    except InvalidWheelFilename:
        return False
    if name != "mmcv" or version != MMCV or not tags & supported:
        return False
    record = read_record(wheel)
    return record.get("torch", torch) == torch and build.fits(record)


def find_wheel(
    dirs: Iterable[Path], torch: str, build: Build = CPU_BUILD, supported: set[Tag] | None = None
) -> Path | None:
    """The first mmcv 2.1.0 wheel in ``dirs`` (in order; each folder, then its subfolders) that fits."""
    supported = set(sys_tags()) if supported is None else supported
    for folder in dirs:
        for wheel in [*sorted(Path(folder).glob("mmcv-*.whl")), *sorted(Path(folder).glob("*/mmcv-*.whl"))]:
            if wheel_fits(wheel, torch, supported, build):
                return wheel
    return None


def adopt(wheel: Path, cache: Path, target: Build) -> Path:
    """``wheel`` itself when in ``cache``, else a copy (a hard link where possible) in the folder of
    ``target``, with a record that says what it holds (a wheel without one: CPU ops)."""
    if wheel.resolve().is_relative_to(cache.resolve()):
        return wheel
    folder = cache / target.folder
    copy = folder / wheel.name
    folder.mkdir(parents=True, exist_ok=True)
    copy.unlink(missing_ok=True)
    try:
        os.link(wheel, copy)
    except OSError:
        shutil.copy2(wheel, copy)
    atomic.write_text(record_path(copy), json.dumps({**target.key, **read_record(wheel)}) + "\n")
    return copy
