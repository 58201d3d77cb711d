"""constraints.txt, the versions `make install` installs, agrees with pyproject.toml's ranges: every
dependency (extras included) is pinned to one version inside its range, and the install uses it."""

from __future__ import annotations

import re
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]


def pins() -> dict[str, Version]:
    """``constraints.txt`` as {canonical name: version}; every line must be ``name==version``."""
    pinned: dict[str, Version] = {}
    for number, raw in enumerate((ROOT / "constraints.txt").read_text().splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        requirement = Requirement(line)
        (spec,) = requirement.specifier  # one specifier: a pin
        assert spec.operator == "==" and not requirement.extras and not requirement.marker, (number, raw)
        name = canonicalize_name(requirement.name)
        assert name not in pinned, f"constraints.txt:{number}: {requirement.name} pinned twice"
        pinned[name] = Version(spec.version)
    return pinned


def dependencies() -> list[Requirement]:
    """pyproject.toml's dependencies and every extra's."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    listed = [
        *project["dependencies"],
        *(d for extra in project["optional-dependencies"].values() for d in extra),
    ]
    return [Requirement(d) for d in listed]


def test_every_dependency_is_pinned_inside_its_range():
    pinned = pins()
    for requirement in dependencies():
        name = canonicalize_name(requirement.name)
        assert name in pinned, f"{requirement} (pyproject.toml) has no pin in constraints.txt"
        assert requirement.specifier.contains(pinned[name], prereleases=True), (
            f"constraints.txt pins {requirement.name}=={pinned[name]}, outside pyproject.toml's {requirement}"
        )
        for extra in requirement.extras:  # mkdocstrings[python] brings mkdocstrings-python
            assert canonicalize_name(f"{requirement.name}-{extra}") in pinned, f"{requirement}: its extra"


def test_a_pin_outside_a_range_would_be_caught():
    """The check above on a planted disagreement: pyproject's hydra-core range against a 1.4 pin."""
    (hydra,) = [r for r in dependencies() if canonicalize_name(r.name) == "hydra-core"]
    assert not hydra.specifier.contains(Version("1.4.0"))
    assert hydra.specifier.contains(pins()["hydra-core"])


def test_a_pin_accepts_pytorchs_other_cuda_builds_of_the_release():
    """PEP 440: ``torch==2.14.1`` matches a local version such as ``2.14.1+cu128``, so an install of
    another CUDA build (docs/getting-started.md) still satisfies the constraints."""
    pinned = pins()["torch"]
    assert Requirement(f"torch=={pinned}").specifier.contains(Version(f"{pinned}+cu128"))


def test_make_install_installs_with_the_constraints():
    makefile = (ROOT / "Makefile").read_text()
    default = re.search(r"^CONSTRAINTS \?= (\S+)$", makefile, re.MULTILINE)
    assert default and default.group(1) == "constraints.txt"
    recipe = re.search(r"^install:.*\n((?:\t.*\n|ifeq.*\n|endif\n)+)", makefile, re.MULTILINE).group(1)
    (pip,) = [line for line in recipe.splitlines() if "pip install" in line and "-e " in line]
    assert "-c $(CONSTRAINTS)" in pip
