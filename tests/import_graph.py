"""The suite's import statements, read without importing anything: the scan behind the layout tests.

Every ``import`` and ``from … import`` statement of a file (at module level, in functions and
under ``TYPE_CHECKING`` alike) is resolved to the module it names, relative (``from ..record import
checkpoint``) or absolute (``from src.engine.record.files import RunRecord``); ``from pkg import
name`` names the submodule ``pkg.name`` where there is one, else ``pkg`` itself. Only the suite's
own packages (:data:`LAYERS`) are followed. A package states what its files may import in its
opening docstring, in a paragraph of its own, ``May import: a, b.c, …`` (:func:`rule_of`): dotted
modules, comma-separated, each in double backticks, the last followed by a period; the paragraph may
wrap. Each module allows itself and everything under it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: the suite's own top-level packages, lowest first: each may import only those before it
LAYERS = ("src", "tasks", "launch")
#: the rule's paragraph: from ``May import:`` at a line's start to a blank line or the docstring's end
RULE = re.compile(r"^May import: (.+?)(?:\n\s*\n|\Z)", re.MULTILINE | re.DOTALL)
NAME = re.compile(r"``([A-Za-z_][\w.]*)``")


def module_file(dotted: str, root: Path = ROOT) -> Path | None:
    """The file of a dotted module under ``root`` (a package's ``__init__.py``), or None where it is
    no file there (a name imported from a module)."""
    base = root.joinpath(*dotted.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def module_name(path: Path, root: Path = ROOT) -> str:
    """``src/engine/task.py`` → ``src.engine.task``; a package's ``__init__.py`` → the package."""
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if path.name == "__init__.py" else parts)


def package_of(path: Path, root: Path = ROOT) -> str:
    """The dotted package a file's relative imports start from."""
    name = module_name(path, root)
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def imported_modules(path: Path, root: Path = ROOT) -> list[tuple[int, str]]:
    """``(line, module)`` for each module of :data:`LAYERS` that an import statement of ``path`` names."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                base = package_of(path, root).split(".")
                module = ".".join(base[: len(base) - (node.level - 1)] + ([module] if module else []))
            targets = [
                f"{module}.{alias.name}" if module_file(f"{module}.{alias.name}", root) else module
                for alias in node.names
            ]
        else:
            continue
        found += [(node.lineno, t) for t in targets if t.split(".")[0] in LAYERS]
    return sorted(found)


def imported_files(path: Path, root: Path = ROOT) -> set[Path]:
    """The suite's files ``path`` imports (itself left out), by every import statement it holds."""
    found: set[Path] = set()
    for _, target in imported_modules(path, root):
        file = module_file(target, root)
        assert file is not None, f"{path.relative_to(root)} imports {target}, which is no file"
        found.add(file)
    found.discard(path)
    return found


def python_files(root: Path = ROOT, folders: tuple[str, ...] = LAYERS) -> list[Path]:
    return sorted(p for folder in folders for p in (root / folder).rglob("*.py"))


def import_graph(files: list[Path], root: Path = ROOT) -> dict[Path, set[Path]]:
    """Each file to the files it imports."""
    return {path: imported_files(path, root) for path in files}


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


def rule_of(package: Path) -> tuple[str, ...] | None:
    """The modules a package's opening docstring says its files may import (its ``May import:``
    paragraph), or None without one; a paragraph not of that form fails."""
    docstring = ast.get_docstring(ast.parse((package / "__init__.py").read_text(encoding="utf-8"))) or ""
    found = RULE.findall(docstring)
    assert len(found) <= 1, f"{package}: more than one 'May import:' line"
    if not found:
        return None
    text = " ".join(found[0].split())
    names = tuple(NAME.findall(text))
    assert names and text == ", ".join(f"``{n}``" for n in names) + ".", (
        f"{package}: 'May import: {text}' is not ``a``, ``b.c``, … ending in a period"
    )
    return names


def governing_rule(path: Path, root: Path = ROOT) -> tuple[Path, tuple[str, ...]] | None:
    """The nearest package above ``path`` (or that ``path``'s ``__init__.py`` opens) with a rule, and
    the rule; None where no package up to its top-level one states one."""
    folder = path.parent
    while folder != root:
        if (rule := rule_of(folder)) is not None:
            return folder, rule
        folder = folder.parent
    return None


def allowed(module: str, rule: tuple[str, ...]) -> bool:
    """Whether ``module`` is one of the rule's modules or under one of them."""
    return any(module == name or module.startswith(name + ".") for name in rule)


def violations(files: list[Path], root: Path = ROOT) -> list[str]:
    """``file:line imports module (package may import: …)`` for each import outside its package's rule."""
    wrong = []
    for path in files:
        governed = governing_rule(path, root)
        assert governed is not None, f"{path.relative_to(root)}: no package above it says what it may import"
        package, rule = governed
        for line, module in imported_modules(path, root):
            if not allowed(module, rule):
                where = f"{package.relative_to(root).as_posix()} may import: {', '.join(rule)}"
                wrong.append(f"{path.relative_to(root)}:{line} imports {module} ({where})")
    return wrong
