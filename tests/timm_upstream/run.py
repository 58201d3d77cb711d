"""Run timm's own model tests (its ``tests/test_models.py``) on tiny models of the suite's
families with each attention variant applied, one pytest process per variant.

    python tests/timm_upstream/run.py                      # every variant
    python tests/timm_upstream/run.py precond cond_tokens  # some
    python tests/timm_upstream/run.py -- -x -k fx          # extra pytest arguments after --

The tests come from timm's source distribution of the installed version, fetched once with
``pip download --no-binary :all: --no-deps timm==<version>`` and unpacked into
``$XDG_CACHE_HOME/conditioned-attention/timm-<version>`` (``~/.cache`` by default; env
``TIMM_UPSTREAM_CACHE`` overrides the folder). ``conftest.py`` beside this script is the plugin
that applies the variant and picks the models. Exit status: 0 when every variant passed.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def timm_sources(version: str) -> Path:
    """timm's unpacked source distribution of ``version`` (downloaded on first use)."""
    cache = os.environ.get("TIMM_UPSTREAM_CACHE")
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "conditioned-attention"
    folder = Path(cache) if cache else base / f"timm-{version}"
    if (folder / "tests" / "test_models.py").is_file():
        return folder
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps", "--quiet",
             f"timm=={version}", "-d", tmp],
            check=True,
        )  # fmt: skip
        (archive,) = Path(tmp).glob("timm-*.tar.gz")
        with tarfile.open(archive) as tar:
            top = tar.getnames()[0].split("/")[0]
            tar.extractall(tmp, filter="data")
        folder.parent.mkdir(parents=True, exist_ok=True)
        Path(tmp, top).rename(folder)
    return folder


def run_variant(variant: str, sources: Path, extra: list[str]) -> tuple[int, str, float]:
    """pytest over timm's test_models.py with ``variant``: (exit status, summary line, seconds)."""
    command = [
        sys.executable, "-m", "pytest", str(sources / "tests" / "test_models.py"),
        "-c", str(sources / "pyproject.toml"), "--rootdir", str(sources),
        "-p", "timm_upstream_plugin", "-p", "no:cacheprovider", f"--variant={variant}", "-q", "-rfE", *extra,
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(_link_plugin(sources))])}
    start = time.perf_counter()
    done = subprocess.run(command, cwd=sources, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    sys.stdout.write(done.stdout[-20000:] + done.stderr[-5000:])
    last = (done.stdout.strip().splitlines() or [""])[-1]
    counts = re.findall(r"(\d+) (passed|failed|skipped|deselected|errors?)", last)
    return done.returncode, ", ".join(f"{n} {what}" for n, what in counts), seconds


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(ROOT))
    from src.attention import VARIANTS

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("variants", nargs="*", help=f"default: all of {', '.join(VARIANTS)}")
    argv = sys.argv[1:] if argv is None else argv
    cut = argv.index("--") if "--" in argv else len(argv)
    args, extra = parser.parse_args(argv[:cut]), argv[cut + 1 :]
    sources = timm_sources(importlib.metadata.version("timm"))
    results = {v: run_variant(v, sources, extra) for v in (args.variants or list(VARIANTS))}
    print("\ntimm's test_models.py on the suite's tiny models, per attention variant:")
    for variant, (status, summary, seconds) in results.items():
        print(f"  {variant:<12} {'ok  ' if status == 0 else 'FAIL'} {summary} ({seconds:.0f} s)")
    return max(status for status, _, _ in results.values())


def _link_plugin(sources: Path) -> Path:
    """A folder, in the cache, where ``conftest.py`` is importable as ``timm_upstream_plugin`` (a
    name no test tree uses); a link, so the plugin is always this checkout's."""
    folder = sources / "_plugin"
    folder.mkdir(exist_ok=True)
    link = folder / "timm_upstream_plugin.py"
    if link.is_symlink() and link.resolve() != HERE / "conftest.py":
        link.unlink()  # another checkout's
    if not link.exists():
        link.symlink_to(HERE / "conftest.py")
    return folder


if __name__ == "__main__":
    sys.exit(main())
