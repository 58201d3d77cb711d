"""mmdet's Mask R-CNN with its backbone and FPN under bf16 autocast, its heads in fp32.

:class:`SuiteMaskRCNN` is what ``trainer.precision=bf16`` selects for the detection tasks
(``tasks/detection/config.py``); fp32 runs keep mmdet's own ``MaskRCNN``. Only the feature
extractor, the backbone and the neck (most of the compute), runs in bf16; its maps come back
as fp32, so the RPN and RoI heads, their box arithmetic, RoIAlign and NMS run in fp32 as in an
fp32 run. **[reading]** a judgement, not the recipe's source's: XCiT's COCO recipe trains
Mask R-CNN in mixed precision with apex (fp16, with loss scaling, the whole model); the suite's
bf16 needs no loss scaling, and in bf16 the heads would fail or lose precision here: mmcv
2.1.0's RoIAlign and NMS have no bf16 kernels (CPU and CUDA: ``"ROIAlign_forward" not
implemented for 'BFloat16'``; NMS: ``expected scalar type Float``), and mmdet makes its anchors
in the heads' dtype, where bf16's 8 significant bits space coordinates 4–8 px apart at
512–1333 px. Validation runs the same way (as the shared loop validates under the run's
autocast). No loss scaler, no mmengine ``AmpOptimWrapper`` (it asserts a GPU in mmengine 0.10.7
and scales for fp16): bf16 autocast runs on the CPU and the GPU alike.
"""

from __future__ import annotations

import torch
from mmdet.models.detectors import MaskRCNN
from mmdet.registry import MODELS
from torch import Tensor

from src.errors import ConfigError

PRECISIONS = ("fp32", "bf16")


@MODELS.register_module()
class SuiteMaskRCNN(MaskRCNN):
    """``MaskRCNN`` whose :meth:`extract_feat` runs under autocast at ``precision`` (see the module)."""

    def __init__(self, *args, precision: str = "bf16", **kwargs) -> None:
        if precision not in PRECISIONS:
            raise ConfigError(f"SuiteMaskRCNN: precision={precision!r} is not one of {', '.join(PRECISIONS)}")
        super().__init__(*args, **kwargs)
        self.precision = precision

    def extract_feat(self, batch_inputs: Tensor) -> tuple[Tensor, ...]:
        """The FPN's maps, each (B, C, H / stride, W / stride), fp32 whatever ran inside."""
        device = batch_inputs.device.type  # meta (shapes only, the sweep tests) has no autocast
        enabled = self.precision == "bf16" and torch.amp.is_autocast_available(device)
        with torch.autocast(device if enabled else "cpu", dtype=torch.bfloat16, enabled=enabled):
            feats = super().extract_feat(batch_inputs)  # (B, 3, H, W) -> one map per FPN level
        return tuple(f.float() for f in feats)
