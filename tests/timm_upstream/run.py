"""Run timm's own model tests (its ``tests/test_models.py``) on tiny models of the suite's
families with each attention variant applied, one pytest process per variant.

    python tests/timm_upstream/run.py                      # every variant
    python tests/timm_upstream/run.py precond cond_tokens  # some
    python tests/timm_upstream/run.py -- -x -k fx          # extra pytest arguments after --
    python tests/timm_upstream/run.py --jobs 1             # one variant at a time, on every core

The tests come from timm's source distribution of the installed version, fetched once with
``pip download --no-binary :all: --no-deps timm==<version>`` and unpacked into
``$XDG_CACHE_HOME/conditioned-attention/timm-<version>`` (``~/.cache`` by default; env
``TIMM_UPSTREAM_CACHE`` overrides the folder). ``conftest.py`` beside this script is the plugin
that applies the variant and picks the models. Exit status: 0 when every variant passed.

The variants run side by side, ``--jobs`` at a time (default: one per two cores, at least two),
each process on its share of the cores (``OMP_NUM_THREADS``): timm's tests are mostly small
single-threaded work, so two processes on one thread each finish sooner than one on two. The
longest (:data:`LONGEST_FIRST`: ``mimetic``, whose initialisation factorises every head's
``D × D`` target by a float64 SVD, on each model the tests create) start first. Each one's output
is printed whole when it ends.
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
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
#: variants that take several times the others (measured on 2 cores: mimetic 136 s, the others
#: 25-30 s each): started first, so that the others run beside them
LONGEST_FIRST = ("mimetic",)
_PRINTING = threading.Lock()


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


def run_variant(
    variant: str, sources: Path, extra: list[str], threads: int | None = None
) -> tuple[int, str, float]:
    """pytest over timm's test_models.py with ``variant`` (on ``threads`` torch threads; None:
    torch's default): (exit status, summary line, seconds)."""
    command = [
        sys.executable, "-m", "pytest", str(sources / "tests" / "test_models.py"),
        "-c", str(sources / "pyproject.toml"), "--rootdir", str(sources),
        "-p", "timm_upstream_plugin", "-p", "no:cacheprovider", f"--variant={variant}", "-q", "-rfE", *extra,
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(_link_plugin(sources))])}
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    start = time.perf_counter()
    done = subprocess.run(command, cwd=sources, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    with _PRINTING:  # one variant's output whole, not interleaved with another's
        sys.stdout.write(done.stdout[-20000:] + done.stderr[-5000:])
        sys.stdout.flush()
    last = (done.stdout.strip().splitlines() or [""])[-1]
    counts = re.findall(r"(\d+) (passed|failed|skipped|deselected|errors?)", last)
    return done.returncode, ", ".join(f"{n} {what}" for n, what in counts), seconds


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(ROOT))
    from src.attention import VARIANTS

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("variants", nargs="*", help=f"default: all of {', '.join(VARIANTS)}")
    parser.add_argument("--jobs", type=int, default=default_jobs(), help="variants run side by side")
    argv = sys.argv[1:] if argv is None else argv
    cut = argv.index("--") if "--" in argv else len(argv)
    args, extra = parser.parse_args(argv[:cut]), argv[cut + 1 :]
    sources = timm_sources(importlib.metadata.version("timm"))
    variants = args.variants or list(VARIANTS)
    results = run_variants(variants, sources, extra, max(1, args.jobs))
    print("\ntimm's test_models.py on the suite's tiny models, per attention variant:")
    for variant, (status, summary, seconds) in results.items():
        print(f"  {variant:<12} {'ok  ' if status == 0 else 'FAIL'} {summary} ({seconds:.0f} s)")
    return max(status for status, _, _ in results.values())


def default_jobs() -> int:
    """One variant per two cores, and at least two side by side (see the module docstring)."""
    return max(2, (os.cpu_count() or 1) // 2)


def run_variants(
    variants: list[str], sources: Path, extra: list[str], jobs: int
) -> dict[str, tuple[int, str, float]]:
    """Each variant's :func:`run_variant`, ``jobs`` at a time (the longest first), each on
    ``cores / jobs`` torch threads; the results in the order of ``variants``."""
    if jobs == 1:
        return {v: run_variant(v, sources, extra) for v in variants}
    _link_plugin(sources)  # once, before the processes start
    threads = max(1, (os.cpu_count() or 1) // jobs)
    order = sorted(variants, key=lambda v: v not in LONGEST_FIRST)  # stable: the rest as given
    with ThreadPoolExecutor(jobs) as pool:
        running = {v: pool.submit(run_variant, v, sources, extra, threads) for v in order}
        return {v: running[v].result() for v in variants}


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
