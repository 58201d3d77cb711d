"""Every third-party module the suite imports is declared in pyproject.toml: in ``dependencies``, or
in the optional extra that guards it, so a fresh ``pip install`` brings it and nothing works only
because another package happened to pull it in.

The imports are read with :mod:`ast` from ``src``, ``tasks`` and ``launch`` (what ``pip install``
ships) and from ``tests`` (which run with the ``dev`` extra); the standard library
(:data:`sys.stdlib_module_names`) and the suite's own modules are left out, and each top-level name
is mapped to its distribution by :func:`importlib.metadata.packages_distributions`.

**[reading]** An import may rely on an extra, not on ``dependencies``, only where it is guarded:

- inside a ``try`` whose handler catches ``ImportError`` (or a wider exception): any extra will do;
- inside a function, and a docstring around it (the function's, its class's, its module's or an
  enclosing package's ``__init__``) names the extra (``the `detection` extra``), or the function
  also imports a suite package whose docstring names it (it cannot run without that extra);
- at a module's top, where the module's or an enclosing package's docstring names the extra.

The suite's tests import with ``dev``: for them every extra counts (a test of an extra's code skips
without it).
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ("src", "tasks", "launch")
SKIP = {"timm_upstream"}  # a plugin for timm's own tests (`make test-timm`), not the suite's
EXTRA_NAMED = re.compile(r"`{0,2}([\w-]+)`{0,2} extra\b")
GUARDS = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}


@dataclass(frozen=True)
class Use:
    """One top-level module imported at ``where`` (``path:line``); ``extras`` the words named as
    extras around it, or ``None`` where a ``try`` guards it (any extra will do)."""

    module: str
    where: str
    extras: frozenset[str] | None
    top: bool  # at the module's top, not inside a function


def declared(pyproject: dict | None = None) -> tuple[set[str], dict[str, set[str]]]:
    """pyproject's ``dependencies`` and ``{extra: dependencies}`` as canonical distribution names."""
    project = (pyproject or tomllib.loads((ROOT / "pyproject.toml").read_text()))["project"]

    def names(listed: list[str]) -> set[str]:
        return {canonicalize_name(Requirement(d).name) for d in listed}

    extras = {k: names(v) for k, v in project.get("optional-dependencies", {}).items()}
    return names(project["dependencies"]), extras


def files(top: str) -> list[Path]:
    return sorted(p for p in (ROOT / top).rglob("*.py") if not SKIP & set(p.relative_to(ROOT).parts))


def own_modules() -> set[str]:
    """The suite's own top-level names: its packages, and the modules and folders ``tests`` puts on
    the path (pytest's ``pythonpath`` and rootdir insertion: ``conftest``, ``smoke``, ``test_claims``...)."""
    names = {*SHIPPED, "tests"}
    for path in files("tests"):
        names.update(part.removesuffix(".py") for part in path.relative_to(ROOT / "tests").parts)
    return names


def named_extras(doc: str | None) -> set[str]:
    """The words a docstring puts before "extra" (``the `detection` extra``); pyproject's extras are
    looked up among them later, so one scan serves any pyproject."""
    return set(EXTRA_NAMED.findall(doc or ""))


@functools.cache
def docstring_extras(path: Path) -> frozenset[str]:
    return frozenset(named_extras(ast.get_docstring(ast.parse(path.read_text()))))


def package_extras(path: Path) -> set[str]:
    """Extras named by the docstrings of ``path``'s enclosing packages' ``__init__``."""
    found: set[str] = set()
    for folder in path.parents:
        if folder == ROOT or ROOT not in folder.parents:
            break
        init = folder / "__init__.py"
        if init.is_file() and init != path:
            found |= docstring_extras(init)
    return found


def module_extras(dotted: str) -> set[str]:
    """Extras named by a suite module's (or package's) own docstring and its packages'."""
    base = ROOT.joinpath(*dotted.split("."))
    for path in (base / "__init__.py", base.with_suffix(".py")):
        if path.is_file():
            return docstring_extras(path) | package_extras(path)
    return set()


def uses(path: Path, own: set[str]) -> list[Use]:
    """The third-party imports of one file, each with the extras that guard it."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[Use] = []
    outer = named_extras(ast.get_docstring(tree)) | package_extras(path)

    def visit(node: ast.AST, extras: set[str], guarded: bool, in_function: bool) -> None:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            if isinstance(node, ast.ImportFrom) and node.level:
                return
            for name in names:
                top = name.split(".")[0]
                if top in sys.stdlib_module_names or top in own:
                    continue
                where = f"{path.relative_to(ROOT)}:{node.lineno}"
                found.append(Use(top, where, None if guarded else frozenset(extras), not in_function))
            return
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            inner = extras | named_extras(ast.get_docstring(node))
            if not isinstance(node, ast.ClassDef):  # a function that needs a suite package's extra
                for sub in ast.walk(node):
                    if isinstance(sub, ast.ImportFrom) and not sub.level and sub.module:
                        if sub.module.split(".")[0] in SHIPPED:
                            inner |= module_extras(sub.module)
            for child in ast.iter_child_nodes(node):
                visit(child, inner, guarded, in_function or not isinstance(node, ast.ClassDef))
            return
        if isinstance(node, ast.Try) and any(catches(h) for h in node.handlers):
            for child in node.body:
                visit(child, extras, True, in_function)
            for child in [*node.handlers, *node.orelse, *node.finalbody]:
                visit(child, extras, guarded, in_function)
            return
        for child in ast.iter_child_nodes(node):
            visit(child, extras, guarded, in_function)

    visit(tree, outer, False, False)
    return found


def catches(handler: ast.ExceptHandler) -> bool:
    """The handler catches an import's failure (``except ImportError``, a tuple with it, or wider)."""
    if handler.type is None:
        return True
    kinds = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(isinstance(k, ast.Name) and k.id in GUARDS for k in kinds)


@functools.cache
def scan() -> tuple[tuple[str, Use, frozenset[str]], ...]:
    """Every third-party import of the suite as (its top folder, the import, its distributions)."""
    distributions = importlib.metadata.packages_distributions()
    own = own_modules()
    found = []
    for top in (*SHIPPED, "tests"):
        for path in files(top):
            for use in uses(path, own):
                # not installed here (tomli, Python 3.10's tomllib): its import name is its distribution's
                dists = frozenset(canonicalize_name(d) for d in distributions.get(use.module, [use.module]))
                found.append((top, use, dists))
    return tuple(found)


def undeclared(pyproject: dict | None = None) -> list[str]:
    """Every import whose distribution pyproject does not declare where the import needs it."""
    required, extras = declared(pyproject)
    anywhere = required | set().union(*extras.values())
    problems = []
    for top, use, dists in scan():
        if top == "tests" or use.extras is None:
            allowed = anywhere
        else:
            allowed = required.union(*(extras.get(e, set()) for e in use.extras))
        if not dists & allowed:
            named = sorted(use.extras & set(extras)) if use.extras is not None and top != "tests" else []
            where = "dependencies" + "".join(f" or its {e} extra" for e in named)
            where += " or an extra" if use.extras is None or top == "tests" else ""
            problems.append(
                f"{use.where}: imports {use.module} ({', '.join(sorted(dists))}), not declared in "
                f"pyproject.toml's {where}"
            )
    return problems


def test_every_imported_module_is_declared():
    assert undeclared() == []


def test_the_check_reads_real_imports():
    """The scan finds what the suite is known to import, with the guard each import has: torch at
    the top of src's modules; mmdet only where the ``detection`` extra is named around it (or in a
    ``try``); scipy at a module's top with no extra named (the seed-set statistics), so its place
    is ``dependencies``; and the tests' own helpers (``conftest``, ``smoke``) are not third-party."""
    shipped = [(top, u) for top, u, _ in scan() if top != "tests"]
    assert any(top == "src" and u.module == "torch" and u.top for top, u in shipped)
    mmdet = [u for _, u in shipped if u.module == "mmdet"]
    assert mmdet and all(u.extras is None or "detection" in u.extras for u in mmdet)
    scipy = [u for _, u in shipped if u.module == "scipy" and u.top and u.extras is not None]
    assert any("detection" not in u.extras for u in scipy)
    assert {"conftest", "smoke", "src"} <= own_modules()
    assert not {u.module for _, u, _ in scan()} & own_modules()


@pytest.mark.parametrize("package", ["scipy", "pyyaml", "pyarrow", "safetensors", "packaging", "torch"])
def test_removing_a_declared_package_fails_the_check(package):
    """The check on a copy of pyproject.toml without one of its dependencies: it names that package's
    imports (the whole file passes: :func:`test_every_imported_module_is_declared`)."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    listed = pyproject["project"]["dependencies"]
    kept = [d for d in listed if canonicalize_name(Requirement(d).name) != package]
    assert len(kept) == len(listed) - 1, f"{package} is not in pyproject's dependencies"
    pyproject["project"]["dependencies"] = kept
    problems = undeclared(pyproject)
    assert problems and all(f"({package}" in p or f", {package}" in p for p in problems), problems


def test_moving_a_dependency_into_an_unnamed_extra_fails_the_check():
    """mmdet in an extra that no docstring names (``vision``, not ``detection``) guards no import of it
    outside a ``try``: the detection backbones' top-level imports are reported."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    extras = pyproject["project"]["optional-dependencies"]
    extras["vision"] = [d for d in extras["detection"] if canonicalize_name(Requirement(d).name) == "mmdet"]
    extras["detection"] = [d for d in extras["detection"] if d not in extras["vision"]]
    problems = undeclared(pyproject)
    assert any(p.startswith("src/models/detection/detector.py") and "mmdet" in p for p in problems), problems
