"""Whether mmcv's compiled ops run on a device: ``roi_align`` and ``nms`` checked against torchvision.

Mask R-CNN needs two of mmcv's compiled ops, RoIAlign and NMS. An mmcv built without CUDA
(``FORCE_CUDA=0``, or on a machine without nvcc) imports and runs on the CPU, then fails at the
first RoIAlign on a GPU; one built for other GPU architectures fails there too ("no kernel image
is available"). :func:`ops_check` runs both ops (RoIAlign forward and backward) on a device and
compares them with torchvision's implementations on the CPU, an independent reference;
:func:`require_cuda_ops` refuses a detection run on a GPU whose mmcv cannot serve it, in one line
that names the fix. ``python -m launch.tools.mmcv_build --check`` and the GPU check call the same
function.

torch, torchvision and mmcv are imported inside the functions: this module loads without them.
"""

from __future__ import annotations

from typing import Any

from src.errors import ConfigError

#: RoIAlign's output size, sampling points per bin and scale in the check (mmdet's box head: 7, 0, 1/4)
OUTPUT_SIZE, SAMPLING_RATIO, SPATIAL_SCALE = (7, 7), 2, 0.25
IOU_THRESHOLD = 0.5
#: fp32 agreement: both sides sum a few bilinear samples of values of order 1 (measured ~1e-7 on CPU)
TOLERANCE = 1e-4
#: what the refusal tells a user to run, on the machine with the GPU
FIX = "`make detection` on this GPU machine"


def mmcv_cuda_version() -> str | None:
    """The CUDA version mmcv's ops were compiled with, or None for a build with CPU ops only."""
    from mmcv.ops import get_compiling_cuda_version

    version = get_compiling_cuda_version()
    return None if version in ("", "not available") else str(version)


def check_inputs(seed: int = 0) -> dict[str, Any]:
    """Random features, RoIs on them (some past their edge, as proposals near a padded border are), and
    boxes that overlap often enough for NMS to drop some (no IoU within 3e-3 of the threshold at seed 0,
    so float rounding on another device cannot flip a decision)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    feats = torch.randn(2, 8, 24, 32, generator=g)  # (N, C, H, W): a stride-4 level of a 96×128 image
    corner = torch.rand(32, 2, generator=g) * torch.tensor([100.0, 70.0])  # image pixels (x, y)
    size = torch.rand(32, 2, generator=g) * 40 + 2
    batch = torch.randint(0, 2, (32, 1), generator=g).float()
    rois = torch.cat([batch, corner, corner + size], dim=1)  # (K, 5): image index, x1, y1, x2, y2
    centre = torch.rand(200, 2, generator=g) * 60
    half = torch.rand(200, 2, generator=g) * 10 + 1
    boxes = torch.cat([centre - half, centre + half], dim=1)  # (M, 4), many overlapping
    scores = torch.rand(200, generator=g)  # (M,): distinct with probability 1
    weights = torch.randn(32, 8, *OUTPUT_SIZE, generator=g)  # (K, C, 7, 7): a loss to differentiate
    return {"feats": feats, "rois": rois, "boxes": boxes, "scores": scores, "weights": weights}


def ops_check(device: str, seed: int = 0) -> dict[str, Any]:
    """Run mmcv's ``roi_align`` (forward and backward) and ``nms`` on ``device`` and compare them
    with torchvision's on the CPU. ``ok`` is False when an op raises (a CUDA op that was not
    compiled, a missing architecture) or disagrees beyond :data:`TOLERANCE`; ``error`` says which.

    Returns ``{"device", "ok", "error", "roi_align_max_err", "roi_align_grad_max_err",
    "nms_kept", "nms_agrees"}`` (the errors are absolute, in the features' units).
    """
    import torch
    import torchvision

    x = check_inputs(seed)
    result: dict[str, Any] = {"device": device, "ok": False, "error": None}
    feats = x["feats"].clone().requires_grad_(True)
    ref = torchvision.ops.roi_align(feats, x["rois"], OUTPUT_SIZE, SPATIAL_SCALE, SAMPLING_RATIO, True)
    (ref * x["weights"]).sum().backward()
    ref_keep = torchvision.ops.nms(x["boxes"], x["scores"], IOU_THRESHOLD)
    try:
        from mmcv import ops

        on = {k: v.to(device) for k, v in x.items()}
        feats_on = on["feats"].clone().requires_grad_(True)
        out = ops.roi_align(feats_on, on["rois"], OUTPUT_SIZE, SPATIAL_SCALE, SAMPLING_RATIO, "avg", True)
        (out * on["weights"]).sum().backward()
        _, keep = ops.nms(on["boxes"], on["scores"], IOU_THRESHOLD)
        out, grad, keep = out.detach().cpu(), feats_on.grad.cpu(), keep.cpu()
    except Exception as error:  # noqa: BLE001  an op compiled for no such device raises RuntimeError
        first = (str(error).strip().splitlines() or [""])[0]
        result["error"] = f"{type(error).__name__} on {device}: {first}"
        return result
    result.update(
        roi_align_max_err=float((out - ref.detach()).abs().max()),
        roi_align_grad_max_err=float((grad - feats.grad).abs().max()),
        nms_kept=int(keep.numel()),
        nms_agrees=bool(torch.equal(keep.long(), ref_keep.long())),
    )
    wrong = [
        name
        for name, bad in (
            ("roi_align", result["roi_align_max_err"] > TOLERANCE),
            ("roi_align's gradient", result["roi_align_grad_max_err"] > TOLERANCE),
            ("nms", not result["nms_agrees"]),
        )
        if bad
    ]
    if wrong:
        result["error"] = f"{' and '.join(wrong)} on {device} disagree with torchvision's"
    result["ok"] = not wrong
    return result


def require_cuda_ops(task: str) -> None:
    """On a machine where torch sees a GPU (the run trains there), refuse in one line when mmcv's ops
    cannot run on it: an mmcv with CPU ops only, or CUDA ops that fail :func:`ops_check`."""
    import torch

    if not torch.cuda.is_available():
        return
    version = mmcv_cuda_version()
    if version is None:
        reason = "the installed mmcv 2.1.0 has CPU ops only (it would fail at the first RoIAlign)"
    else:
        check = ops_check("cuda")
        if check["ok"]:
            return
        reason = f"the installed mmcv's CUDA ops (CUDA {version}) fail on this GPU ({check['error']})"
    raise ConfigError(
        f"task={task} on a GPU needs mmcv's CUDA ops and {reason}: run {FIX} (it builds the ops for its "
        "GPUs with nvcc, or reuses a fitting build from its cache), or hide the GPU with "
        "CUDA_VISIBLE_DEVICES= to train on the CPU"
    )
