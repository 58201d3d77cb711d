"""The GPU check (launch/tools/gpu_check.py) on a CPU: ``--dry`` runs every section at tiny shapes, the
suite's own loop included, and passes; a planted threshold fails it with exit status 1 and the
JSON naming it; its JSON is what ``launch.plan --measured`` reads; bad input is refused."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from launch import plan
from launch.tools import gpu_check
from src import attention

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def dry(tmp_path_factory):
    """One whole ``--dry`` run (about 30 s on 2 idle cores, most of it src.run's subprocess)."""
    out = tmp_path_factory.mktemp("gpu") / "gpu_check.json"
    assert gpu_check.main(["--dry", "--device", "cpu", "--out", str(out)]) == 0
    return json.loads(out.read_text())


def test_dry_passes_every_threshold_it_measures_and_skips_only_memory(dry):
    """Each threshold is checked at least once; none fails; the one skipped is a CPU's memory,
    with its reason; every section ran and was timed."""
    checks = dry["checks"]
    assert {c["name"] for c in checks} == set(gpu_check.THRESHOLDS) and dry["failed"] == []
    assert all(c["pass"] for c in checks if c["name"] != "memory")
    (memory,) = [c for c in checks if c["name"] == "memory"]
    assert memory["pass"] is None and "CPU" in memory["note"]
    assert set(dry["section_s"]) == set(gpu_check.SECTIONS) and dry["skipped"] == {}
    limits = {n: t.dry if t.dry is not None else t.limit for n, t in gpu_check.THRESHOLDS.items()}
    assert all(c["threshold"] == limits[c["name"]] for c in checks)


def test_every_variant_is_timed_against_standard(dry):
    names = [*attention.VARIANTS, "timm"]
    steps = [c for c in dry["checks"] if c["name"] == "variant_step"]
    assert sorted(c["subject"] for c in steps) == sorted(n for n in names if n != "standard")
    ratio = dry["variants"]["ratio_to_standard"]
    assert ratio["standard"] == 1.0 and all(c["value"] == ratio[c["subject"]] for c in steps)
    seconds = dry["variants"]["seconds_per_step_at_batch"]
    for key, rate in dry["samples_per_s"].items():  # images/s is the micro-batch over the step's seconds
        assert rate == pytest.approx(dry["variants"]["batch"] / seconds[key])


def test_the_loop_is_the_suites_own_on_jpegs(dry):
    """src.run task=imagenet trained on the JPEGs the check wrote, with one worker; its logged
    images/s against the bare step's is the checked ratio, and scales every variant's rate."""
    loop = dry["loop"]
    assert loop["command"].startswith("python -m src.run task=imagenet backbone=vit_micro attn=standard")
    assert loop["workers"] == 1 and len(loop["windows"]) == 3 and all(v > 0 for v in loop["windows"])
    (check,) = [c for c in dry["checks"] if c["name"] == "loop_vs_bare"]
    assert check["value"] == pytest.approx(loop["samples_per_s"] / loop["bare_samples_per_s"])
    for key, rate in dry["samples_per_s"].items():
        assert dry["loop_samples_per_s"][key] == pytest.approx(rate * loop["ratio"])


def test_attention_runs_fused_kernels_and_parity_degenerates_on_a_cpu(dry):
    """Every model's attention calls ran SDPA's fused (CPU flash) kernel; on a CPU fp32 against
    itself is exact and bf16 autocast differs by bf16's rounding, not more than 3e-2."""
    for name in ("vit", "gpt", "bert", "lra"):
        found = dry["attention"][name]
        assert (
            found["calls"] >= 2 and found["fused"] == found["calls"] and found["kernels"] == ["flash (CPU)"]
        )
    for name, row in dry["parity"]["relative"].items():
        assert row["fp32_loss"] == 0 and row["fp32_grad"] == 0, name
        assert 0 < max(row["bf16_loss"], row["bf16_grad"]) <= 3e-2, name
    assert dry["roi_align"]["max_abs_diff"] <= 1e-4 and dry["launch"]["seconds_per_op"] > 0


@pytest.mark.parametrize(
    ("section", "planted", "name"),
    [("variants", "variant_step=0.001", "variant_step"), ("parity", "bf16_parity=1e-9", "bf16_parity")],
)
def test_a_planted_threshold_fails_the_check(section, planted, name, tmp_path, capsys):
    """An impossible limit: exit status 1, the JSON names it (and only it) as failed, the table
    says FAIL on its rows; the other thresholds of the section still pass."""
    out = tmp_path / "x.json"
    assert gpu_check.main(["--dry", "--only", section, "--threshold", planted, "--out", str(out)]) == 1
    result = json.loads(out.read_text())
    assert result["failed"] == [name] and result["thresholds"][name]["limit"] == float(planted.split("=")[1])
    failing = [c for c in result["checks"] if c["pass"] is False]
    assert failing and {c["name"] for c in failing} == {name}
    printed = capsys.readouterr().out
    assert f"FAILED: {name}" in printed and re.search(rf"\| {name} \|.*\*\*FAIL\*\*", printed)


def test_the_default_json_goes_under_the_output_root_not_the_working_directory(tmp_path, monkeypatch):
    """Under ``./outputs`` as the runs' folders are, or under ``OUTPUT_DIR`` where it is set."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("OUTPUT_DIR", raising=False)
    assert gpu_check.main(["--dry", "--only", "roi_align"]) == 0
    monkeypatch.setenv("OUTPUT_DIR", str(tmp_path / "elsewhere"))
    assert gpu_check.main(["--dry", "--only", "roi_align"]) == 0
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*.json")) == [
        Path("elsewhere/gpu_check/gpu_check-dry.json"),
        Path("outputs/gpu_check/gpu_check-dry.json"),
    ]


def test_the_docs_list_the_thresholds_the_module_holds():
    """docs/benchmark.md's threshold table is THRESHOLDS: name, direction, limit, dry limit."""
    text = (ROOT / "docs/benchmark.md").read_text()
    rows = re.findall(r"^\| `(\w+)` \| (<=|>=) (\S+) \| (\S+) \|", text, flags=re.M)
    assert {name for name, *_ in rows} == set(gpu_check.THRESHOLDS)
    for name, op, limit, dry in rows:
        t = gpu_check.THRESHOLDS[name]
        assert (op, float(limit)) == (t.op, t.limit), name
        assert (dry == "same") == (t.dry is None) and (t.dry is None or float(dry) == t.dry), name


def test_plan_reads_the_loop_and_refuses_a_dry_file(dry, tmp_path, capsys):
    """The JSON's keys are the plan's (``vit_base/<variant>`` on a real check): the loop-level rate
    first; a --dry file (tiny shapes) is refused rather than priced."""
    real = {**dry, "dry": False}
    real["loop_samples_per_s"] = {
        k.replace("vit_micro", "vit_base"): v for k, v in dry["loop_samples_per_s"].items()
    }
    row = plan.Row("imagenet", "vit_base", "precond", 1, None, None, 1000, 1, None)
    seconds, source = plan.measured_step(real, row, 1024)
    assert source == "loop" and seconds == pytest.approx(
        1024 / real["loop_samples_per_s"]["vit_base/precond"]
    )
    assert plan.measured_launch(real) == dry["launch"]["seconds_per_op"]
    path = tmp_path / "dry.json"
    path.write_text(json.dumps(dry))
    assert plan.main(["experiment=paper/imagenet", "--measured", str(path)]) == 2
    assert "a --dry one times tiny shapes" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--device", "tpu", "--dry"], "--device tpu"),
        (["--device", "cpu"], "add --dry"),
        (["--dry", "--threshold", "speed=2"], "--threshold speed=2"),
        (["--dry", "--threshold", "memory=lots"], "is not a number"),
        (["--dry", "--only", "everything"], "--only everything"),
    ],
)
def test_bad_input_is_one_error_line_and_exit_2(argv, says, tmp_path, capsys):
    assert gpu_check.main([*argv, "--out", str(tmp_path / "x.json")]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: ") and says in line and not (tmp_path / "x.json").exists()


def test_each_section_says_when_it_starts(monkeypatch, capsys):
    """The check's minutes are not silent: a line per section on stderr, numbered, as it starts."""
    ran = []
    sections = {n: gpu_check.Section(lambda ctx, n=n: ran.append(n) or {}, 1, True) for n in ("a", "b")}
    monkeypatch.setattr(gpu_check, "SECTIONS", sections)
    limits = gpu_check.limits_from([], dry=True)
    gpu_check.run(True, "cpu", limits, only=["b"])
    gpu_check.run(True, "cpu", limits)
    err = capsys.readouterr().err.splitlines()
    assert ran == ["b", "a", "b"]
    assert [line.split(" (")[0] for line in err] == ["[1/1] b", "[1/2] a", "[2/2] b"]
