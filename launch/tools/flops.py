"""What one training step of a run computes, counted without data or weights: FLOPs and kernels.

The run's model is built on the meta device (the backbone's ``model`` node with what its task
adds from its data, and ``cfg.attn``'s variant applied where that works on meta); one sample's
forward and backward run under two counters:

- :class:`torch.utils.flop_counter.FlopCounterMode`: FLOPs of matmul-like operations (a
  multiply-add counts 2). A variant's decompositions (SVD, eigenvalues), the optimizer and the
  data pipeline are not in it.
- :class:`KernelCount`: the aten operations that run a kernel (every operation but views), the
  launches a GPU waits on when a step is too small to fill it (:mod:`launch.plan` prices each
  at a host cost per launch). **[reading]** One aten operation is one kernel launch; on meta,
  SDPA runs its math form (about 8 operations a layer where a GPU's fused kernel is 2), so a
  ViT's count is about 15% high.

A model that cannot run on meta (``torch.autocast`` knows no meta device: the Nyströmformer)
runs on fake CPU tensors, which hold no data either. Masked-LM pretraining decodes only its
masked positions, as the task does. Detection (mmdetection's Mask R-CNN + FPN) is built from
the run's own mmdet config (:func:`tasks.detection.config.detector`) on meta and counted in
its parts: backbone and FPN on one image, the RPN head on every level, the box head on the
sampler's RoIs and the mask head on its positives (:func:`detection_step`).
"""

from __future__ import annotations

import copy
import math
from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode

#: Vocabulary of a tokenizer named in a task config, where the task reads it from files.
TOKENIZER_VOCAB = {"gpt2": 50_257}
#: **[reading]** COCO's typical image, 640 × 480 (its most common size; train2017's median width
#: is 640), which the detection recipe resizes to its training scales.
COCO_IMAGE = (640, 480)


class KernelCount(TorchDispatchMode):
    """Counts the aten operations dispatched inside it that run a kernel (views excluded)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if not getattr(func, "is_view", False):
            self.ops += 1
        return func(*args, **(kwargs or {}))


def count_step(step: Any) -> tuple[int, int]:
    """``(FLOPs, kernel launches)`` of ``step()``, a callable running one forward and backward."""
    from torch.utils.flop_counter import FlopCounterMode

    # the kernel counter innermost: it sees the operations autograd dispatches, before the FLOP
    # counter decomposes those it has no formula for into many smaller ones
    with FlopCounterMode(display=False) as flops, KernelCount() as kernels:
        step()
    return int(flops.get_total_flops()), kernels.ops


def count_flops(model: Any, inputs: tuple, backward: bool = False) -> int:
    """FLOPs of ``model(*inputs)`` (and of the backward of its output's sum), a multiply-add as 2."""
    return count_step(lambda: forward_backward(model, inputs, backward))[0]


def forward_backward(model: Any, inputs: tuple, backward: bool = True) -> None:
    """``model(*inputs)``, then the backward of its (first) output's sum."""
    out = model(*inputs)
    if backward:
        out = out[0] if isinstance(out, tuple | list) else out
        out.float().sum().backward()


def forward_flops(model: Any, img_size: int = 224, in_chans: int = 3, inputs: tuple | None = None) -> int:
    """FLOPs of one sample's forward pass (a multiply-add counted as 2), counted on the meta device.

    ``model``: a timm model name (built on meta at ``img_size``, no weights) or a built model;
    ``inputs``: its positional inputs for one sample (default: one ``in_chans × img_size²`` image
    on the model's device)."""
    import torch

    if isinstance(model, str):
        import timm

        with torch.device("meta"):
            model = timm.create_model(model, pretrained=False, img_size=img_size, in_chans=in_chans)
    if inputs is None:
        device = next(model.parameters()).device
        inputs = (torch.zeros(1, in_chans, img_size, img_size, device=device),)
    with torch.no_grad():
        return count_flops(model, inputs)


def model_and_inputs(cfg: Any, device: str = "meta") -> tuple[Any, tuple, str]:
    """The run's model without weights (on ``device``: meta, or the CPU inside a
    :class:`FakeTensorMode <torch._subclasses.fake_tensor.FakeTensorMode>`), one sample's inputs,
    and a note on what was approximated. Detection: :func:`detection_model`."""
    import torch
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from src import attention

    cfg = copy.deepcopy(cfg)
    task, kind = cfg.task, str(cfg.backbone.get("kind"))
    if OmegaConf.to_container(cfg.backbone.model, resolve=False).get("pretrained") is not None:
        # weights change no FLOPs, and GLUE's ${pretrained_by:…} names a run folder only a run has
        OmegaConf.update(cfg, "backbone.model.pretrained", None)
    if kind == "detection":
        return detection_model(cfg, device)
    extra: dict[str, Any] = {}
    note = ""
    if kind == "image":
        x = (torch.zeros(1, task.get("in_chans", 3), task.img_size, task.img_size, device=device),)
    elif kind in ("causal_lm", "text"):
        tok = task.get("tokenizer")
        vocab = TOKENIZER_VOCAB.get(str(tok)) or task.get("vocab_size") or task.get("bpe_vocab_size")
        extra["vocab_size"] = int(vocab)
        if kind == "text" and task.name != "mlm":
            extra["num_labels"] = 1 if task.name == "glue_stsb" else 3 if task.name == "glue_mnli" else 2
        x = (torch.zeros(1, task.seq_len, dtype=torch.long, device=device),)
    elif kind == "sequence":
        built = instantiate(task, _convert_="all")
        extra = dict(
            vocab_size=built.vocab_size,
            num_classes=built.num_classes,
            max_positions=built.pad_length,
            dual=built.dual,
        )
        ids = torch.zeros(1, built.pad_length, dtype=torch.long, device=device)
        mask = torch.ones(1, built.pad_length, dtype=torch.bool, device=device)
        x = (ids, mask, ids, mask) if built.dual else (ids, mask)
    else:
        raise ValueError(f"no inputs known for a {kind} backbone")
    with torch.device(device):
        model = instantiate(cfg.backbone.model, _convert_="all", **extra)
    try:
        attention.apply(model, attention.variant_from_config(cfg.attn))
    except Exception as e:  # noqa: BLE001  a variant whose setup needs real weights
        note = f"{cfg.attn.variant} not applied ({type(e).__name__}): the backbone's FLOPs"
    if kind == "text" and task.get("mask_prob"):
        model = MaskedLM(model, float(task.mask_prob))
    return model, x, note


class MaskedLM:
    """Masked-LM pretraining's model as tasks/mlm/task.py calls it: the encoder on every position,
    the tied decoder only on the masked ones (``mask_prob`` of them: the mean; **[reading]**)."""

    def __init__(self, model: Any, mask_prob: float) -> None:
        self.model, self.mask_prob = model, mask_prob

    def __call__(self, ids: Any) -> Any:
        hidden = self.model.encode(ids)  # (B, N, D)
        masked = max(1, round(self.mask_prob * ids.shape[1]))
        return self.model.mlm_logits(hidden[:, :masked])  # (B, M, V)

    def parameters(self) -> Any:
        return self.model.parameters()

    def train(self) -> None:
        self.model.train()


# -- detection ------------------------------------------------------------------------------------


def detection_input(task: Any) -> tuple[int, int]:
    """``(H, W)`` of a typical training image, padded to 32: :data:`COCO_IMAGE` resized as the
    recipe's ``augment`` does at its mean scale (**[reading]**): ``single`` to the shorter side
    ``img_scale[1]``, the multi-scale recipes (``ms``, ``ms_crop``: shorter side 480-800 in steps
    of 32) to their mean, 640; the longer side at most ``img_scale[0]``."""
    from tasks.detection.config import MS_SCALES

    longer_max, shorter = (int(v) for v in task.img_scale)
    if str(task.get("augment", "single")) != "single":
        shorter = round(sum(s for _, s in MS_SCALES) / len(MS_SCALES))
    width, height = COCO_IMAGE
    scale = min(shorter / min(width, height), longer_max / max(width, height))
    return tuple(32 * math.ceil(v * scale / 32) for v in (height, width))


def detection_model(cfg: Any, device: str = "meta") -> tuple[Any, tuple, str]:
    """The run's Mask R-CNN (mmdet's, from the run's own mmdet config) without weights on
    ``device``, as a :class:`DetectionStep` taking one image, and a note."""
    import torch
    from mmdet.registry import MODELS
    from mmdet.utils import register_all_modules
    from mmengine.config import ConfigDict
    from mmengine.registry import DefaultScope

    from src.models.detection import out_channels
    from tasks.detection.config import backbone_dict, base_config, detector

    register_all_modules(init_default_scope=False)  # the modules mmdet's config names

    backbone = backbone_dict(cfg)
    classes = cfg.task.get("classes")  # null: COCO's 80; from_file: unknown without the data, 80
    num_classes = 80 if classes is None or isinstance(classes, str) else len(classes)
    spec = detector(base_config().model, backbone, out_channels(backbone), num_classes, cfg.task.detector)
    note = ""
    with DefaultScope.overwrite_default_scope("mmdet"), torch.device(device):
        try:
            model = MODELS.build(ConfigDict(spec))
        except Exception as e:  # noqa: BLE001  a variant whose setup needs real weights
            note = f"{cfg.attn.variant} not applied ({type(e).__name__}): the backbone's FLOPs"
            spec["backbone"] = {**backbone, "attn": None}
            model = MODELS.build(ConfigDict(spec))
    x = torch.zeros(1, 3, *detection_input(cfg.task), device=device)  # (1, 3, H, W)
    return DetectionStep(model, spec), (x,), note


class DetectionStep:
    """Mask R-CNN's training computation on one image, in the parts mmdet runs: backbone + FPN,
    the RPN head on every level, the box head on the sampler's ``num`` RoIs (7 × 7 features) and
    the mask head on its positives, ``pos_fraction × num`` (14 × 14): **[reading]** the sampler's
    cap (mmdet's RandomSampler keeps fewer where an image has fewer positive proposals). RoIAlign,
    anchor assignment, NMS and the losses are not matmuls and not counted."""

    def __init__(self, model: Any, spec: dict) -> None:
        self.model, self.spec = model, spec

    def __call__(self, x: Any) -> Any:
        import torch

        roi, sampler = self.spec["roi_head"], self.spec["train_cfg"]["rcnn"]["sampler"]
        width = roi["bbox_head"]["in_channels"]
        box_side = roi["bbox_roi_extractor"]["roi_layer"]["output_size"]
        mask_side = roi["mask_roi_extractor"]["roi_layer"]["output_size"]
        rois = int(sampler["num"]) * x.shape[0]
        positives = round(float(sampler["pos_fraction"]) * rois)
        feats = self.model.extract_feat(x)  # 5 levels of (1, C, H/s, W/s)
        scores, deltas = self.model.rpn_head(feats)
        # the RoI features RoIAlign would gather from the FPN levels (the gradient flows back to them)
        box_in = torch.zeros(rois, width, box_side, box_side, device=x.device, requires_grad=True)
        mask_in = torch.zeros(positives, width, mask_side, mask_side, device=x.device, requires_grad=True)
        classes, boxes = self.model.roi_head.bbox_head(box_in)  # (R, K + 1), (R, 4K)
        masks = self.model.roi_head.mask_head(mask_in)  # (P, K, 28, 28)
        outs = [*scores, *deltas, classes, boxes, masks]
        return sum(o.float().sum() for o in outs)

    def parameters(self) -> Any:
        return self.model.parameters()

    def train(self) -> None:
        self.model.train()


def step_cost(cfg: Any) -> tuple[int | None, float | None, int | None, str]:
    """``(parameters, FLOPs of one sample's forward + backward, its kernel launches, note)`` of
    the run of ``cfg``: on the meta device, or where a model cannot run there (``torch.autocast``
    knows no meta device: the Nyströmformer), on fake CPU tensors, which hold no data either."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    def counted(device: str) -> tuple[int, int, int, str]:
        model, x, note = model_and_inputs(cfg, device=device)
        model.train()
        flops, kernels = count_step(lambda: forward_backward(model, x))
        return sum(p.numel() for p in model.parameters()), flops, kernels, note

    try:
        try:
            params, flops, kernels, note = counted("meta")
        except RuntimeError:
            with FakeTensorMode(allow_non_fake_inputs=True):
                params, flops, kernels, note = counted("cpu")
    except Exception as e:  # noqa: BLE001  said in the table, not fatal to the plan
        return None, None, None, f"not counted: {str(e).splitlines()[0][:80]}"
    return params, float(flops), kernels, note
