"""The report's GLUE section: cells over seeds, the Cramming average per seed, its terms, the papers'."""

from __future__ import annotations

import statistics

from launch.analysis.glue_table import glue_section
from launch.analysis.records import Run
from tasks.glue.metrics import AVERAGE_TERMS

MAIN = {"cola": "val/matthews", "mrpc": "val/f1", "qqp": "val/f1", "stsb": "val/pearson"}


def run(task: str, seed: int, final: dict[str, float], attn: str = "cond_tokens", suite: str = "glue") -> Run:
    return Run(
        name=f"{suite}_{task}-{attn}-{seed}",
        task=f"{suite}_{task}",
        backbone="crammed_bert",
        attn=attn,
        seed=seed,
        status="completed",
        metric=MAIN.get(task, "val/acc"),
        metric_mode="max",
        final=final,
    )


def every_task(seed: int, value: float) -> list[Run]:
    """Runs of the nine tasks where each metric of the average is ``value``."""
    finals = {t: {"val/acc": value} for t in ("sst2", "qnli", "rte", "wnli")}
    finals |= {"cola": {"val/matthews": value}, "mrpc": {"val/f1": value}, "qqp": {"val/f1": value}}
    finals |= {"stsb": {"val/pearson": value}, "mnli": {"val/acc": value, "val/acc_mm": value}}
    return [run(t, seed, final) for t, final in finals.items()]


def section_row(lines: list[str]) -> list[str]:
    (row,) = [line for line in lines if line.startswith("| glue")]
    return [cell.strip() for cell in row.strip("|").split("|")]


def test_the_average_is_per_seed_over_the_nine_terms_then_over_seeds():
    assert len(AVERAGE_TERMS) == 9 and ("wnli", "accuracy") not in AVERAGE_TERMS
    runs = every_task(0, 0.80) + every_task(1, 0.90)
    runs[3].final["val/acc"] = 0.10  # WNLI of seed 0 (the fourth run): not in the average
    cells = section_row(glue_section(runs))
    averages = [0.80, 0.90]
    assert cells[-4] == f"{100 * statistics.fmean(averages):.1f} ± {100 * statistics.stdev(averages):.1f}"
    assert cells[-3] == "2" and cells[-1] == "79.7 (P3)"  # the seeds and the papers' cond_tokens average
    assert "50.0 ± 56.6" in cells  # WNLI's own cell shows its seeds


def test_a_seed_without_every_task_is_left_out_of_the_average_and_the_terms_are_named():
    runs = [
        run("sst2", 0, {"val/acc": 0.9}, suite="glue_tiny"),
        run("rte", 0, {"val/acc": 0.7}, suite="glue_tiny"),
    ]
    runs.append(run("sst2", 1, {"val/acc": 0.5}, suite="glue_tiny"))  # seed 1 lacks RTE
    cells = section_row(glue_section(runs))
    assert cells[:3] == ["glue_tiny", "crammed_bert", "cond_tokens"]
    assert cells[-4:] == ["80.0", "1", "rte:accuracy, sst2:accuracy", "—"]
    assert cells[3] == "70.0 ± 28.3"  # SST-2 over both seeds


def test_mnli_shows_matched_and_mismatched_and_no_glue_runs_means_no_section():
    runs = [run("mnli", s, {"val/acc": 0.8 + s / 100, "val/acc_mm": 0.7}) for s in (0, 1)]
    cells = section_row(glue_section(runs))
    assert cells[3] == "80.5 ± 0.7 / 70.0 ± 0.0"
    assert glue_section([]) == []
    assert glue_section([Run("x", "digits", "vit_digits", "standard", 0, "completed", "val/acc")]) == []
