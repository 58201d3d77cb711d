"""The README's variants table and docs/methods.md follow the registry: a variant that is
registered but not documented (or documented but gone) fails here, naming it."""

from __future__ import annotations

import dataclasses
import re

from conftest import ROOT

from src import attention


def readme_variant_rows() -> dict[str, str]:
    """``{variant: its row}`` from the README's table under "## The attention variants"."""
    lines = (ROOT / "README.md").read_text().split("## The attention variants", 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| variant |"))
    end = next(i for i in range(start, len(lines)) if not lines[i].startswith("|"))
    rows = lines[start + 2 : end]  # below the header and its separator
    return {re.match(r"\| `([a-z_0-9]+)`", row).group(1): row for row in rows}


def test_the_readme_table_has_one_row_per_registered_variant_with_its_options():
    rows = readme_variant_rows()
    assert list(rows) == list(attention.VARIANTS)
    for name, cls in attention.VARIANTS.items():
        for option in dataclasses.fields(cls):
            assert f"`{option.name}`" in rows[name], (
                f"README: {name}'s row does not name option {option.name}"
            )


def test_methods_has_a_section_per_variant_and_the_code_cites_it():
    methods = (ROOT / "docs" / "methods.md").read_text()
    headings = set(re.findall(r"^## (\S+)", methods, flags=re.M))
    assert set(attention.VARIANTS) <= headings
    citing = [p for p in (ROOT / "src").rglob("*.py") if "docs/methods.md" in p.read_text()]
    stale = [
        str(p)
        for p in [
            *ROOT.glob("src/**/*.py"),
            *ROOT.glob("tasks/**/*.py"),
            *ROOT.glob("launch/**/*.py"),
            *ROOT.glob("conf/**/*.yaml"),
        ]
        if re.search(r"(?<!docs/)\bMETHODS\.md", p.read_text())
    ]
    assert citing and not stale, f"cite docs/methods.md, not METHODS.md: {stale}"
