"""The report on hand-made records with known numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import one_error_line
from omegaconf import OmegaConf

from launch.analysis import report
from launch.analysis.records import read_run, read_runs, read_wandb
from src.engine.record.identity import Identity

STEPS = list(range(100, 1001, 100))


def write_run(
    root: Path,
    attn: str,
    seed: int,
    curve: list[float] | None,
    status: str = "completed",
    error: str | None = None,
    task: str = "imagenet",
    backbone: str = "vit_base",
    settings: dict | None = None,
    folder: Path | None = None,
    metric_mode: str | None = None,
    test: float | None = None,
) -> Path:
    """A run folder as the suite writes it; ``curve`` is val/acc at STEPS (its last value is final,
    its highest the best); ``settings`` (dotted keys) go into its config; ``test``: its test/acc,
    in ``eval-test.json`` as ``python -m src.eval`` writes it (of the record's identity: the hash
    of its config.yaml, as the record has no identity.json)."""
    folder = folder or root / task / backbone / attn / f"seed={seed}"
    folder.mkdir(parents=True)
    cfg = OmegaConf.create(
        {
            "task": {"name": task, "metric": "val/acc"},
            "backbone": {"name": backbone},
            "attn": {"variant": attn},
            "seed": seed,
        }
    )
    for key, value in (settings or {}).items():
        OmegaConf.update(cfg, key, value, force_add=True)
    OmegaConf.save(cfg, folder / "config.yaml")
    rows = [{"step": s, "split": "val", "val/acc": v} for s, v in zip(STEPS, curve or [], strict=False)]
    rows += [
        {"step": s, "split": "monitor", "kappa/W_Q/median": 3.0 - i / 10} for i, s in enumerate(STEPS[:3])
    ]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if status != "incomplete":
        summary = {
            "status": status,
            "metric": "val/acc",
            "steps_per_epoch": 10,
            "error": error,
            "final": {"val/acc": curve[-1]} if status == "completed" else {},
            "best": {"val/acc": max(curve), "step": STEPS[curve.index(max(curve))]} if curve else {},
            "steps": STEPS[len(curve) - 1] if curve else 0,
            "wall_s": 2.5,
            **({"metric_mode": metric_mode} if metric_mode else {}),
        }
        (folder / "summary.json").write_text(json.dumps(summary))
    if test is not None:
        evaluation = {
            **{"split": "test", "checkpoint": "best", "checkpoint_step": summary["best"]["step"]},
            "metric": "test/acc",
            **{"metric_mode": "max", "metrics": {"test/acc": test, "test/loss": 1.2}, "samples": 2000},
            **{"task": task, "wall_s": 3.2, "time": "2026-12-01 21:40:00", "git": "abc123"},
            **{"identity": identity_of(folder), "record_identity": identity_of(folder), "overrides": []},
        }
        (folder / "eval-test.json").write_text(json.dumps(evaluation))
    return folder


def identity_of(folder: Path) -> str:
    """The identity hash of the record in ``folder`` that has no identity.json: its config.yaml's."""
    return Identity.of(OmegaConf.to_container(OmegaConf.load(folder / "config.yaml"), resolve=False)).hash


@pytest.fixture
def runs_root(tmp_path) -> Path:
    ramp = lambda end, at: [min(end, end * (s / at)) for s in STEPS]  # noqa: E731  reaches `end` at step `at`
    for seed, final in enumerate([0.80, 0.81, 0.82]):
        write_run(tmp_path, "standard", seed, ramp(final, 1000))
    write_run(tmp_path, "cond_init", 0, [*[0.5] * 6, 0.81, 0.82, 0.83, 0.83])  # reaches 0.81 at step 700
    write_run(tmp_path, "cond_init", 1, [*[0.5] * 5, 0.81, 0.82, 0.84, 0.85, 0.85])  # at step 600
    write_run(tmp_path, "precond", 0, None, status="failed", error="RuntimeError: planted failure")
    write_run(tmp_path, "precond", 1, [0.3, 0.4], status="incomplete")
    return tmp_path


def test_means_stds_and_gains_are_right(runs_root):
    cells = {c.attn: c for c in report.table(read_runs([runs_root]))}
    assert set(cells) == {"standard", "cond_init"}  # failed and incomplete runs are not averaged
    std = cells["standard"]
    assert (std.n, std.mean, std.std) == (3, pytest.approx(0.81), pytest.approx(0.01))
    ci = cells["cond_init"]
    assert (ci.n, ci.mean, ci.std) == (2, pytest.approx(0.84), pytest.approx(0.0141421356))
    assert ci.gain == pytest.approx(0.03)
    assert (ci.paper.value, ci.paper.baseline, ci.paper.source) == (0.815, pytest.approx(0.803), "P4")


def test_steps_to_reach_the_baseline_are_right(runs_root):
    conv = {c.attn: c for c in report.convergence(read_runs([runs_root]))}
    assert conv["standard"].steps == 1000 and conv["standard"].ratio == 1.0
    ci = conv["cond_init"]
    # arrivals at 600 and 700: the Kaplan–Meier median is the first step by which half have arrived
    assert (ci.steps, ci.reached, ci.seeds, ci.ratio, ci.epochs) == (600, 2, 2, 0.6, 60.0)


def test_the_report_lists_failed_and_missing_runs(runs_root, capsys):
    assert report.main([str(runs_root), "--out", str(runs_root / "out")]) == 0
    text = (runs_root / "out" / "report.md").read_text()
    row = "| cond_init | — | 1000 (100 ep) | val | val/acc | 84.00 ± 1.41 | 2 | 3.00 | 81.50 (P4) | 1.20 "
    row += "| 2.50 (val vs test) |"
    assert f"| imagenet | vit_base {row}" in text
    assert "| imagenet | vit_base | cond_init | — | 600 | 60.0 | 2/2 | 0.60 | 0.70 |" in text
    assert "## Runs that did not complete (2)" in text
    assert "RuntimeError: planted failure" in text and "last logged step 300" in text  # its monitor rows
    for name in ("curves_imagenet_vit_base.png", "kappa_imagenet_vit_base.png"):
        assert (runs_root / "out" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_vit_base_runs_also_stand_beside_the_papers_deit_b_row(runs_root):
    """DeiT-B is ViT-B/16 with DeiT's recipe, the recipe the ViT-B runs train with: the report sets
    the same runs beside DeiT-B's paper numbers (P4: 82.7 from 81.6) and P4's DeiT-B epochs (206 of
    300), naming whose runs they are; the ViT-B rows stay as they were."""
    assert report.main([str(runs_root), "--out", str(runs_root / "out")]) == 0
    text = (runs_root / "out" / "report.md").read_text()
    ours = "| cond_init | — | 1000 (100 ep) | val | val/acc | 84.00 ± 1.41 | 2 | 3.00 "
    assert f"| imagenet | vit_base {ours}| 81.50 (P4) | 1.20 | 2.50 (val vs test) |" in text
    assert f"| imagenet | deit_base (vit_base runs) {ours}| 82.70 (P4) | 1.10 | 1.30 (val vs test) |" in text
    assert "| imagenet | deit_base (vit_base runs) | cond_init | — | 600 | 60.0 | 2/2 | 0.60 | 0.69 |" in text


def test_no_runs_is_an_error(tmp_path, capsys):
    assert report.main([str(tmp_path)]) == 2
    assert "no run folders" in capsys.readouterr().err


class FakeWandbRun:
    def __init__(self, attn, seed, final, state="finished"):
        self.id, self.state = f"{attn}-{seed}", state
        self.config = {
            "task": {"name": "digits", "metric": "val/acc"},
            "backbone": {"name": "vit_digits"},
            "attn": {"variant": attn},
            "seed": seed,
        }
        self.summary = {"final/val/acc": final} if state == "finished" else {}

    def scan_history(self):
        return [{"_step": 10, "val/acc": 0.5}, {"_step": 20, "kappa/W_Q/median": 2.0}]


class FakeApi:
    def runs(self, path):
        assert path == "me/project"
        return [
            FakeWandbRun("standard", 0, 0.9),
            FakeWandbRun("standard", 1, 0.92),
            FakeWandbRun("spectral", 0, 0, "crashed"),
        ]


def test_runs_can_come_from_wandb():
    runs = read_wandb("me/project", api=FakeApi())
    (cell,) = report.table(runs)
    assert cell.mean == pytest.approx(0.91) and cell.n == 2
    crashed = [r for r in runs if r.status != "completed"]
    assert [(r.attn, r.status) for r in crashed] == [("spectral", "failed")]
    assert runs[0].series("kappa/W_Q/median", "monitor") == ([20], [2.0])


# -- experiments are identities, not folder names -------------------------------------------------


def test_runs_of_different_settings_are_never_pooled_as_seeds(tmp_path):
    """The finding: a 1000-step `spectral mode=svd` run and a 100-step `spectral lam=10` run
    became one cell "60.83 ± 51.85, n=2"."""
    write_run(tmp_path, "spectral", 0, [0.9] * 10, settings={"attn.mode": "svd", "trainer.max_steps": 1000})
    write_run(
        tmp_path / "b", "spectral", 0, [0.2] * 10, settings={"attn.lam": 10.0, "trainer.max_steps": 100}
    )
    write_run(
        tmp_path / "c", "spectral", 1, [0.3] * 10, settings={"attn.lam": 10.0, "trainer.max_steps": 100}
    )
    cells = sorted(report.table(read_runs([tmp_path])), key=lambda c: c.mean)
    assert [(c.n, c.mean) for c in cells] == [(2, pytest.approx(0.25)), (1, pytest.approx(0.9))]
    assert (cells[0].variant, cells[0].label) == ("spectral", "trainer.max_steps=100")  # lam=10: the default
    assert (cells[1].variant, cells[1].label) == ("spectral mode=svd", "trainer.max_steps=1000")
    assert report.main([str(tmp_path), "--out", str(tmp_path / "out")]) == 0
    assert (
        "| spectral | trainer.max_steps=100 | 1000 (100 ep) | val | val/acc | 25.00 ± 7.07 | 2 |"
        in (tmp_path / "out" / "report.md").read_text()
    )


def test_the_same_experiment_and_seed_twice_is_a_duplicate_counted_once(tmp_path):
    write_run(tmp_path, "standard", 0, [0.8] * 10)
    write_run(tmp_path, "standard", 0, [0.8] * 10, folder=tmp_path / "again" / "standard")
    write_run(tmp_path, "standard", 1, [0.9] * 10)
    (cell,) = report.table(read_runs([tmp_path]))
    assert cell.n == 2 and cell.mean == pytest.approx(0.85)
    assert report.main([str(tmp_path), "--out", str(tmp_path / "out")]) == 0
    text = (tmp_path / "out" / "report.md").read_text()
    assert "## Duplicate runs (1)" in text and f"{tmp_path / 'imagenet'}" in text


def test_which_way_is_better_comes_from_the_summary_not_the_metric_name(tmp_path):
    """A metric named like an accuracy that is minimised (an error rate logged as val/acc here)."""
    for seed in (0, 1):
        write_run(tmp_path, "standard", seed, [1.0 - s / 2000 for s in STEPS], metric_mode="min")
    write_run(tmp_path, "cond_init", 0, [1.0 - s / 1000 for s in STEPS], metric_mode="min")
    conv = {c.attn: c for c in report.convergence(read_runs([tmp_path]))}
    assert conv["cond_init"].steps == 500 and conv["cond_init"].ratio == 0.5  # 0.5 reached at step 500


def test_a_run_that_crashed_before_training_is_listed_as_failed_to_start_and_a_refused_one_is_not(tmp_path):
    folder = tmp_path / "digits" / "vit_digits" / "standard" / "seed=0"
    (folder / ".hydra").mkdir(parents=True)
    hydra_config = {  # as Hydra saves it: unresolved (this interpolation cannot resolve here)
        "task": {"name": "digits"},
        "backbone": {"name": "vit_digits"},
        "attn": {"variant": "standard"},
        "seed": 0,
        "paths": {"data_dir": "${oc.env:NOPE}"},
    }
    OmegaConf.save(OmegaConf.create(hydra_config), folder / ".hydra" / "config.yaml")
    (folder / "failures.jsonl").write_text(json.dumps({"error": "RuntimeError: worker died"}) + "\n")
    refused = tmp_path / "digits" / "vit_digits" / "spectral" / "seed=0"  # bad input: the run never ran
    (refused / ".hydra").mkdir(parents=True)
    OmegaConf.save(
        OmegaConf.create({**hydra_config, "attn": {"variant": "spectral"}}),
        refused / ".hydra" / "config.yaml",
    )
    (refused / "failures.jsonl").write_text(json.dumps({"error": "DataError: missing data folder x"}) + "\n")
    bare = tmp_path / "digits" / "vit_digits" / "precond" / "seed=0"
    (bare / ".hydra").mkdir(parents=True)
    text = (folder / ".hydra" / "config.yaml").read_text()
    (bare / ".hydra" / "config.yaml").write_text(text.replace("variant: standard", "variant: precond"))
    runs = {r.attn: r for r in read_runs([tmp_path])}
    assert (runs["standard"].status, runs["standard"].error) == (
        "failed to start",
        "RuntimeError: worker died",
    )
    assert "spectral" not in runs and read_run(refused).status == "refused"  # listed nowhere
    assert runs["precond"].status == "failed to start" and "before writing anything" in runs["precond"].error


def test_a_torn_record_is_read_with_a_warning_and_a_damaged_one_is_listed(tmp_path):
    torn = write_run(tmp_path, "standard", 0, [0.8] * 10)
    with open(torn / "metrics.jsonl", "a") as f:
        f.write('{"step": 1100, "spl')
    damaged = write_run(tmp_path, "standard", 1, [0.8] * 10)
    lines = (damaged / "metrics.jsonl").read_text().splitlines()
    (damaged / "metrics.jsonl").write_text("\n".join([lines[0][:-3], *lines[1:]]) + "\n")
    with pytest.warns(UserWarning, match="dropped a torn last line"):
        runs = {r.seed: r for r in read_runs([tmp_path])}
    assert runs[0].status == "completed" and len(runs[0].rows) == 13
    assert runs[1].status == "unreadable" and "metrics.jsonl:1 is damaged" in runs[1].error
    with pytest.warns(UserWarning):
        assert report.main([str(tmp_path), "--out", str(tmp_path / "out")]) == 0


def test_a_composition_is_told_apart_by_its_parts_options_not_by_its_target(tmp_path):
    """A composed run beside single-variant runs: its settings are its parts' options; the
    ``_target_`` and ``parts`` that differ from the others' are its name, already in its column."""
    from launch.analysis.records import options

    write_run(tmp_path, "standard", 0, [0.5], settings={"attn._target_": "src.attention.build"})
    composed = {"attn._target_": "src.attention.compose", "attn.parts": ["cond_init", "precond"]}
    composed |= {"attn.cond_init.value": "per_head", "attn.precond.gain": False}
    write_run(tmp_path, "cond_init+precond", 0, [0.6], settings=composed)
    runs = read_runs([tmp_path])
    shown = {r.attn: options(runs)[r.experiment] for r in runs}
    assert shown["cond_init+precond"] == {"attn.cond_init.value": "per_head", "attn.precond.gain": False}
    assert shown["standard"] == {"attn.cond_init.value": None, "attn.precond.gain": None}


# -- the plots say what they show ------------------------------------------------------------------


def test_every_plot_panel_is_titled_and_labelled_and_no_legend_covers_a_panel(runs_root):
    from launch.analysis.plots import figures

    runs = read_runs([runs_root])
    monitor = [
        {"step": s, "split": "monitor", "kappa/P/median": 10.0 + s, "entropy/P/median": 0.9} for s in STEPS
    ]
    runs[0].rows += monitor
    made = dict(figures(runs))
    kappa = made["kappa_imagenet_vit_base.png"]
    titles = [ax.get_title().replace("\n", " ") for ax in kappa.axes]
    assert titles[0].startswith("κ(W_Q): condition number")  # the panels in the monitor's order,
    assert titles[1].startswith("κ(P): condition number of the attention matrix")
    assert titles[2].startswith("entropy(P)")  # entropy beside κ(P), in its row
    assert kappa.axes[1].get_position().y0 == kappa.axes[2].get_position().y0
    for fig in made.values():
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        for ax in fig.axes:
            assert ax.get_title() and ax.get_ylabel() and ax.get_xlabel() == "optimizer step"
            assert ("log" in ax.get_ylabel()) == (ax.get_yscale() == "log")
            assert ax.get_legend() is None
        (legend,) = fig.legends
        box = legend.get_window_extent(renderer)
        assert not any(box.overlaps(ax.get_window_extent(renderer)) for ax in fig.axes)
    labels = [t.get_text() for t in made["curves_imagenet_vit_base.png"].legends[0].get_texts()]
    assert labels == ["cond_init (n=2)", "standard (n=3)"]  # the runs with a validation curve


def test_entropy_stays_in_the_row_of_kappa_p_whatever_panels_come_before():
    from launch.analysis.plots import COLUMNS, panel_slots

    for before in range(0, 6):
        keys = [f"kappa/k{i}/median" for i in range(before)] + ["kappa/P/median", "entropy/P/median"]
        slots = panel_slots(keys)
        assert slots[-2] // COLUMNS == slots[-1] // COLUMNS and slots[-1] == slots[-2] + 1
        assert slots[:before] == list(range(before))  # the others keep their places


def test_the_legend_of_every_reading_lies_whole_inside_the_saved_plot(tmp_path):
    """Finding 6: with a line per reading (all six variants and their readings, the longest real
    labels), the legend ends inside the figure and the saved PNG on both edges and at the bottom."""
    import io

    from matplotlib.image import imread

    from launch.analysis.plots import _png, figures

    readings = sorted((Path(__file__).parents[2] / "conf" / "reading").glob("*.yaml"))
    assert len(readings) >= 12
    for i, path in enumerate(readings):
        attn = OmegaConf.to_container(OmegaConf.load(path)).get("attn") or {}
        name = "+".join(attn["parts"]) if "parts" in attn else path.stem.split("_")[0]
        settings = {f"attn.{k}": v for k, v in attn.items()}
        curve = [0.5 + 0.01 * i * s / 1000 for s in STEPS]
        write_run(tmp_path, name, 0, curve, settings=settings, folder=tmp_path / path.stem / "seed=0")
    made = dict(figures(read_runs([tmp_path])))
    fig = made["curves_imagenet_vit_base.png"]
    fig.canvas.draw()
    (legend,) = fig.legends
    box = legend.get_window_extent(fig.canvas.get_renderer())
    assert len(legend.get_texts()) == len(readings)
    assert 0 <= box.x0 and box.x1 <= fig.bbox.width and 0 <= box.y0, (box, fig.bbox)
    assert not box.overlaps(fig.axes[0].get_window_extent())
    height, width = imread(io.BytesIO(_png(fig)), format="png").shape[:2]
    assert box.width < width and box.height < height


def test_a_seed_that_never_reaches_the_target_is_censored_not_dropped():
    """One seed of three arrives at step 300, two never do: the median over the arrivals would say
    300; the Kaplan–Meier median is not reached (two thirds never arrived)."""
    from test_claims import run

    base = [run("standard", s, 0.9, curve=[0.5, 0.7, 0.8, 0.9]) for s in range(3)]
    late = [run("cond_init", 0, 0.9, curve=[0.5, 0.7, 0.95, 0.95])]
    late += [run("cond_init", s, 0.8, curve=[0.5, 0.6, 0.7, 0.8]) for s in (1, 2)]
    conv = {c.attn: c for c in report.convergence(base + late)}
    assert conv["cond_init"].reached == 1 and conv["cond_init"].seeds == 3
    assert conv["cond_init"].steps is None


# -- every row's effect against the baseline: the forest plot and the paired differences -----------


@pytest.fixture
def paired_root(tmp_path) -> Path:
    """Three seeds of ``standard`` and ``cond_init``, two of ``precond``, each with the monitor's
    entropy from step 0 (as the trainer logs it before the first step)."""
    finals = {"standard": [0.80, 0.81, 0.82], "cond_init": [0.83, 0.835, 0.86], "precond": [0.79, 0.805]}
    for attn, values in finals.items():
        for seed, final in enumerate(values):
            folder = write_run(tmp_path, attn, seed, [final * s / 1000 for s in STEPS])
            rows = [
                {"step": s, "split": "monitor", "entropy/P/median": 0.9 - final * s / 10_000 + seed / 100}
                for s in (0, 500, 1000)
            ]
            with open(folder / "metrics.jsonl", "a") as f:
                f.write("".join(json.dumps(r) + "\n" for r in rows))
    return tmp_path


def test_the_forest_plot_draws_the_effects_and_intervals_of_the_table(paired_root):
    from launch.analysis.plots import comparison_figures, forest_rows

    assert report.main([str(paired_root), "--out", str(paired_root / "out"), "--margin", "0.02"]) == 0
    table = {
        r["attn"]: r
        for r in json.loads((paired_root / "out" / "results.json").read_text())
        if r["kind"] == "group" and r["effect"] is not None
    }
    runs = read_runs([paired_root])
    compared = report.comparisons(runs, {"*": 0.02})
    rows = forest_rows(compared)
    assert [v.variant for v in compared] == ["cond_init", "precond"] == sorted(table)
    for v, row in zip(compared, rows, strict=True):  # in points, as the tables print accuracy
        exported = table[v.variant]
        assert (row.effect, row.low, row.high, row.margin) == pytest.approx(
            (100 * exported["effect"], 100 * exported["ci_low"], 100 * exported["ci_high"], 2.0)
        )
    made = dict(comparison_figures(runs, compared))
    (ax,) = made["forest_imagenet.png"].axes
    (bars,) = ax.containers  # the dots and their interval bars, top row first
    assert list(bars.lines[0].get_xdata()) == pytest.approx([r.effect for r in rows])
    (segments,) = [c for c in ax.collections if len(c.get_segments()) == len(rows)]
    ends = [x for segment in segments.get_segments() for x in (segment[0][0], segment[1][0])]
    assert ends == pytest.approx([x for r in rows for x in (r.low, r.high)])
    zero = [line for line in ax.lines if list(line.get_xdata()) == [0, 0]]
    assert zero and zero[0].get_color() == "black"  # the baseline, as in every plot
    ticks = sorted(x for line in ax.lines if line.get_label() == "±δ" for x in line.get_xdata())
    assert ticks == pytest.approx([-2.0, 2.0])  # ±δ (a line per row: the first one is named)
    assert len([line for line in ax.lines if line.get_marker() == "|" and line.get_color() == "grey"]) == 2


def test_paired_differences_start_at_step_0_and_average_the_per_seed_differences(paired_root):
    from scipy import stats

    from launch.analysis.plots import comparison_figures, paired_differences
    from launch.analysis.verdicts import pairings

    runs = read_runs([paired_root])
    (pair,) = [p for p in pairings(None, runs) if p.members[0].attn == "cond_init"]
    base = {r.seed: r for r in pair.base}
    pairs = sorted(((r, base[r.seed]) for r in pair.members), key=lambda p: p[0].seed)
    found = paired_differences(pairs, "entropy/P/median", "monitor")
    assert found.steps == [0, 500, 1000] and found.n == 3
    for i, step in enumerate(found.steps):
        per_seed = [
            dict(zip(*mine.series("entropy/P/median", "monitor"), strict=True))[step]
            - dict(zip(*theirs.series("entropy/P/median", "monitor"), strict=True))[step]
            for mine, theirs in pairs
        ]
        assert found.mean[i] == pytest.approx(sum(per_seed) / 3)
        half = stats.t.ppf(0.975, 2) * stats.tstd(per_seed) / 3**0.5
        assert (found.low[i], found.high[i]) == pytest.approx((found.mean[i] - half, found.mean[i] + half))
    final = paired_differences(pairs, "val/acc")
    (row,) = [v for v in report.comparisons(runs) if v.variant == "cond_init"]
    assert final.steps[-1] == 1000 and final.mean[-1] == pytest.approx(row.effect)  # the table's effect
    fig = dict(comparison_figures(runs))["differences_imagenet_vit_base.png"]
    entropy = next(ax for ax in fig.axes if "entropy" in ax.get_title())
    drawn = {line.get_label(): line for line in entropy.lines}
    assert list(drawn["cond_init (n=3)"].get_xdata()) == [0, 500, 1000]
    assert drawn["standard (0)"].get_color() == "black"


def test_one_point_is_drawn_as_a_marker_and_the_baseline_in_its_colour_everywhere(tmp_path):
    from matplotlib.colors import to_rgba

    from launch.analysis.plots import figures

    for seed in (0, 1):
        write_run(tmp_path, "standard", seed, [0.8])  # one validation point each
        write_run(tmp_path, "cond_init", seed, [0.81 + seed / 100])
    made = dict(figures(read_runs([tmp_path]), baseline="cond_init"))
    (ax,) = made["curves_imagenet_vit_base.png"].axes
    lines = {line.get_label(): line for line in ax.lines}
    assert all(line.get_marker() == "o" for line in lines.values())  # one step: visible as a dot
    assert to_rgba(lines["cond_init (n=2)"].get_color()) == to_rgba("black")  # the baseline asked for
    assert to_rgba(lines["standard (n=2)"].get_color()) != to_rgba("black")


def test_baseline_and_margin_options_and_their_errors(paired_root, capsys):
    out = paired_root / "out"
    assert (
        report.main([str(paired_root), "--out", str(out), "--baseline", "cond_init", "--margin", "0.5"]) == 0
    )
    groups = {r["attn"]: r for r in json.loads((out / "results.json").read_text()) if r["kind"] == "group"}
    assert groups["cond_init"]["effect"] is None  # now the baseline
    assert groups["standard"]["effect"] == pytest.approx(0.81 - (0.83 + 0.835 + 0.86) / 3)
    assert (groups["standard"]["margin"], groups["standard"]["verdict"]) == (0.5, "worse")
    assert groups["precond"]["n_paired"] == 2
    capsys.readouterr()
    assert report.main([str(paired_root), "--baseline", "spectral"]) == 2
    assert one_error_line(capsys.readouterr().err).startswith("error: --baseline spectral: no run of it")
    assert report.main([str(paired_root), "--margin", "wide"]) == 2
    assert "--margin wide: give a number" in capsys.readouterr().err


def test_the_examples_option_counts_an_evaluation_set_in_every_interval_of_its_task(paired_root, capsys):
    """``--examples imagenet=360``: each effect keeps its mean, and its interval widens to the
    paired t's with the set's binomial variance added (:func:`launch.analysis.stats.example_variance`);
    a size that is not one is refused in one line."""
    from scipy.stats import t

    from launch.analysis import stats

    tables = {}
    for name, extra in (("seeds", []), ("counted", ["--examples", "imagenet=360"])):
        assert report.main([str(paired_root), "--out", str(paired_root / name), *extra]) == 0
        rows = json.loads((paired_root / name / "results.json").read_text())
        tables[name] = {r["attn"]: r for r in rows if r["kind"] == "group" and r["effect"] is not None}
    mine, theirs = [0.83, 0.835, 0.86], [0.80, 0.81, 0.82]
    diffs = [a - b for a, b in zip(mine, theirs, strict=True)]
    sd2 = sum((d - sum(diffs) / 3) ** 2 for d in diffs) / 2
    extra = stats.example_variance(sum(mine) / 3, sum(theirs) / 3, 360)
    half = t.ppf(0.975, 2) * (sd2 / 3 + extra) ** 0.5
    counted, seeds = tables["counted"]["cond_init"], tables["seeds"]["cond_init"]
    assert counted["effect"] == pytest.approx(seeds["effect"]) == pytest.approx(sum(diffs) / 3)
    mean = sum(diffs) / 3
    assert (counted["ci_low"], counted["ci_high"]) == pytest.approx((mean - half, mean + half))
    assert counted["ci_high"] - counted["ci_low"] > seeds["ci_high"] - seeds["ci_low"]
    capsys.readouterr()
    assert report.main([str(paired_root), "--examples", "imagenet=0"]) == 2
    assert one_error_line(capsys.readouterr().err).startswith("error: --examples imagenet=0: give TASK=N")


def test_the_command_prints_one_line_per_comparison_and_the_whole_report_on_request(paired_root, capsys):
    """stdout: each comparison's line (its effect and interval as results.csv holds them), not the
    whole report.md, which ``--print`` prints as written."""
    import csv

    out = paired_root / "out"
    assert report.main([str(paired_root), "--out", str(out)]) == 0
    printed = capsys.readouterr().out.splitlines()
    with open(out / "results.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["effect"]]
    assert len(printed) == len(rows) == 2  # cond_init and precond against standard
    for row in rows:
        (line,) = [p for p in printed if f" · {row['attn']} vs standard: " in p]
        assert f"{100 * float(row['effect']):+.2f}" in line.replace("−", "-")
        assert f"n={row['n_paired']}" in line
        assert line.endswith(row["verdict_holm"])
    assert report.main([str(paired_root), "--out", str(out), "--print"]) == 0
    assert capsys.readouterr().out == (out / "report.md").read_text() + "\n"
