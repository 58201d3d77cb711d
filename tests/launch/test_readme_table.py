"""The README's verdict table is rebuilt from committed claims.csv files alone, touches nothing
else of the README, and ``--check`` fails where the two disagree."""

from __future__ import annotations

from pathlib import Path

import pytest

from launch.analysis import readme_table
from launch.analysis.exports import CLAIM_FIELDS, exports
from launch.analysis.readme_table import BEGIN, END


def claim_row(claim: str, effect: float, low: float, high: float, verdict: str, **more) -> dict:
    row = dict.fromkeys(CLAIM_FIELDS)
    row |= {
        "claim": claim,
        "variant": "cond_init",
        "task": "digits",
        "measure": "final",
        "metric": "test/acc",
        "role": "primary",
    }
    row |= {"n": 20, "effect": effect, "ci_low": low, "ci_high": high, "verdict": verdict}
    row |= {"verdict_holm": verdict, "host": "vm", "commit": "abc1234", "torch": "2.14.1+cpu"}
    return row | more


def write_results(folder: Path, rows: list[dict]) -> Path:
    folder.mkdir(parents=True)
    for name, content in exports([], rows).items():
        if name.startswith("claims"):
            (folder / name).write_bytes(content)
    return folder


@pytest.fixture
def results(tmp_path):
    early = write_results(
        tmp_path / "digits_500",
        [
            claim_row("P4-image", 0.037, 0.029, 0.045, "reproduced", budget="500 steps"),
            claim_row("P1-train", -0.021, -0.032, -0.010, "contradicted", budget="500 steps"),
            claim_row("P1-train", 0.5, 0.4, 0.6, "reproduced", budget="500 steps", role="exploratory"),
        ],
    )
    late = write_results(
        tmp_path / "digits_2000",
        [claim_row("P4-image", 0.004, -0.003, 0.011, "inconclusive", budget="2000 steps", verdict_holm="x")],
    )
    readme = tmp_path / "README.md"
    readme.write_text(f"# Title\n\nbefore\n{BEGIN}\nold table\n{END}\nafter\n")
    return early, late, readme


def test_the_table_is_the_primary_rows_one_column_per_budget(results):
    early, late, _ = results
    lines = readme_table.table([early, late]).splitlines()
    assert lines[0] == "| claim | variant | task | measure | 500 steps, 20 seeds | 2000 steps, 20 seeds |"
    assert lines[2] == (
        "| P1-train | `cond_init` | digits | `test/acc` (points) "
        "| −2.10 [−3.20, −1.00] **contradicted** (20) | — |"
    )
    assert lines[3] == (
        "| P4-image | `cond_init` | digits | `test/acc` (points) | +3.70 [+2.90, +4.50] **reproduced** (20) "
        "| +0.40 [−0.30, +1.10] **inconclusive †** (20) |"
    )
    assert len(lines) == 6 and "host vm; commit abc1234; torch 2.14.1+cpu" in lines[5]


def test_the_readme_is_rewritten_between_its_markers_only_and_check_says_when_it_differs(results, capsys):
    early, late, readme = results
    args = [str(early), str(late), "--readme", str(readme)]
    assert readme_table.main([*args, "--check"]) == 1
    assert readme_table.main(args) == 0
    text = readme.read_text()
    assert text.startswith(f"# Title\n\nbefore\n{BEGIN}\n| claim") and text.endswith(f"{END}\nafter\n")
    assert "old table" not in text and readme_table.main([*args, "--check"]) == 0
    assert readme.read_text() == text


def test_a_missing_file_or_marker_is_one_line_and_exit_2(results, tmp_path, capsys):
    early, _, readme = results
    assert readme_table.main([str(tmp_path / "nowhere"), "--readme", str(readme)]) == 2
    assert "no claims.csv" in capsys.readouterr().err
    readme.write_text("no markers\n")
    assert readme_table.main([str(early), "--readme", str(readme)]) == 2
    assert "needs the lines" in capsys.readouterr().err and readme.read_text() == "no markers\n"


def test_the_readmes_table_is_the_committed_results(capsys):
    """The README's verdict table is exactly what results/budgets/*/claims.csv give: a README
    number without its committed file, or a file the README does not follow, fails here."""
    from conftest import ROOT

    folders = sorted(
        (p for p in (ROOT / readme_table.RESULTS).iterdir() if p.is_dir()), key=readme_table.sweep_order
    )
    assert [p.name for p in folders] == ["digits_500", "digits_2000", "lm_char_1000_test"]
    readme = (ROOT / "README.md").read_text()
    block = readme.split(BEGIN)[1].split(END)[0].strip()
    here = readme_table.table([p.relative_to(ROOT) for p in folders])
    assert block == here.strip()
