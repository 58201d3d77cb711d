"""Whether a backbone can serve a task and take the variant, from the config alone (no torch):
``src/cli.py`` asks before importing the model code, :func:`src.engine.experiment.train` again."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from src.errors import ConfigError

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"


def check_compatible(cfg: DictConfig) -> None:
    """Fail before any work when the backbone cannot serve the task, naming both sides."""
    task, backbone = cfg.task, cfg.backbone
    if OmegaConf.is_missing(backbone, "name"):
        raise ConfigError(
            "backbone.name is not set: backbone=timm builds a timm model by its name, e.g. "
            "backbone=timm backbone.name=vit_tiny_patch16_224 (every name: timm.list_models())"
        )
    reason = None
    if backbone.kind != task.input:
        reason = f"it takes {backbone.kind} inputs and the task gives {task.input} inputs"
    elif task.input == "image" and task.img_size < backbone.min_img_size:
        reason = (
            f"it needs images of at least {backbone.min_img_size} px and the task's are {task.img_size} px"
        )
    if reason:
        raise ConfigError(
            f"task={task.name} and backbone={backbone.name} are incompatible: {reason}. "
            f"Backbones for task={task.name}: {', '.join(compatible_backbones(task))}"
        )
    allowed = backbone.get("attn_variants")  # optional: the variants a backbone takes (absent: all)
    refused = [p for p in part_names(cfg.attn) if allowed is not None and p not in allowed]
    if refused:
        note = f": {backbone.attn_note}" if backbone.get("attn_note") else ""
        raise ConfigError(
            f"attn={refused[0]} does not apply to backbone={backbone.name}{note}. "
            f"Variants for backbone={backbone.name}: {', '.join(allowed)}"
        )


def part_names(attn: DictConfig) -> list[str]:
    """The variants ``attn`` applies (as :func:`src.attention.part_names`, which imports torch)."""
    return list(attn["parts"]) if "parts" in attn else [attn["variant"]]


def compatible_backbones(task: DictConfig) -> list[str]:
    """The names of the ``conf/backbone`` files that can serve ``task`` as they are: not
    ``timm.yaml``, which needs a model's name (``backbone=timm backbone.name=…``)."""
    names = []
    for path in sorted((CONF_DIR / "backbone").glob("*.yaml")):
        b = OmegaConf.load(path)
        if OmegaConf.is_missing(b, "name"):
            continue
        if b.kind == task.input and (task.input != "image" or task.img_size >= b.min_img_size):
            names.append(path.stem)
    return names
