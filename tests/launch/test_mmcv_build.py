"""``launch.tools.mmcv_build``: the setup.py patch, the wheel lookup and its cache key, the build each
machine gets (:mod:`launch.tools.mmcv_target`: CPU or CUDA ops, the arch list, the refusal), the stages
of a (dry) build, and ``--check`` running the installed ops.

The compile itself (about 30 minutes) is never run here: the machines are described by hand
(:class:`launch.tools.mmcv_target.Machine`); the slow test checks that the patch applies to the real
sdist's ``setup.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from packaging.tags import sys_tags

from launch.tools import mmcv_build, mmcv_target
from launch.tools.mmcv_build import BuildError, Progress, find_wheel, needs_cxx20, patch_setup_py
from launch.tools.mmcv_target import DEFAULT_ARCHS, Build, Machine, build_refusal, choose

#: The lines of mmcv 2.1.0's setup.py around each C++ standard it asks for (exact copies, sdist of PyPI).
SETUP_PY = """\
        cuda_args = os.getenv('MMCV_CUDA_ARGS')
        extra_compile_args = {
            'nvcc': [cuda_args, '-std=c++14'] if cuda_args else ['-std=c++14'],
            'cxx': ['-std=c++14'],
        }
        extra_compile_args = {'cxx': []}

        if platform.system() != 'Windows':
            if parse_version(torch.__version__) <= parse_version('1.12.1'):
                extra_compile_args['cxx'] = ['-std=c++14']
            else:
                extra_compile_args['cxx'] = ['-std=c++17']
        else:
            if parse_version(torch.__version__) <= parse_version('1.12.1'):
                extra_compile_args['cxx'] = ['/std:c++14']
            else:
                extra_compile_args['cxx'] = ['/std:c++17']
            define_macros += [('MMCV_WITH_MPS', None)]
            extra_compile_args = {}
            extra_compile_args['cxx'] = ['-Wall', '-std=c++17']
        if 'nvcc' in extra_compile_args and platform.system() != 'Windows':
            if parse_version(torch.__version__) <= parse_version('1.12.1'):
                extra_compile_args['nvcc'] += ['-std=c++14']
            else:
                extra_compile_args['nvcc'] += ['-std=c++17']
"""
TORCH = "2.14.1"


def test_patch_turns_cxx17_into_cxx20_and_nothing_else():
    before, after = set(SETUP_PY.splitlines()), set(patch_setup_py(SETUP_PY).splitlines())
    removed, added = before - after, after - before
    assert removed == {line for line in before if "'-std=c++17'" in line} and len(removed) == 3
    assert added == {line.replace("c++17", "c++20") for line in removed}
    assert "                extra_compile_args['cxx'] = ['/std:c++17']" in after  # Windows' flag untouched


@pytest.mark.parametrize("anchor", mmcv_build.PATCH_ANCHORS)
def test_patch_refuses_a_setup_py_without_an_expected_line(anchor):
    text = SETUP_PY.replace(anchor, anchor.replace("'-std=c++17'", "'-std=gnu++17'"))
    with pytest.raises(BuildError, match=r"has no line .*update PATCH_ANCHORS"):
        patch_setup_py(text)


def test_patch_is_idempotent():
    once = patch_setup_py(SETUP_PY)
    assert patch_setup_py(once) == once != SETUP_PY


def test_cxx20_is_asked_for_from_torch_2_14_on():
    assert [needs_cxx20(v) for v in ("2.1.2", "2.13.0+cpu", "2.14.1+cu130", "2.15.0", "3.0")] == [
        False, False, True, True, True,
    ]  # fmt: skip


def wheel_name(version: str = "2.1.0", tag: str | None = None) -> str:
    """A real wheel file name: this interpreter's first tag unless ``tag`` is given."""
    first = next(iter(sys_tags()))
    return f"mmcv-{version}-{tag or f'{first.interpreter}-{first.abi}-{first.platform}'}.whl"


def touch(folder: Path, name: str, torch: str | None = None) -> Path:
    """An empty file named ``name`` in ``folder``, with a torch record when ``torch`` is given."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(b"")
    if torch:
        mmcv_build.record_path(folder / name).write_text(json.dumps({"torch": torch}))
    return folder / name


def test_lookup_picks_the_wheel_for_this_interpreter_and_ignores_other_pythons(tmp_path):
    touch(tmp_path, wheel_name(tag="cp27-cp27mu-linux_x86_64"))
    touch(tmp_path, wheel_name(version="2.2.0"))
    assert find_wheel([tmp_path], TORCH) is None
    fits = touch(tmp_path, wheel_name())
    touch(tmp_path, "mmcv-not-a-wheel.whl")
    assert find_wheel([tmp_path], TORCH) == fits


def test_lookup_skips_a_wheel_recorded_for_another_torch_and_prefers_the_first_folder(tmp_path):
    cache, links = tmp_path / "cache", tmp_path / "links"
    touch(cache, wheel_name(), torch="2.13.0")
    shared = touch(links, wheel_name())
    assert find_wheel([cache, links], TORCH) == shared
    ours = touch(cache, wheel_name(), torch=TORCH)
    assert find_wheel([cache, links], TORCH) == ours


#: machines as :func:`launch.tools.mmcv_target.probe` would describe them (torch built with CUDA 12.8)
NVCC = Path("/opt/cuda-12.8/bin/nvcc")
CPU_BOX = Machine()  # a CPU torch
H100_NO_NVCC = Machine("12.8", ("9.0",))
H100 = Machine("12.8", ("9.0",), NVCC, "12.8")
H100_OLD_NVCC = Machine("12.8", ("9.0",), Path("/opt/cuda-11.8/bin/nvcc"), "11.8")
H100_BARE_NVCC = Machine("12.8", ("9.0",), incomplete="/opt/cuda lacks include/cusparse.h")
LOGIN_NODE = Machine("12.8", (), NVCC, "12.8")  # nvcc, no GPU
LAPTOP = Machine("12.8")  # a CUDA torch, no GPU, no nvcc


@pytest.fixture
def no_subprocess(monkeypatch):
    """torch pinned at ``TORCH`` on a CPU machine (tests set ``mmcv_build.probe`` for others), no
    ``TORCH_CUDA_ARCH_LIST``, and any subprocess a test failure."""
    monkeypatch.setattr(mmcv_build, "torch_version", lambda: TORCH)
    monkeypatch.setattr(mmcv_build, "probe", lambda: CPU_BOX)
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail(f"ran {a}"))


def test_dry_run_prints_every_stage_and_touches_nothing(tmp_path, capsys, no_subprocess):
    assert mmcv_build.main(["--dry-run", "--cache", str(tmp_path / "cache"), "--jobs", "3"]) == 0
    target, *lines = capsys.readouterr().out.splitlines()
    assert target == f"target: CPU ops: torch {TORCH} was built without CUDA"
    stages = [line.split()[1] for line in lines[:6]]
    assert stages == ["find", "requirements", "download", "patch", "compile", "store"]
    assert [line[:4] for line in lines[:6]] == [f"[{i}/6" for i in range(1, 7)]
    assert "setuptools>=77.0.3,<81 wheel ninja psutil" in lines[1]
    assert "--no-binary :all:" in lines[2] and "mmcv==2.1.0" in lines[2]
    assert "C++17 -> C++20" in lines[3]
    compile_line = "MMCV_WITH_OPS=1 FORCE_CUDA=0 CUDA_VISIBLE_DEVICES= MAX_JOBS=3 pip wheel -v --no-deps"
    assert compile_line in lines[4] and "--no-build-isolation" in lines[4]
    assert str(tmp_path / "cache" / mmcv_build.LOG_NAME) in lines[4]
    assert str(tmp_path / "cache" / "cpu") in lines[5]
    assert not (tmp_path / "cache").exists()


def test_a_wheel_at_hand_is_reused_and_copied_into_the_cache(tmp_path, capsys, no_subprocess):
    cache, shared = tmp_path / "cache", touch(tmp_path / "shared", wheel_name())
    assert mmcv_build.main(["--cache", str(cache), "--find-links", str(shared.parent)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith("[1/1 find") and "reusing" in out[1] and "compile" not in "".join(out)
    copy = cache / "cpu" / shared.name
    assert copy.is_file() and mmcv_build.read_record(copy) == {"cuda": "cpu", "arch": "cpu"}
    assert find_wheel([cache], TORCH) == copy  # found there next time


# -- the build each machine gets -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("machine", "force_cpu", "arch_list", "cuda", "archs", "why"),
    [
        (H100, False, None, "12.8", ("9.0",), "CUDA 12.8 ops for the visible GPUs' architectures 9.0"),
        (H100, False, "8.0;9.0", "12.8", ("8.0", "9.0"), "for TORCH_CUDA_ARCH_LIST architectures 8.0;9.0"),
        (Machine("12.8", ("8.0", "9.0"), NVCC, "12.8"), False, None, "12.8", ("8.0", "9.0"), "8.0;9.0"),
        (LOGIN_NODE, False, None, "12.8", DEFAULT_ARCHS[12], "no GPU visible: the default list for CUDA 12"),
        (H100, True, None, None, (), "CPU ops, as --cpu asks although torch sees a GPU"),
        (CPU_BOX, False, None, None, (), f"CPU ops: torch {TORCH} was built without CUDA"),
        (LAPTOP, False, None, None, (), "no GPU visible and no CUDA toolkit (nvcc); `make detection` on"),
        (Machine("12.8", (), NVCC, "11.8"), False, None, None, (), f"11.8 at {NVCC}, not CUDA 12 as torch's"),
    ],
    ids=["gpu", "gpu-arch-list", "two-gpus", "login-node", "forced-cpu", "cpu-torch", "no-nvcc", "old-nvcc"],
)
def test_each_machine_gets_the_ops_it_can_run_and_says_why(machine, force_cpu, arch_list, cuda, archs, why):
    build = choose(machine, TORCH, force_cpu, arch_list)
    assert (build.cuda, build.archs) == (cuda, archs) and why in build.why
    env = build.env(jobs=3, base={"TORCH_CUDA_ARCH_LIST": "5.0", "FORCE_CUDA": "1", "PATH": "/bin"})
    assert env["MMCV_WITH_OPS"] == "1" and env["MAX_JOBS"] == "3" and env["PATH"] == "/bin"
    if cuda is None:  # CPU ops: mmcv's setup.py would build CUDA ops for any GPU torch sees
        assert (
            env["FORCE_CUDA"] == "0"
            and env["CUDA_VISIBLE_DEVICES"] == ""
            and "TORCH_CUDA_ARCH_LIST" not in env
        )
    else:
        assert env["FORCE_CUDA"] == "1" and env["TORCH_CUDA_ARCH_LIST"] == ";".join(archs)
        assert env["CUDA_HOME"] == "/opt/cuda-12.8" and "CUDA_VISIBLE_DEVICES" not in env
    assert build_refusal(machine, build, TORCH) is None  # each of these can build what it needs


@pytest.mark.parametrize(
    ("machine", "found"),
    [
        (H100_NO_NVCC, "no CUDA toolkit (nvcc) was found"),
        (H100_OLD_NVCC, "is CUDA 11.8, not 12.x"),
        (H100_BARE_NVCC, "no complete CUDA toolkit was found (/opt/cuda lacks include/cusparse.h)"),
    ],
    ids=["no-nvcc", "old-nvcc", "incomplete"],
)
def test_a_gpu_without_a_matching_nvcc_is_refused_in_one_line_exit_2(
    machine, found, tmp_path, capsys, monkeypatch, no_subprocess
):
    monkeypatch.setattr(mmcv_build, "probe", lambda: machine)
    cache = tmp_path / "cache"
    assert mmcv_build.main(["--dry-run", "--install", "--cache", str(cache)]) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and found in captured.err
    for wanted in (
        "fail at the first RoIAlign",
        "CUDA 12.8 toolkit",
        "CUDA_HOME",
        "make detection MMCV_CPU=1",
    ):
        assert wanted in captured.err, wanted
    assert "compile" not in captured.out and "install" not in captured.out  # nothing built or installed
    # a fitting CUDA build already in the cache needs no nvcc; --cpu builds CPU ops on the GPU machine
    built = touch(cache / "x", wheel_name(), torch=TORCH)
    mmcv_build.record_path(built).write_text(json.dumps({"torch": TORCH, "cuda": "12.8", "arch": "8.0;9.0"}))
    assert mmcv_build.main(["--dry-run", "--cache", str(cache)]) == 0
    assert f"reusing {built}" in capsys.readouterr().out
    assert mmcv_build.main(["--dry-run", "--cpu", "--cache", str(tmp_path / "other")]) == 0
    assert "FORCE_CUDA=0 CUDA_VISIBLE_DEVICES=" in capsys.readouterr().out


def test_a_cuda_build_compiles_with_its_arch_list_and_installs_over_any_mmcv(
    tmp_path, capsys, monkeypatch, no_subprocess
):
    monkeypatch.setattr(mmcv_build, "probe", lambda: H100)
    assert mmcv_build.main(["--dry-run", "--install", "--cache", str(tmp_path), "--jobs", "16"]) == 0
    target, *lines = capsys.readouterr().out.splitlines()
    assert target.startswith("target: CUDA 12.8 ops for the visible GPUs' architectures 9.0")
    assert [line[:4] for line in lines[:7]] == [f"[{i}/7" for i in range(1, 8)]
    assert (
        "MMCV_WITH_OPS=1 FORCE_CUDA=1 TORCH_CUDA_ARCH_LIST='9.0' CUDA_HOME=/opt/cuda-12.8 MAX_JOBS=16"
        in lines[4]
    )
    assert str(tmp_path / "cuda12.8-sm90") in lines[5]
    assert "pip install --no-deps --force-reinstall" in lines[6] and "cuda12.8-sm90/mmcv-2.1.0-" in lines[6]


# -- the cache key --------------------------------------------------------------------------------


def built_wheel(folder: Path) -> Path:
    """A wheel file that holds compiled ops, as ``pip wheel`` leaves it."""
    folder.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(folder / wheel_name(), "w") as archive:
        archive.writestr("mmcv/_ext.cpython-311-x86_64-linux-gnu.so", "")
    return folder / wheel_name()


def test_the_cache_key_keeps_cpu_and_cuda_builds_apart(tmp_path):
    cache, h100, cpu_ops = tmp_path / "cache", choose(H100, TORCH), mmcv_build.CPU_BUILD

    def store(folder: str, build: Build) -> Path:
        """A freshly built wheel of ``build`` stored in the cache."""
        wheel = built_wheel(tmp_path / folder)
        return mmcv_build.store(wheel, cache, TORCH, build, Progress(1), tmp_path / "log")

    cuda, cpu = store("a", h100), store("b", cpu_ops)
    assert cuda.name == cpu.name and cuda != cpu  # one file name, two builds, both kept
    assert mmcv_build.read_record(cuda) == {"torch": TORCH, "cxx20": True, "cuda": "12.8", "arch": "9.0"}
    assert mmcv_build.read_record(cpu) == {"torch": TORCH, "cxx20": True, "cuda": "cpu", "arch": "cpu"}
    assert find_wheel([cache], TORCH, h100) == cuda and find_wheel([cache], TORCH, cpu_ops) == cpu
    cpu.unlink()
    assert find_wheel([cache], TORCH, cpu_ops) is None  # a CUDA wheel is never taken for CPU ops ...
    cuda.unlink()
    store("c", cpu_ops)
    assert find_wheel([cache], TORCH, h100) is None  # ... nor a CPU wheel for a GPU
    assert find_wheel([cache], "2.15.0", cpu_ops) is None  # nor a wheel of another torch


@pytest.mark.parametrize(
    ("record", "cpu", "h100", "login"),
    [
        (None, True, False, False),  # no record (../shared/wheels): CPU ops
        ({"torch": TORCH}, True, False, False),  # a record from before CUDA builds: CPU ops
        ({"torch": TORCH, "cuda": "12.8", "arch": "9.0"}, False, True, False),  # not the default list
        ({"torch": TORCH, "cuda": "12.8", "arch": ";".join(DEFAULT_ARCHS[12])}, False, True, True),
        ({"torch": TORCH, "cuda": "12.6", "arch": "9.0"}, False, False, False),  # another CUDA
        ({"torch": TORCH, "cuda": "12.8", "arch": "8.0;8.6"}, False, False, False),  # not for 9.0
    ],
)
def test_a_record_fits_the_builds_it_holds(tmp_path, record, cpu, h100, login):
    wheel = touch(tmp_path, wheel_name())
    if record is not None:
        mmcv_build.record_path(wheel).write_text(json.dumps(record))
    builds = [mmcv_build.CPU_BUILD, choose(H100, TORCH), choose(LOGIN_NODE, TORCH)]
    assert [find_wheel([tmp_path], TORCH, b) == wheel for b in builds] == [cpu, h100, login]


def test_cuda_home_is_a_complete_toolkit_not_the_folder_of_a_wrapper_script(tmp_path):
    toolkit, wrapper, bare = tmp_path / "cuda-12.8", tmp_path / "usr-local" / "bin", tmp_path / "nvcc-only"
    files = [
        toolkit / "bin" / "nvcc",
        wrapper / "nvcc",
        bare / "bin" / "nvcc",
        bare / "include" / "cuda_runtime.h",
    ]
    files += [toolkit / "include" / h for h in mmcv_target.TOOLKIT_HEADERS]
    for path in files:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f'#!/bin/sh\nexec {toolkit / "bin" / "nvcc"} "$@"\n')
        path.chmod(0o755)
    on_path, none = {"PATH": str(wrapper)}, tmp_path / "none"
    # the wrapper's folder /usr-local has nvcc and no headers: not a toolkit; the fallback is
    assert mmcv_target.cuda_home(on_path, fallback=none) == (
        None,
        f"{wrapper.parent} lacks include/cuda_runtime.h",
    )
    assert mmcv_target.cuda_home(on_path, fallback=toolkit) == (toolkit, None)
    assert mmcv_target.cuda_home({**on_path, "CUDA_PATH": str(toolkit)}, fallback=none) == (toolkit, None)
    # nvcc and the runtime alone: the most complete one is named, and the next candidate taken
    assert mmcv_target.cuda_home({**on_path, "CUDA_HOME": str(bare)}, fallback=none) == (
        None, f"{bare} lacks include/cusparse.h"
    )  # fmt: skip
    assert mmcv_target.cuda_home({"CUDA_HOME": str(bare), "CUDA_PATH": str(toolkit)}, fallback=none) == (
        toolkit, None
    )  # fmt: skip


@pytest.mark.parametrize(
    ("says", "release"),
    [("Cuda compilation tools, release 12.8, V12.8.93", "12.8"), ("nvcc: command not understood", None)],
)
def test_nvcc_release_is_read_from_its_version_text(tmp_path, says, release):
    nvcc = tmp_path / "nvcc"
    nvcc.write_text(f"#!/bin/sh\necho 'nvcc: NVIDIA (R) Cuda compiler driver'\necho '{says}'\n")
    nvcc.chmod(0o755)
    assert mmcv_target.nvcc_release(nvcc) == release
    assert mmcv_target.nvcc_release(tmp_path / "missing") is None


def test_store_refuses_a_wheel_without_ops_and_records_the_torch_of_one_with_them(tmp_path, capsys):
    progress, cache, cpu = mmcv_build.Progress(1), tmp_path / "cache", mmcv_build.CPU_BUILD
    cache.mkdir()
    wheel = tmp_path / wheel_name()
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("mmcv/__init__.py", "")
    with pytest.raises(BuildError, match=r"no compiled ops \(mmcv/_ext\)"):
        mmcv_build.store(wheel, cache, TORCH, cpu, progress, cache / "x.log")
    with zipfile.ZipFile(wheel, "a") as archive:
        archive.writestr("mmcv/_ext.cpython-311-x86_64-linux-gnu.so", "")
    stored = mmcv_build.store(wheel, cache, TORCH, cpu, progress, cache / "x.log")
    assert stored == cache / "cpu" / wheel.name and not wheel.exists()
    assert json.loads(mmcv_build.record_path(stored).read_text())["torch"] == TORCH


def test_a_failed_stage_shows_the_log_tail_and_names_the_log(tmp_path, capsys):
    log = tmp_path / "build.log"
    with pytest.raises(BuildError, match=rf"stage compile \(exit 3\); full output in {log}"):
        mmcv_build.run_logged([sys.executable, "-c", "print('boom'); raise SystemExit(3)"], log, "compile")
    assert "boom" in capsys.readouterr().err


def test_check_names_the_build_log_when_the_ops_do_not_load(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "mmcv", None)  # import mmcv now raises ImportError
    (tmp_path / mmcv_build.LOG_NAME).write_text("")
    assert mmcv_build.main(["--check", "--cache", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"build log: {tmp_path / mmcv_build.LOG_NAME}" in err


def test_check_runs_the_ops_on_the_cpu_and_on_a_gpu_where_torch_sees_one(tmp_path, capsys, monkeypatch):
    pytest.importorskip("mmcv.ops")
    import torch

    from tasks.detection import ops

    assert mmcv_build.main(["--check", "--cache", str(tmp_path)]) == 0  # real roi_align and nms, CPU
    assert "roi_align and nms agree with torchvision's on cpu" in capsys.readouterr().out
    ran = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(ops, "ops_check", lambda device: ran.append(device) or {"ok": True})
    assert mmcv_build.main(["--check", "--cache", str(tmp_path)]) == 0
    assert ran == ["cpu", "cuda"] and "on cpu, cuda" in capsys.readouterr().out


def test_check_fails_in_one_line_on_a_device_the_ops_were_not_built_for(tmp_path, capsys):
    """``meta`` stands for a GPU here: mmcv's ops have no implementation for it, exactly as a CPU-only
    build has none for ``cuda`` ("implementation for device cuda:0 not found")."""
    pytest.importorskip("mmcv.ops")
    assert mmcv_build.check_ops(tmp_path, ["cpu", "meta"]) == 1
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and not captured.out
    assert (
        "RuntimeError on meta: roi_align_forward_impl: implementation for device meta not found"
        in captured.err
    )
    assert "run `make detection` on this GPU machine" in captured.err


@pytest.mark.slow
def test_the_patch_applies_to_the_real_sdist(tmp_path):
    """Downloads mmcv 2.1.0's sdist from the package index (isolated, setuptools < 81 for pkg_resources)."""
    constraint = tmp_path / "build-constraint.txt"
    constraint.write_text("setuptools<81\n")
    cmd = ["download", *mmcv_build.DOWNLOAD, "-d", str(tmp_path), "--build-constraint", str(constraint)]
    cmd.remove("--no-build-isolation")
    subprocess.run(mmcv_build.pip(*cmd), check=True, capture_output=True)
    with tarfile.open(tmp_path / "mmcv-2.1.0.tar.gz") as archive:
        text = archive.extractfile("mmcv-2.1.0/setup.py").read().decode()
    patched = patch_setup_py(text)
    assert text.count("'-std=c++17'") == 3 and "'-std=c++17'" not in patched
    assert patched.count("'-std=c++20'") == 3 and patch_setup_py(patched) == patched
    compile(patched, "setup.py", "exec")
