"""The engine's layout: no circle of files, and each package imports only what its docstring allows.

An import scan, not an import (``tests/import_graph.py``, shared with ``tests/test_layering.py``):
every import statement of every file in ``src/engine`` (at module level, in functions and under
``TYPE_CHECKING`` alike) is resolved to the engine file it names, relative (``from ..record import
checkpoint``) or absolute (``from src.engine.record.files import RunRecord``), and the graph of
those edges must have no cycle. ``src/engine/record`` imports nothing of ``src/engine/loop``, and
the task contract (``src/engine/task.py``) imports neither the loop nor the pipeline that composes it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from import_graph import ROOT, find_cycle, imported_files, module_file, rule_of

ENGINE = ROOT / "src" / "engine"


def engine_graph() -> dict[Path, set[Path]]:
    """Each engine file to the engine files it imports (``tests/import_graph.py``'s scan)."""
    return {
        path: {file for file in imported_files(path) if file.is_relative_to(ENGINE)}
        for path in sorted(ENGINE.rglob("*.py"))
    }


def allowed_parts(package: str) -> set[str]:
    """The engine's parts (``record``, ``loop``, ``task.py``) that ``package``'s docstring rule allows."""
    return {part(module_file(name)) for name in rule_of(ENGINE / package) if name.startswith("src.engine.")}


def shown(files: list[Path]) -> str:
    return " -> ".join(str(f.relative_to(ENGINE)) for f in files)


def part(file: Path) -> str:
    """``record``, ``loop``, or the top-level file's name (``task.py``)."""
    return file.relative_to(ENGINE).parts[0]


def test_the_scan_resolves_relative_absolute_and_function_level_imports(tmp_path):
    """The scan sees what it must, or a cycle could hide from it."""
    graph = engine_graph()
    trainer, task = ENGINE / "loop" / "trainer.py", ENGINE / "task.py"
    assert ENGINE / "record" / "checkpoint.py" in graph[trainer]  # from ..record import checkpoint
    assert task in graph[trainer]  # under TYPE_CHECKING
    assert ENGINE / "record" / "identity.py" in graph[ENGINE / "record" / "safe_config.py"]  # in a function
    assert ENGINE / "experiment.py" in graph[ENGINE / "__init__.py"]  # module __getattr__'s import


def test_the_cycle_finder_names_a_circle():
    a, b, c = (ENGINE / name for name in ("a.py", "b.py", "c.py"))
    assert shown(find_cycle({a: {b}, b: {c}, c: {a}})) == "a.py -> b.py -> c.py -> a.py"
    assert find_cycle({a: {b, c}, b: {c}, c: set()}) is None


def test_no_circle_of_files_in_the_engine():
    cycle = find_cycle(engine_graph())
    assert cycle is None, f"a circle of imports in src/engine: {shown(cycle)}"


#: what each part of the engine may import of the engine, as its docstring's ``May import:`` must say
ENGINE_RULES = {
    "record": {"record", "distributed.py"},
    "loop": {"loop", "record", "distributed.py", "task.py"},
}


@pytest.mark.parametrize("package", sorted(ENGINE_RULES))
def test_each_package_imports_only_what_its_docstring_allows(package):
    """``record`` imports nothing of ``loop``; ``loop`` imports ``record``, the processes and the
    task contract, never the pipeline that composes it. Each package's docstring says so, and the
    files keep it (``tests/test_layering.py`` holds every file to its package's rule)."""
    assert allowed_parts(package) == ENGINE_RULES[package]
    wrong = [
        f"{source.relative_to(ENGINE)} imports {target.relative_to(ENGINE)}"
        for source, targets in engine_graph().items()
        if part(source) == package
        for target in sorted(targets)
        if part(target) not in ENGINE_RULES[package]
    ]
    assert not wrong, f"src/engine/{package} may import only {sorted(ENGINE_RULES[package])}: " + "; ".join(
        wrong
    )


def test_the_task_contract_imports_neither_the_loop_nor_the_pipeline():
    """The default ``Task.fit`` leaves the shared loop to the pipeline: task.py needs no loop."""
    targets = engine_graph()[ENGINE / "task.py"]
    assert not [t for t in targets if part(t) in ("loop", "experiment.py")], sorted(map(str, targets))


def test_the_engine_and_its_schema_import_no_torch():
    """``import src.engine`` (the schema Hydra composes with) imports no torch, and a config
    naming a composition resolves without it; ``train`` imports it when first asked for."""
    code = (
        "import sys; import src.engine.schema, src.engine; from omegaconf import OmegaConf; "
        "c = OmegaConf.create({'parts': ['cond_init', 'spectral'], 'variant': '${attn_parts:${.parts}}'}); "
        "assert c.variant == 'cond_init+spectral', c.variant; "
        "assert 'torch' not in sys.modules, 'torch imported'; "
        "from src.engine import train; assert 'torch' in sys.modules and callable(train)"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
