"""The engine's layout: no circle of files, and each package imports only what its docstring allows.

An import scan, not an import: every ``import`` and ``from … import`` statement of every file in
``src/engine`` (at module level, in functions and under ``TYPE_CHECKING`` alike) is resolved to
the engine file it names, relative (``from ..record import checkpoint``) or absolute
(``from src.engine.record.files import RunRecord``), and the graph of those edges must have no
cycle. ``src/engine/record`` imports nothing of ``src/engine/loop``, and the task contract
(``src/engine/task.py``) imports neither the loop nor the pipeline that composes it.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENGINE = ROOT / "src" / "engine"

#: What each package of the engine may import from the engine (its opening docstring says so).
ALLOWED = {
    "record": {"record", "distributed.py"},
    "loop": {"loop", "record", "distributed.py", "task.py"},
}


def module_file(dotted: str) -> Path | None:
    """The file of a dotted module path under the repository root (a package's ``__init__.py``),
    or None where it is no file of the repository (a name imported from a module)."""
    base = ROOT.joinpath(*dotted.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def package_of(path: Path) -> str:
    """The dotted package a file's relative imports start from."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts if path.name == "__init__.py" else parts[:-1]).removesuffix(".__init__")


def imported_files(path: Path) -> set[Path]:
    """The engine files ``path`` imports, by every import statement it holds."""
    found: set[Path] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package_of(path).split(".")
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            # `from pkg import name`: the submodule pkg.name where there is one, else pkg itself
            targets = [
                f"{module}.{alias.name}" if module_file(f"{module}.{alias.name}") else module
                for alias in node.names
            ]
        else:
            continue
        for target in targets:
            if target == "src.engine" or target.startswith("src.engine."):
                file = module_file(target)
                assert file is not None, f"{path.relative_to(ROOT)} imports {target}, which is no file"
                found.add(file)
    found.discard(path)
    return found


def engine_graph() -> dict[Path, set[Path]]:
    return {path: imported_files(path) for path in sorted(ENGINE.rglob("*.py"))}


def find_cycle(graph: dict[Path, set[Path]]) -> list[Path] | None:
    """A cycle of ``graph`` as the files around it (the first repeated at the end), or None."""
    state: dict[Path, str] = {}
    stack: list[Path] = []

    def visit(node: Path) -> list[Path] | None:
        state[node], _ = "open", stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node], _ = "done", stack.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


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


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_each_package_imports_only_what_its_docstring_allows(package):
    """``record`` imports nothing of ``loop``; ``loop`` imports ``record``, the processes and the
    task contract, never the pipeline that composes it. Each package's docstring says so."""
    docstring = ast.get_docstring(ast.parse((ENGINE / package / "__init__.py").read_text()))
    assert docstring and "import" in docstring
    wrong = [
        f"{source.relative_to(ENGINE)} imports {target.relative_to(ENGINE)}"
        for source, targets in engine_graph().items()
        if part(source) == package
        for target in sorted(targets)
        if part(target) not in ALLOWED[package]
    ]
    assert not wrong, f"src/engine/{package} may import only {sorted(ALLOWED[package])}: " + "; ".join(wrong)


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
