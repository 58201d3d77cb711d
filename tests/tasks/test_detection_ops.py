"""mmcv's compiled ops as the detection tasks use them: ``roi_align`` and ``nms`` against values worked
out by hand and against torchvision (:func:`tasks.detection.ops.ops_check`), and the one-line refusal
of a run on a GPU whose mmcv has CPU ops only (exit status 2, before any training).

A GPU is simulated: ``torch.cuda.is_available`` and the mmcv probe are monkeypatched; the ``meta``
device stands for a device the ops were not compiled for (mmcv raises the same error for it as a
CPU-only build raises for ``cuda``).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("mmdet")
pytest.importorskip("mmcv.ops")

from conftest import QUIET, ROOT  # noqa: E402
from mmcv import ops as mmcv_ops  # noqa: E402
from smoke.detection import OVERRIDES  # noqa: E402
from torchvision import ops as tv_ops  # noqa: E402

from src.errors import ConfigError  # noqa: E402
from tasks.detection import ops  # noqa: E402


def test_roi_align_matches_a_hand_computed_ramp():
    """On f(y, x) = x, bilinear sampling is exact: with ``aligned`` the RoI (1, 1)-(5, 5) starts at
    x = 0.5; two bins of width 2, two samples each, at x = 1, 2 and 3, 4: bin means 1.5 and 3.5."""
    feats = torch.arange(8.0).repeat(1, 1, 8, 1)  # (1, 1, 8, 8), every row 0..7
    rois = torch.tensor([[0.0, 1.0, 1.0, 5.0, 5.0]])  # (1, 5): image 0, x1, y1, x2, y2
    expected = torch.tensor([[[[1.5, 3.5], [1.5, 3.5]]]])
    mine = mmcv_ops.roi_align(feats, rois, (2, 2), 1.0, 2, "avg", True)
    reference = tv_ops.roi_align(feats, rois, (2, 2), 1.0, 2, True)
    torch.testing.assert_close(mine, expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(reference, expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize(("threshold", "kept"), [(0.5, [0, 2]), (0.7, [0, 1, 2])])
def test_nms_keeps_what_a_hand_computed_iou_says(threshold, kept):
    """Boxes 0 and 1 overlap by 9 × 9 = 81 of 100 + 100 - 81 = 119: IoU 0.68; box 2 overlaps none."""
    boxes = torch.tensor([[0.0, 0, 10, 10], [1, 1, 11, 11], [20, 20, 30, 30]])
    scores = torch.tensor([0.9, 0.8, 0.7])
    dets, keep = mmcv_ops.nms(boxes, scores, threshold)
    assert keep.tolist() == kept == tv_ops.nms(boxes, scores, threshold).tolist()
    torch.testing.assert_close(dets[:, 4], scores[kept])


def test_the_check_agrees_with_torchvision_on_the_cpu():
    result = ops.ops_check("cpu")
    assert result["ok"] and result["error"] is None
    assert result["roi_align_max_err"] <= ops.TOLERANCE and result["roi_align_grad_max_err"] <= ops.TOLERANCE
    assert result["nms_agrees"] and 0 < result["nms_kept"] < 200  # the check's boxes do overlap


@pytest.mark.parametrize(
    ("op", "wrong", "named"),
    [
        ("roi_align", lambda out: out + 1e-3, "error: roi_align on cpu disagree"),
        ("roi_align", lambda out: out.detach() + 0 * out, "roi_align's gradient on cpu"),
        ("nms", lambda out: (out[0][:-1], out[1][:-1]), "nms on cpu disagree"),
    ],
    ids=["values", "gradient", "nms"],
)
def test_the_check_fails_an_op_that_is_off(op, wrong, named, monkeypatch):
    real = getattr(mmcv_ops, op)
    monkeypatch.setattr(mmcv_ops, op, lambda *a, **k: wrong(real(*a, **k)))
    result = ops.ops_check("cpu")
    assert not result["ok"] and named in f"error: {result['error']}"


def test_the_check_reports_an_op_compiled_for_no_such_device():
    result = ops.ops_check("meta")
    assert not result["ok"]
    assert (
        result["error"]
        == "RuntimeError on meta: roi_align_forward_impl: implementation for device meta not found."
    )


@pytest.fixture
def gpu_with(monkeypatch):
    """A machine where torch sees a GPU, its mmcv compiled with ``cuda`` (None: CPU ops only) and its
    op check answering ``check``."""

    def make(cuda: str | None, check: dict | None = None) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(ops, "mmcv_cuda_version", lambda: cuda)
        monkeypatch.setattr(ops, "ops_check", lambda device: {"device": device, **(check or {"ok": True})})

    return make


def test_a_gpu_with_cpu_only_mmcv_is_refused_in_one_line(gpu_with):
    gpu_with(None)
    with pytest.raises(ConfigError) as refused:
        ops.require_cuda_ops("coco")
    message = str(refused.value)
    assert "\n" not in message and message.startswith("task=coco on a GPU needs mmcv's CUDA ops")
    assert "CPU ops only" in message and "run `make detection` on this GPU machine" in message


def test_a_gpu_whose_cuda_ops_fail_is_refused_naming_the_error(gpu_with):
    gpu_with("12.8", {"ok": False, "error": "RuntimeError on cuda: no kernel image is available"})
    with pytest.raises(ConfigError, match=r"CUDA 12\.8\) fail on this GPU \(RuntimeError on cuda: no kernel"):
        ops.require_cuda_ops("coco_shapes")


def test_working_cuda_ops_or_no_gpu_pass(gpu_with, monkeypatch):
    gpu_with("12.8")
    ops.require_cuda_ops("coco")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(ops, "mmcv_cuda_version", lambda: pytest.fail("probed mmcv without a GPU"))
    ops.require_cuda_ops("coco")


#: ``python -m src.run`` in a process where torch sees a GPU and mmcv has CPU ops only, and where
#: building mmengine's Runner (the start of training) ends the process with status 3
SIMULATED_GPU = """
import runpy, sys, torch
torch.cuda.is_available = lambda: True
from tasks.detection import ops
ops.mmcv_cuda_version = lambda: None
from mmengine.runner import Runner
def started(*args, **kwargs):
    sys.exit(3)
Runner.from_cfg = started
sys.argv[0] = "src/run.py"
runpy.run_module("src.run", run_name="__main__")
"""


@pytest.mark.slow  # a fresh process importing torch, mmdet and Hydra: about 30 s on a loaded 2-core machine
def test_the_command_line_refuses_before_training_with_status_2(tmp_path):
    """``python -m src.run task=coco_shapes`` on a (simulated) GPU with a CPU-only mmcv: one line, exit
    status 2, and no Runner built. ``trainer.device=cpu`` keeps the run's processes off the absent
    GPU; the check asks torch, which says there is one."""
    args = ["task=coco_shapes", *OVERRIDES["coco_shapes"], "trainer.device=cpu", *QUIET]
    args += [f"paths.data_dir={tmp_path / 'data'}", f"paths.output_dir={tmp_path}"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WANDB_MODE": "disabled"}
    ran = subprocess.run(
        [sys.executable, "-c", SIMULATED_GPU, *args], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    err = ran.stderr.strip().splitlines()[-1] if ran.stderr.strip() else ""
    assert ran.returncode == 2, ran.stderr[-2000:]
    assert err.startswith("error: task=coco_shapes on a GPU needs mmcv's CUDA ops and the installed mmcv")
    assert "`make detection` on this GPU machine" in err
