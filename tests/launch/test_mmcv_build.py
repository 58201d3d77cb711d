"""``launch.mmcv_build``: the setup.py patch, the wheel lookup, the stages of a (dry) build.

The compile itself (about 30 minutes) is never run here; the slow test checks that the patch
applies to the real sdist's ``setup.py``.
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

from launch import mmcv_build
from launch.mmcv_build import BuildError, find_wheel, needs_cxx20, patch_setup_py

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


@pytest.fixture
def no_subprocess(monkeypatch):
    """torch pinned at ``TORCH``, and any subprocess a test failure."""
    monkeypatch.setattr(mmcv_build, "torch_version", lambda: TORCH)
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail(f"ran {a}"))


def test_dry_run_prints_every_stage_and_touches_nothing(tmp_path, capsys, no_subprocess):
    assert mmcv_build.main(["--dry-run", "--cache", str(tmp_path / "cache"), "--jobs", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    stages = [line.split()[1] for line in lines[:6]]
    assert stages == ["find", "requirements", "download", "patch", "compile", "store"]
    assert [line[:4] for line in lines[:6]] == [f"[{i}/6" for i in range(1, 7)]
    assert "setuptools>=77.0.3,<81 wheel ninja psutil" in lines[1]
    assert "--no-binary :all:" in lines[2] and "mmcv==2.1.0" in lines[2]
    assert "C++17 -> C++20" in lines[3]
    assert "MMCV_WITH_OPS=1 FORCE_CUDA=0 MAX_JOBS=3 pip wheel -v --no-deps --no-build-isolation" in lines[4]
    assert str(tmp_path / "cache" / mmcv_build.LOG_NAME) in lines[4]
    assert not (tmp_path / "cache").exists()


def test_a_wheel_at_hand_is_reused_and_copied_into_the_cache(tmp_path, capsys, no_subprocess):
    cache, shared = tmp_path / "cache", touch(tmp_path / "shared", wheel_name())
    assert mmcv_build.main(["--cache", str(cache), "--find-links", str(shared.parent)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("[1/1 find") and "reusing" in out and "compile" not in out
    assert (cache / shared.name).is_file() and not mmcv_build.record_path(cache / shared.name).exists()


def test_store_refuses_a_wheel_without_ops_and_records_the_torch_of_one_with_them(tmp_path, capsys):
    progress, cache = mmcv_build.Progress(1), tmp_path / "cache"
    cache.mkdir()
    wheel = tmp_path / wheel_name()
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("mmcv/__init__.py", "")
    with pytest.raises(BuildError, match=r"no compiled ops \(mmcv/_ext\)"):
        mmcv_build.store(wheel, cache, TORCH, progress, cache / "x.log")
    with zipfile.ZipFile(wheel, "a") as archive:
        archive.writestr("mmcv/_ext.cpython-311-x86_64-linux-gnu.so", "")
    stored = mmcv_build.store(wheel, cache, TORCH, progress, cache / "x.log")
    assert stored == cache / wheel.name and not wheel.exists()
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
