"""The house's layering: ``launch → tasks → src``, no circle of files, each package as its docstring says.

An import scan, not an import (``tests/import_graph.py``): every import statement of every file in
``src/``, ``tasks/`` and ``launch/`` (at module level, in functions and under ``TYPE_CHECKING``).
``src`` imports neither ``tasks`` nor ``launch``; ``tasks`` imports no ``launch``; ``launch/analysis``
imports neither ``launch/cluster``, ``launch/tools`` nor the planning modules at ``launch/``'s top;
no file imports one that imports it back; and each package's opening docstring holds the rule
its files keep, a paragraph ``May import: ``a``, ``b.c``.`` which this test reads.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from import_graph import (
    LAYERS,
    ROOT,
    allowed,
    find_cycle,
    import_graph,
    imported_modules,
    module_file,
    python_files,
    rule_of,
    violations,
)

#: the packages whose docstring states what they may import (a file keeps its nearest one's rule)
RULED = (
    "src",
    "src/attention",
    "src/conditioning",
    "src/models",
    "src/engine/record",
    "src/engine/loop",
    "tasks",
    "launch",
    "launch/analysis",
    "launch/cluster",
    "launch/tools",
)
#: what reading results never needs: the cluster, the instruments, the planning modules
NOT_FOR_ANALYSIS = ("launch.cluster", "launch.tools", "launch.plan", "launch.wandb_sweep")


def upward(files: list[Path], root: Path = ROOT) -> list[str]:
    """``file:line imports module`` for each import of a layer above the file's own (:data:`LAYERS`)."""
    return [
        f"{path.relative_to(root)}:{line} imports {module}"
        for path in files
        for line, module in imported_modules(path, root)
        if LAYERS.index(module.split(".")[0]) > LAYERS.index(path.relative_to(root).parts[0])
    ]


def into(files: list[Path], forbidden: tuple[str, ...], root: Path = ROOT) -> list[str]:
    """``file:line imports module`` for each import of a module under one of ``forbidden``, or of
    the bare package above them (``import launch``)."""
    return [
        f"{path.relative_to(root)}:{line} imports {module}"
        for path in files
        for line, module in imported_modules(path, root)
        if allowed(module, forbidden) or module == "launch"
    ]


def shown(files: list[Path], root: Path = ROOT) -> str:
    return " -> ".join(str(f.relative_to(root)) for f in files)


def plant(root: Path, files: dict[str, str]) -> list[Path]:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return python_files(root)


def test_the_scan_flags_a_planted_upward_import_in_a_function_and_under_type_checking(tmp_path):
    """The scan sees what it must, or the rules below could pass on nothing."""
    files = plant(
        tmp_path,
        {
            "src/__init__.py": '"""Core.\n\nMay import: ``src``.\n"""\n',
            "src/core.py": "def build():\n    from tasks.toy import Toy\n    return Toy\n",
            "src/typed.py": "import typing\nif typing.TYPE_CHECKING:\n    from ..launch import plan\n",
            "tasks/__init__.py": '"""Tasks.\n\nMay import: ``src``, ``tasks``.\n"""\n',
            "tasks/toy.py": "from src import core\n\nToy = core\n",
            "launch/__init__.py": '"""Launch.\n\nMay import: ``src``, ``tasks``, ``launch.plan``.\n"""\n',
            "launch/plan.py": "import tasks.toy\n",
        },
    )
    expected = ["src/core.py:2 imports tasks.toy", "src/typed.py:3 imports launch.plan"]
    assert upward(files, tmp_path) == expected
    assert [v.split(" (")[0] for v in violations(files, tmp_path)] == expected
    assert (
        shown(find_cycle(import_graph(files, tmp_path)), tmp_path)
        == "tasks/toy.py -> src/core.py -> tasks/toy.py"
    )


def test_a_rule_that_is_not_of_the_form_fails_rather_than_allowing_nothing(tmp_path):
    plant(tmp_path, {"src/__init__.py": '"""Core.\n\nMay import: src and tasks\n"""\n'})
    with pytest.raises(AssertionError, match="is not"):
        rule_of(tmp_path / "src")


def test_the_real_scan_sees_function_level_and_relative_imports():
    modules = dict(imported_modules(ROOT / "tasks" / "lm" / "sampling.py"))
    assert "tasks.lm.task" in modules.values()  # in load(), a function
    assert ("src.engine.loop.evaluation") in modules.values()  # from src.engine.loop import evaluation


@pytest.mark.parametrize("package", RULED)
def test_each_package_states_what_it_may_import(package):
    rule = rule_of(ROOT / package)
    assert rule, f"{package}/__init__.py: no 'May import: ``…``.' paragraph in its docstring"
    missing = [name for name in rule if module_file(name) is None]
    assert not missing, f"{package}'s rule names modules that do not exist: {missing}"


def test_each_file_imports_only_what_its_package_allows():
    wrong = violations(python_files())
    assert not wrong, "imports outside their package's 'May import:' rule:\n" + "\n".join(wrong)


def test_launch_imports_tasks_imports_src_and_never_upward():
    wrong = upward(python_files())
    assert not wrong, "launch → tasks → src only:\n" + "\n".join(wrong)


def test_the_rules_themselves_point_only_downward():
    """A docstring cannot allow what the house forbids: each rule names its own layer or one below."""
    wrong = [
        f"{package} allows {name}"
        for package in RULED
        for name in rule_of(ROOT / package)
        if LAYERS.index(name.split(".")[0]) > LAYERS.index(package.split("/")[0])
    ]
    wrong += [
        f"launch/analysis allows {n}"
        for n in rule_of(ROOT / "launch/analysis")
        if allowed(n, NOT_FOR_ANALYSIS)
    ]
    assert not wrong, wrong


def test_analysis_imports_no_cluster_no_tools_and_no_planning():
    wrong = into(python_files(folders=("launch/analysis",)), NOT_FOR_ANALYSIS)
    assert not wrong, (
        "launch/analysis reads results with neither cluster, instrument nor plan:\n" + "\n".join(wrong)
    )


def test_no_circle_of_files_in_src_tasks_and_launch():
    cycle = find_cycle(import_graph(python_files()))
    assert cycle is None, f"a circle of imports: {shown(cycle)}"
