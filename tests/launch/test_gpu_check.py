"""The GPU check (launch/gpu_check.py) on a CPU: ``--dry`` runs every section at tiny shapes and
writes the JSON ``launch.plan --measured`` reads; what cannot be right is refused."""

from __future__ import annotations

import json

import pytest

from launch import gpu_check, plan
from src import attention


@pytest.fixture(scope="module")
def dry(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu") / "gpu_check.json"
    assert gpu_check.main(["--dry", "--device", "cpu", "--out", str(out)]) == 0
    return json.loads(out.read_text())


def test_every_variant_and_timms_own_model_train_and_are_timed_against_standard(dry):
    names = ["timm_own", *attention.VARIANTS]
    speed = dry["samples_per_s"]
    assert sorted(speed) == sorted(f"vit_base/{n}" for n in names) and all(v > 0 for v in speed.values())
    ratio = dry["throughput"]["ratio_to_standard"]
    assert ratio["standard"] == 1.0 and set(ratio) == {"timm", *attention.VARIANTS}
    seconds = dry["throughput"]["seconds_per_step_at_batch"]
    for name, value in speed.items():  # samples per second is the batch over the step's seconds
        assert value == pytest.approx(dry["batch"] / seconds[name])
    assert dry["dry"] and dry["device"] == "cpu" and dry["wall_s"] >= sum(dry["section_s"].values()) - 0.1


def test_each_variant_compiles_in_counted_graphs_and_ddp_sees_a_world_of_one(dry):
    for name in attention.VARIANTS:
        found = dry["compile"][name]
        assert found["graphs"] >= 1 and found["graph_breaks"] >= 0
        assert found["graph_breaks"] == 0 or found["reasons"]  # a break comes with its reason
    assert dry["ddp"] == {"backend": "gloo", "world_size": 1, "gradient_as_without_ddp": True}
    assert dry["costs"]["cond_tokens_svd_ms"] > 0 and dry["costs"]["kappa_monitor_ms"] > 0


def test_plan_reads_a_real_check_and_refuses_a_dry_one(dry, tmp_path, capsys):
    """The JSON's keys are the plan's: ``vit_base/<variant>`` at the check's batch; a --dry file
    (tiny shapes) is refused rather than priced."""
    real = {**dry, "dry": False}
    row = plan.Row("imagenet", "vit_base", "precond", 1, None, None, 1000, 1, None)
    assert plan.measured_step(real, row, 1024) == pytest.approx(
        1024 / real["samples_per_s"]["vit_base/precond"]
    )
    path = tmp_path / "dry.json"
    path.write_text(json.dumps(dry))
    assert plan.main(["experiment=paper/imagenet", "--measured", str(path)]) == 2
    assert "a --dry one times tiny shapes" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "says"),
    [(["--device", "tpu", "--dry"], "--device tpu"), (["--device", "cpu"], "add --dry")],
)
def test_bad_input_is_one_error_line_and_exit_2(argv, says, tmp_path, capsys):
    assert gpu_check.main([*argv, "--out", str(tmp_path / "x.json")]) == 2
    assert says in capsys.readouterr().out and not (tmp_path / "x.json").exists()
