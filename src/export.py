"""Export a run's trained model as a timm model folder: ``python -m src.export RUN [--out DIR]
[--checkpoint best|last] [--ema]``.

The folder (default ``RUN/export/``) holds ``model.safetensors`` and timm's ``config.json``, written
by timm's own :func:`timm.models.save_for_hf` (``architecture``, ``num_classes``, ``num_features``,
``model_args``, ``pretrained_cfg``), plus the suite's key ``conditioned_attention``: the run's
``attn`` config (what :func:`src.attention.variant_from_config` takes), ``plain`` and where it came
from. ``timm.create_model("local-dir:DIR", pretrained=True)`` builds it.

* ``plain: true``: the variant changed only the weights (``standard``, ``cond_init``, ``mimetic``;
  ``spectral`` with ``mode=identity``, whose fixed ``W + lam·I`` is folded into the weight, and any
  composition of these): the folder is a plain timm model, its keys timm's own, and loading it
  needs nothing of the suite.
* ``plain: false``: the variant acts in the forward (``precond``'s head scaling, ``cond_tokens``'
  token correction, ``spectral``'s ``mode=svd`` recomputed from the weights): the weights are the
  suite model's state dict, and one ``attention.apply`` between building and loading restores it
  (:func:`load`; docs/evaluation.md#export-a-trained-model shows the three lines).

Which it is is read off the model, not a list of names: after folding fixed corrections, the model
is plain when no parametrization or hook is left and its modules and keys are a fresh timm model's.
Before anything is written, the folder is loaded back as a user would and its logits compared with
the run's model on a seeded batch; a difference beyond fp32's rounding writes nothing.

Exported: image classification runs of the shared loop whose backbone is a timm model (``_target_:
timm.create_model``, or timm's ``VisionTransformer`` as ``vit_digits`` builds it). The suite's own
models (LRA encoders, GPT, crammed BERT, the sandbox) and detection backbones are refused in one
line (exit 2): timm cannot build them, and their checkpoint is the run's ``checkpoints/*.pt``.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import logging
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from src.command import command_parser, run_command
from src.errors import ConfigError, SuiteError

if TYPE_CHECKING:  # torch, timm and the suite's model code load when a function runs: --help is quick
    import torch
    from omegaconf import DictConfig
    from torch import nn

#: The files of an export; a folder holding others is not replaced.
FILES = ("config.json", "model.safetensors")
#: The suite's key in ``config.json``.
KEY = "conditioned_attention"
#: timm classes a backbone may instantiate directly, and the registered name that builds each from
#: ``model_args``, with the constructor arguments that name sets (taken from the class's defaults
#: where the backbone leaves them out, so that ``model_args`` determine the model whole).
CLASSES = {
    "timm.models.vision_transformer.VisionTransformer": (
        "vit_tiny_patch16_224",
        ("patch_size", "embed_dim", "depth", "num_heads"),
    ),
}
#: The target of ``backbone=timm`` (:mod:`src.models.timm_named`): its ``name`` is timm's.
NAMED = "src.models.timm_named.create"
#: Keys of a ``timm.create_model`` backbone that are not the architecture's arguments.
NOT_ARGS = {"_target_", "_convert_", "model_name", "pretrained", "pretrained_cfg", "pretrained_cfg_overlay"}
#: How far the exported model's logits may be from the run's (fp32, one batch).
ATOL, RTOL = 1e-5, 1e-5


class ExportError(SuiteError):
    """A run that cannot be exported as a timm model, with what to do instead."""


def architecture(cfg: DictConfig) -> tuple[str, dict[str, Any]]:
    """``(timm name, model_args)`` that build the run's backbone with ``timm.create_model``; an
    :class:`ExportError` for a backbone timm cannot build."""
    import timm
    from omegaconf import DictConfig, OmegaConf

    backbone = cfg.backbone
    model = backbone.get("model")
    target = model.get("_target_") if isinstance(model, DictConfig) else None
    name = backbone.get("name", "?")
    if backbone.get("kind") == "detection":
        raise ExportError(
            f"backbone {name} is a detection backbone (mmdet's, trained in mmengine): python -m src.export "
            "writes timm classifiers; the run's weights are in its checkpoints"
        )
    if target == "timm.create_model":
        args = {k: v for k, v in OmegaConf.to_container(model, resolve=True).items() if k not in NOT_ARGS}
        return str(model.model_name), args
    if target == NAMED:  # backbone=timm backbone.name=…: img_size only where the model takes one
        args = {k: v for k, v in OmegaConf.to_container(model, resolve=True).items() if k not in NOT_ARGS}
        arch = str(args.pop("name"))
        if args.get("img_size") is not None and not takes_img_size(arch, args):
            del args["img_size"]
        return arch, {k: v for k, v in args.items() if v is not None}
    if target in CLASSES:
        arch, implied = CLASSES[target]
        args = {k: v for k, v in OmegaConf.to_container(model, resolve=True).items() if k not in NOT_ARGS}
        defaults = inspect.signature(timm.models.vision_transformer.VisionTransformer).parameters
        return arch, {**{k: defaults[k].default for k in implied if k not in args}, **args}
    kind = "timm class" if str(target).startswith("timm.") else "the suite's own model"
    raise ExportError(
        f"backbone {name} builds {target} ({kind}), which timm.create_model cannot build: python -m "
        "src.export exports timm backbones (_target_: timm.create_model, backbone=timm, or timm's "
        "VisionTransformer as vit_digits builds it); the run's weights are in its checkpoints/*.pt"
    )


def takes_img_size(arch: str, args: dict[str, Any]) -> bool:
    """Whether ``timm.create_model(arch, **args)`` accepts ``img_size`` (built on the meta device:
    no weights), as :func:`src.models.timm_named.create` decided when the run was built."""
    import timm
    import torch

    try:
        with torch.device("meta"):
            timm.create_model(arch, pretrained=False, **args)
    except TypeError as e:
        if "img_size" in str(e):
            return False
        raise
    return True


def fixed(module: nn.Module, name: str) -> bool:
    """Whether ``module``'s parametrized ``name`` is a fixed correction (``spectral``'s
    ``mode=identity``, ``W + C`` with ``C`` a constant), which folds into the weight."""
    from src.attention.spectral import AddFixedCorrection

    return all(isinstance(p, AddFixedCorrection) for p in module.parametrizations[name])


def folded_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """``model``'s state dict with every fixed correction folded: ``<m>.parametrizations.weight.original``
    replaced by ``<m>.weight`` holding ``W + C``, timm's key. ``model`` is left as it is (removing a
    parametrization would change the class it shares with its copies)."""
    from torch.nn.utils import parametrize

    state = model.state_dict()
    for name, module in model.named_modules():
        if parametrize.is_parametrized(module):
            prefix = f"{name}." if name else ""
            for tensor in [t for t in module.parametrizations if fixed(module, t)]:
                del state[f"{prefix}parametrizations.{tensor}.original"]
                state[f"{prefix}{tensor}"] = getattr(module, tensor).detach().clone()
    return state


def is_plain(model: nn.Module, fresh: nn.Module) -> bool:
    """Whether ``model``, its fixed corrections folded, computes as timm's ``fresh`` does with the
    same weights: the same modules of the same classes, the same keys, no hook, and no other
    parametrization."""
    from torch.nn.utils import parametrize

    def modules(net: nn.Module) -> list[tuple[str, type]]:
        found = []
        for name, module in net.named_modules():
            if "parametrizations" in name.split("."):
                continue
            if parametrize.is_parametrized(module):
                if not all(fixed(module, t) for t in module.parametrizations):
                    return []
                found.append((name, type(module).__bases__[0]))  # ParametrizedLinear -> Linear
            else:
                found.append((name, type(module)))
        return found

    if any(m._forward_hooks or m._forward_pre_hooks for m in model.modules()):
        return False
    ours = modules(model)
    return bool(ours) and ours == modules(fresh) and set(folded_state(model)) == set(fresh.state_dict())


def load(folder: str | Path) -> nn.Module:
    """The model an export holds, in eval mode: ``timm.create_model("local-dir:FOLDER", pretrained=True)``
    for a plain one; for another, built without weights, its variant applied
    (``attention.apply(model, attention.variant_from_config(config["conditioned_attention"]["attn"]))``),
    then its weights loaded."""
    import timm
    from safetensors.torch import load_file

    from src import attention

    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text())
    if config[KEY]["plain"]:
        return timm.create_model(f"local-dir:{folder}", pretrained=True).eval()
    model = timm.create_model(f"local-dir:{folder}", pretrained=False)
    attention.apply(model, attention.variant_from_config(config[KEY]["attn"]))
    model.load_state_dict(load_file(folder / "model.safetensors"))
    return model.eval()


def source_model(run_dir: Path, which: str, ema: bool) -> tuple[DictConfig, nn.Module, dict[str, Any]]:
    """The run's checked config, its model with the checkpoint's weights (the EMA's with ``ema``), in
    eval mode, and where they came from."""
    from src.engine import run_eval as evaluating  # the run folder's checks (config, identity, owner)
    from src.engine.loop import evaluation
    from src.engine.loop.model import build_model
    from src.engine.loop.prepared import seeded_task

    recorded = evaluating.load_config(run_dir, [])
    cfg = recorded.cfg
    evaluating.refuse_other_loops(cfg)
    architecture(cfg)  # refused before the checkpoint is read
    opened = evaluation.open_checkpoint(
        run_dir,
        which,
        note=evaluating.print_note,
        best_step=evaluating.recorded_best_step(run_dir),
        identity=recorded.owners,
    )
    model = build_model(cfg, seeded_task(cfg))
    averaged = evaluation.load_weights(model, opened)
    if ema:
        if averaged is None:
            raise ExportError(f"{opened.path} holds no EMA weights (trainer.ema was off): drop --ema")
        model = averaged
    origin = {
        "run": str(run_dir.resolve()),
        "checkpoint": opened.path.name,
        "step": opened.step,
        "weights": "ema" if ema else "model",
        "identity": recorded.record_identity,
        "task": cfg.task.get("name"),
    }
    return cfg, model.eval(), origin


def exported_model(cfg: DictConfig, model: nn.Module) -> tuple[nn.Module, bool]:
    """The timm model to save for the run's ``model``: folded and plain where it can be, else a fresh
    timm model with the run's variant applied, holding the run's weights; and whether it is plain."""
    import timm

    from src import attention

    arch, args = architecture(cfg)
    fresh = timm.create_model(arch, pretrained=False, **args)
    if is_plain(model, fresh):
        fresh.load_state_dict(folded_state(model))
        return fresh.eval(), True
    attention.apply(fresh, attention.variant_from_config(cfg.attn))
    fresh.load_state_dict(model.state_dict())
    return fresh.eval(), False


def sample_batch(model: nn.Module, seed: int = 0) -> torch.Tensor:
    """A seeded batch ``(2, C, H, W)`` of the model's input size."""
    import timm.data
    import torch

    c, h, w = timm.data.resolve_data_config({}, model=model)["input_size"]
    return torch.randn(2, c, h, w, generator=torch.Generator().manual_seed(seed))


def check_round_trip(model: nn.Module, folder: Path) -> float:
    """The largest logit difference between ``model`` and the export in ``folder`` loaded back by
    :func:`load`, on a batch of the export's input size; an :class:`ExportError` beyond fp32's rounding."""
    import torch

    loaded = load(folder)
    batch = sample_batch(loaded)
    with torch.no_grad():
        expected, got = model(batch), loaded(batch)
    if expected.shape != got.shape or not torch.allclose(got, expected, atol=ATOL, rtol=RTOL):
        diff = (got - expected).abs().max().item() if expected.shape == got.shape else float("inf")
        raise ExportError(
            f"the exported model's logits differ from the run's by {diff:.3g} (tolerance {ATOL:g}): "
            "not written; please report it with the run's config.yaml"
        )
    return (got - expected).abs().max().item()


def export(run_dir: Path, out: Path | None = None, which: str = "best", ema: bool = False) -> Path:
    """Export the run's ``which`` checkpoint to ``out`` (default ``run_dir/export``); the folder."""
    import timm

    from src import attention
    from src.attention.config import as_dict

    out = Path(out) if out is not None else run_dir / "export"
    if out.exists() and (not out.is_dir() or set(p.name for p in out.iterdir()) - set(FILES)):
        raise ConfigError(f"{out} exists and is not an earlier export: give another --out")
    cfg, model, origin = source_model(run_dir, which, ema)
    timm_model, plain = exported_model(cfg, model)
    meta = {"attn": as_dict(cfg.attn), "variant": attention.attn_name(cfg.attn), "plain": plain, **origin}
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        names = {"tag": f"{meta['task']}_{meta['variant']}"}  # not the architecture's published weights
        with quiet("timm.data.model_config"):  # a 1-channel model's "mean does not match" notes
            config = {KEY: meta, "pretrained_cfg": names}
            timm.models.save_for_hf(timm_model, staging, model_config=config, safe_serialization=True)
        check_round_trip(model, staging)
        if out.exists():
            shutil.rmtree(out)
        staging.rename(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


@contextlib.contextmanager
def quiet(logger: str) -> Iterator[None]:
    """``logger``'s warnings held back for the block."""
    log = logging.getLogger(logger)
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def command_line() -> argparse.ArgumentParser:
    """The command line (see the module's docstring)."""
    parser = command_parser(__spec__.name, __doc__)
    parser.add_argument("run_dir", type=Path, help="the run folder (holds config.yaml and checkpoints/)")
    parser.add_argument("--out", type=Path, default=None, help="the folder to write (default RUN/export)")
    parser.add_argument("--checkpoint", choices=("best", "last"), default="best", help="which checkpoint")
    parser.add_argument("--ema", action="store_true", help="export the checkpoint's EMA weights")
    return parser


def main(argv: list[str] | None = None) -> int:
    """The command: one line naming the folder, or one line with the error and exit status 2."""
    return run_command(command_line(), run, argv)


def run(args: argparse.Namespace) -> None:
    """The command's work."""
    out = export(args.run_dir, args.out, args.checkpoint, args.ema)
    plain = json.loads((out / "config.json").read_text())[KEY]["plain"]
    how = (
        f'timm.create_model("local-dir:{out}", pretrained=True)'
        if plain
        else f'src.export.load("{out}") (timm model, then attention.apply, then its weights)'
    )
    print(f"exported {args.run_dir} -> {out}: load with {how}")


if __name__ == "__main__":
    raise SystemExit(main())
