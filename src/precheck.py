"""What the command line can refuse from the config alone, before torch and timm are imported.

:func:`precheck` runs after :func:`src.cli.prepare_argv` and before Hydra's ``main``: it composes
the config as Hydra will (with Hydra's own loader, torch-free) and refuses, in one
:class:`ConfigError` each, a key no config has (``trainer.max_step=5``: did you mean
``trainer.max_steps``) or a new one nothing reads (``+trainer.max_step=5``), ``-m`` with ``--cfg``,
``attn=`` and ``reading=`` naming different variants, out-of-range values, a task and backbone
that do not fit, a timm model name timm does not know (``backbone=timm``: the one check that
imports timm) and a detection task without the detection extra. Anything it cannot compose it
leaves to Hydra, which says why in its own words.
"""

from __future__ import annotations

import difflib
import importlib.util
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf

from src.cli import CONF, config_dirs, is_override, pointer
from src.configs import compose, loader
from src.errors import ConfigError, user_error

#: Groups whose keys are all declared (the trainer's structured schema, src/engine/schema.py): a new
#: key there is read by nobody. Other groups (task, backbone, attn, …) pass their options to code
#: that refuses unknown ones itself (``+attn.lamda=3``), or take new ones by design
#: (``+attn.spectral.mode=svd`` with ``attn=compose``).
CLOSED_GROUPS = ("trainer",)
#: Flags after which argv is not the suite's usual config (another config, Hydra's own output).
UNCHECKED_FLAGS = (
    "--config-name",
    "-cn",
    "--config-path",
    "-cp",
    "--info",
    "--hydra-help",
    "--shell-completion",
    "-sc",
)
DETECTION_STACK = ("mmdet", "mmcv", "mmengine")
#: ``conf/backbone/timm.yaml``'s builder: its ``backbone.name`` must be in timm's registry.
TIMM_BY_NAME = "src.models.timm_named.create"
DETECTION_HINT = (
    "the detection tasks need the detection extra (mmdet, mmcv 2.1.0 with its compiled ops), which is "
    "not installed: run `make detection` (builds mmcv once, about 30 minutes on 2 cores, kept in a cache) "
    "or `make install DETECTION=1` to install everything in one go"
)


def precheck(args: list[str]) -> None:
    """Refuse ``args`` (argv as Hydra will get it) when the config alone shows it cannot run."""
    multirun = "-m" in args or "--multirun" in args
    refuse_multirun_cfg(args, multirun)
    if any(a in UNCHECKED_FLAGS or a.split("=")[0] in UNCHECKED_FLAGS for a in args):
        return
    overrides = [a for a in args if is_override(a)]
    if any(o.lstrip("+~").startswith("hydra.searchpath") for o in overrides):
        return
    check_reading(overrides)
    dirs = config_dirs(args)
    parsed = parse(overrides)
    if parsed is None:
        return  # Hydra reports its own grammar errors
    selections = [o for o in parsed if is_selection(o, dirs)]
    if any(not isinstance(o.value(), str) and o.value() is not None for o in selections):
        return  # a sweep over groups: each job composes its own keys
    base = composed([o.input_line for o in selections], dirs)
    if base is None:
        return
    check_keys([o for o in parsed if o not in selections], base)
    printing = "--cfg" in args or "-c" in args
    if multirun or (printing and "--resolve" not in args):
        return  # each job checks its own values; --cfg prints what was asked
    cfg = composed(overrides, dirs)
    if cfg is None:
        return
    if printing:
        refuse_unresolvable(cfg)
    else:
        check_run(cfg)


def refuse_unresolvable(cfg: DictConfig) -> None:
    """``--cfg job --resolve`` where a value is ``${pretrained_by:…}``: it names a checkpoint in
    the run folder of another job of the same command, which only a run has (Hydra sets it when
    the job starts), so no printing can resolve it. Say so in one line (Hydra: a traceback)."""
    plain = OmegaConf.to_container(cfg, resolve=False)
    plain.pop("hydra", None)
    for key in flat_keys(plain):
        raw = value_as_given(plain, key)
        task = raw.partition("${pretrained_by:")[2].split(",")[0] if isinstance(raw, str) else ""
        if task and task != OmegaConf.select(cfg, "task.name", default=None):  # the pretraining: None
            raise ConfigError(
                f"--resolve: {key}={raw} is checkpoints/last.pt of the task={task} run of the same command, "
                "found from the run folder, which exists only once the run starts; print without --resolve, "
                f"or set {key}=<checkpoint>"
            )


def value_as_given(plain: Any, key: str) -> Any:
    """The unresolved value at dotted ``key`` of a plain container."""
    node = plain
    for part in key.split("."):
        node = node[part] if isinstance(node, dict) else None
    return node


def refuse_multirun_cfg(args: list[str], multirun: bool) -> None:
    """Hydra cannot print a sweep's config (``-m … --cfg job`` is its traceback): say what can."""
    if not multirun or not ({"--cfg", "-c"} & set(args) or any(a.startswith("--cfg=") for a in args)):
        return
    first = first_job(args)
    shown = f" (python -m src.run {' '.join(first)})" if first is not None else ""
    raise ConfigError(
        f"--cfg prints one job's config, not a sweep's: drop -m and name one value of each swept option "
        f"to see a job's{shown}"
    )


def first_job(args: list[str]) -> list[str] | None:
    """The sweep's first job as a command line (``-m`` dropped, each swept option at its first
    value: ``attn=a,b`` → ``attn=a``, ``seed=range(0,3)`` → ``seed=0``); None where a sweep's first
    value needs the config groups' listing (``glob(…)``)."""
    job = []
    for arg in args:
        if arg in ("-m", "--multirun"):
            continue
        parsed = parse([arg]) if "=" in arg and not arg.startswith("-") else None
        if not parsed or not parsed[0].is_sweep_override():
            job.append(arg)
            continue
        try:
            value = next(iter(parsed[0].sweep_string_iterator()))
        except Exception:  # noqa: BLE001  glob(…) and interval sweeps have no list of their own
            return None
        job.append(f"{parsed[0].get_key_element()}={value}")
    return job


def parse(overrides: list[str]) -> list[Any] | None:
    """Hydra's parsed overrides, or None where its grammar refuses one."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        return OverridesParser.create().parse_overrides(overrides)
    except Exception:  # noqa: BLE001
        return None


def is_selection(override, dirs: list) -> bool:
    """A group selection (``attn=spectral``, ``hydra/launcher=slurm``), not a value."""
    group = override.key_or_group
    return group.startswith("hydra/") or loader(tuple(dirs)).repository.group_exists(group)


def composed(overrides: list[str], dirs: list) -> DictConfig | None:
    """The config Hydra composes for ``overrides`` (:func:`src.configs.compose`), None if it cannot."""
    try:
        return compose(overrides, config_dirs=dirs)
    except Exception:  # noqa: BLE001  Hydra says why when it composes again
        return None


def check_keys(values: list[Any], base: DictConfig) -> None:
    """Each ``key=value`` names a key of ``base``; a new ``+key`` only where something reads it."""
    plain = OmegaConf.to_container(base, resolve=False)
    known = sorted(flat_keys({k: v for k, v in plain.items() if k != "hydra"}))
    for o in values:
        key = o.key_or_group
        if o.is_delete() or key.startswith("hydra.") or has_key(plain, key):
            continue
        adds = o.is_add() or o.is_force_add()
        if adds and key.split(".")[0] not in CLOSED_GROUPS and "." in key:
            continue
        close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]}?" if close else ""
        if pointer(key):  # another tool's word (lr, trainer.amp): the suite's way, not a near spelling
            hint = f"; {pointer(key)}"
        what = "nothing reads a new key" if adds else "no config has this key"
        raise ConfigError(f"{o.input_line}: {what}{hint} (every key: python -m src.run --cfg job)")


def flat_keys(node: Any, prefix: str = "") -> list[str]:
    """Every dotted key path in a plain container."""
    keys = []
    if isinstance(node, dict):
        for k, v in node.items():
            keys.append(f"{prefix}{k}")
            keys += flat_keys(v, f"{prefix}{k}.")
    return keys


def has_key(plain: Any, key: str) -> bool:
    """``key`` (dotted) is in ``plain``; a list index counts."""
    node = plain
    for part in key.split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return False
    return True


def check_reading(overrides: list[str]) -> None:
    """``attn=X reading=Y`` where reading Y belongs to another variant: the command line's ``attn``
    would win and silently take Y's options. One line naming both groups."""
    chosen = dict(o.lstrip("+").partition("=")[::2] for o in overrides if "=" in o)
    attn, reading = chosen.get("attn"), chosen.get("reading")
    if not attn or not reading or reading == "null":
        return
    owner = reading_variant(reading)
    if owner is not None and owner != attn:
        files = sorted((CONF / "reading").glob("*.yaml"))
        readings = [p.stem for p in files if reading_variant(p.stem) == attn]
        others = f" (readings of attn={attn}: {', '.join(readings)})" if readings else ""
        raise ConfigError(
            f"attn={attn} and reading={reading} choose different variants: reading={reading} is a reading "
            f"of attn={owner}, and sets it; type reading={reading} alone, or attn={attn} alone{others}"
        )


def reading_variant(reading: str) -> str | None:
    """The variant ``conf/reading/<reading>.yaml`` selects (its ``override /attn: …``)."""
    path = CONF / "reading" / f"{reading}.yaml"
    if not path.is_file():
        return None
    for entry in yaml.safe_load(path.read_text(encoding="utf-8")).get("defaults", []):
        if isinstance(entry, dict) and "override /attn" in entry:
            return str(entry["override /attn"])
    return None


def check_run(cfg: DictConfig) -> None:
    """The checks a run makes before any work, torch-free: values, task and backbone, detection."""
    from src.engine.compatible import check_compatible
    from src.engine.schema import check_values

    for check in (check_values, check_compatible):
        try:
            check(cfg)
        except ConfigError:
            raise
        except Exception as e:  # noqa: BLE001  an interpolation only a run resolves: the run checks again
            cause = user_error(e)  # ... unless it failed on the user's input (a missing image folder)
            if cause is not None:
                raise ConfigError(str(cause)) from None
    if OmegaConf.select(cfg, "backbone.model._target_", default=None) == TIMM_BY_NAME:
        from src.models.timm_named import check_name  # imports timm: only for a timm model by name

        check_name(cfg.backbone.name)
    if OmegaConf.select(cfg, "task.input", default=None) == "detection":
        missing = [name for name in DETECTION_STACK if not importable(name)]
        if missing:
            raise ConfigError(f"{DETECTION_HINT} (missing: {', '.join(missing)})")


def importable(name: str) -> bool:
    """``name`` can be found (without importing it)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


__all__ = ["precheck"]
