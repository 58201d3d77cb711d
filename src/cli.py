"""The command line before Hydra sees it: ``--help``, typos in group selections, values with ``=``.

``python -m src.run --help`` lists every config group with its options, each described by the
first comment line of its file. A selection that names no file (``attn=precon``) ends with one
line naming the closest options, instead of Hydra's long traceback. A value that holds an
``=`` (a path into a run folder, ``…/seed=0/…``) is quoted, which Hydra's grammar needs.
``--hydra-help`` and everything else pass through to Hydra unchanged.
"""

from __future__ import annotations

import difflib
from pathlib import Path

import yaml

from src.errors import ConfigError

CONF = Path(__file__).resolve().parents[1] / "conf"
WIDTH = 110


def prepare_argv(args: list[str]) -> list[str]:
    """``args`` (``sys.argv[1:]``) as Hydra should get them; prints the help and exits for
    ``--help``; raises :class:`ConfigError` for a selection that names no option."""
    if "--help" in args or "-h" in args:
        print(help_text())
        raise SystemExit(0)
    args = [quote_value(a) if is_override(a) else a for a in args]
    overrides = [a for a in args if is_override(a)]
    if not any(o.lstrip("+~").startswith("hydra.searchpath") for o in overrides):  # Hydra checks those
        check_selections(overrides, config_dirs(args))
    return args


def config_dirs(args: list[str]) -> list[Path]:
    """The folders ``--config-dir DIR`` (``-cd DIR``, ``--config-dir=DIR``) adds to ``conf/``."""
    found = []
    for i, arg in enumerate(args):
        if arg in ("--config-dir", "-cd") and i + 1 < len(args):
            found.append(Path(args[i + 1]).resolve())
        elif arg.startswith("--config-dir="):
            found.append(Path(arg.partition("=")[2]).resolve())
    return found


def is_override(arg: str) -> bool:
    """A ``key=value`` override, as opposed to a flag (``-m``, ``--cfg``) or a flag's value."""
    return "=" in arg and not arg.startswith("-")


# -- values with "=" --------------------------------------------------------------------------


def quote_value(override: str) -> str:
    """``key=a/seed=0/b`` as ``key='a/seed=0/b'``: Hydra's grammar takes no unquoted ``=`` in a
    value. An override Hydra parses already (a sweep, ``glob(…)``, a quoted value) is kept."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    key, _, value = override.partition("=")
    if "=" not in value or value[:1] in "'\"[{":
        return override
    try:
        OverridesParser.create().parse_override(override)
        return override
    except Exception:  # noqa: BLE001  Hydra's grammar refuses it: quote the whole value
        pass
    for quote in ("'", '"'):
        if quote not in value:
            return f"{key}={quote}{value}{quote}"
    return override  # both quotes inside: leave Hydra's own message


# -- other tools' words ------------------------------------------------------------------------

#: Words that Lightning, lightning-hydra-template and timm's ``train.py`` teach, each with the suite's
#: own way: a key (``lr=``), a dotted key (``trainer.amp=``) or a group selection (``trainer=gpu``).
#: The one table of such pointers: :func:`check_option` answers a selection with it, and
#: :func:`src.precheck.check_keys` a key no config has (or a new key only an experiment reads).
POINTERS = {
    "trainer=gpu": "the device is an option, not a trainer config: trainer.device=cuda "
    "(auto: a GPU where there is one)",
    "trainer=cpu": "the device is an option, not a trainer config: trainer.device=cpu",
    "trainer=ddp": "more processes come from the launcher: torchrun --nproc_per_node=N -m src.run … "
    "(docs/getting-started.md)",
    "ckpt_path": "resuming is automatic: rerun the same command and it continues from its run folder's "
    "checkpoints/last.pt (trainer.resume=auto); to evaluate a checkpoint: python -m src.eval RUN_DIR|FILE.pt",
    "lr": "the learning rate is optim.lr=…",
    "learning_rate": "the learning rate is optim.lr=…",
    "weight_decay": "the weight decay is optim.weight_decay=…",
    "epochs": "the run's length is trainer.max_epochs=… (or trainer.max_steps=…)",
    "max_epochs": "the run's length is trainer.max_epochs=… (or trainer.max_steps=…)",
    "batch_size": "the batch is the task's: task.batch_size=…",
    "trainer.amp": "mixed precision is trainer.precision=bf16 (autocast, CPU and GPU)",
    "trainer.accelerator": "the device is trainer.device=cuda|cpu|auto",
    "trainer.gpus": "the device is trainer.device=cuda; more GPUs: torchrun --nproc_per_node=N -m src.run",
    "trainer.devices": "the device is trainer.device=cuda; more GPUs: torchrun --nproc_per_node=N -m src.run",
    "trainer.gradient_clip_val": "gradient clipping is trainer.clip_grad=…",
    "trainer.accumulate_grad_batches": "gradient accumulation is trainer.accumulate=…",
    "trainer.max_time": "the wall-clock budget is resources.time_min=… (a SLURM job requeues and resumes)",
    "optim.mlp_lr_discount": "P5's feed-forward discount is read by the parameter-group hook that "
    "experiment=paper/p5_mlp_lr names (python -m src.run experiment=paper/p5_mlp_lr optim.mlp_lr_discount=4)",
}


def pointer(word: str) -> str | None:
    """The suite's way for ``word`` (a key, or ``group=option``) from :data:`POINTERS`, if it has one."""
    return POINTERS.get(word.lstrip("+~"))


# -- group selections ---------------------------------------------------------------------------


def check_selections(overrides: list[str], extra_dirs: list[Path] = ()) -> None:
    """Every option a group selection names (``attn=…``, ``experiment=smoke/digits``, each
    element of ``attn=a,b``, ``glob(…)``) must exist in ``conf/`` or ``extra_dirs``, else one
    :class:`ConfigError`."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import ChoiceSweep, Glob

    parser = OverridesParser.create()
    loader = None
    for text in overrides:
        try:
            override = parser.parse_override(text)
        except Exception:  # noqa: BLE001  Hydra reports its own grammar errors
            continue
        if override.is_delete():
            continue
        group = override.key_or_group
        loader = loader or config_loader(extra_dirs)
        if not loader.repository.group_exists(group):
            continue
        value = override.value()
        options = group_options(loader, group)
        if isinstance(value, Glob):
            if not value.filter(options):
                listed = ", ".join(options)
                raise ConfigError(f"{text}: matches no option in conf/{group} (options: {listed})")
        elif isinstance(value, ChoiceSweep):
            for choice in value.list:
                check_option(group, choice, options)
        elif isinstance(value, str):
            check_option(group, value, options)


def check_option(group: str, choice: object, options: list[str]) -> None:
    """``choice`` is one of ``options``, or a :class:`ConfigError` naming the closest."""
    if not isinstance(choice, str) or choice in options:
        return
    close = difflib.get_close_matches(choice, options, n=3, cutoff=0.6)
    hint = f"; did you mean {' or '.join(close)}?" if close else ""
    if group == "backbone" and not close and "timm" in options and is_timm_model(choice):
        raise ConfigError(
            f"backbone={choice}: no such option in conf/backbone, but a timm model: "
            f"backbone=timm backbone.name={choice}"
        )
    if pointer(f"{group}={choice}"):
        hint = f"; {pointer(f'{group}={choice}')}"
    raise ConfigError(
        f"{group}={choice}: no such option in conf/{group}{hint} (options: {', '.join(options)})"
    )


def is_timm_model(name: str) -> bool:
    """``name`` is in timm's registry (imports timm, and so torch: asked only of a refused word
    with no close option in ``conf/backbone``, so that a typo of one is still refused torch-free)."""
    try:
        import timm
    except ImportError:
        return False
    return timm.is_model(name)


def config_loader(extra_dirs: list[Path] = ()):
    """Hydra's config loader over ``conf/`` and ``extra_dirs`` (it also knows the plugins' options,
    ``hydra/launcher=basic``), built apart from Hydra's global state, which ``@hydra.main`` (or a
    test) sets up after."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.utils import create_config_search_path
    from hydra.core.config_search_path import SearchPathQuery

    search_path = create_config_search_path(f"file://{CONF}")
    # where Hydra's main puts --config-dir: before the schema source, which stays last
    for folder in extra_dirs:
        search_path.prepend(
            provider="command-line", path=f"file://{folder}", anchor=SearchPathQuery(provider="schema")
        )
    return ConfigLoaderImpl(config_search_path=search_path)


def group_options(loader, group: str) -> list[str]:
    """Every option of ``group``, those in subfolders as ``sub/name`` (``experiment=smoke/digits``)."""
    from hydra.core.object_type import ObjectType

    options = list(loader.get_group_options(group))
    for sub in loader.get_group_options(group, results_filter=ObjectType.GROUP):
        options += [f"{sub}/{name}" for name in group_options(loader, f"{group}/{sub}")]
    return sorted(options)


# -- --help ------------------------------------------------------------------------------------


def help_text() -> str:
    """The listing ``--help`` prints: usage, each group's options with one line each, pointers."""
    defaults = default_choices()
    lines = [
        "python -m src.run [group=option ...] [key=value ...]      one run",
        "python -m src.run -m group=a,b key=1,2 ...                a sweep (every combination)",
        "",
        "Config groups (conf/<group>/; * marks the default):",
    ]
    for group in config_groups():
        lines.append(f"  {group}=")
        files = sorted((CONF / group).rglob("*.yaml"))
        names = [f.relative_to(CONF / group).with_suffix("").as_posix() for f in files]
        pad = max(len(n) for n in names) + 2
        for name, file in zip(names, files, strict=True):
            mark = "*" if defaults.get(group) == name else " "
            text = f"   {mark}{name:<{pad}}{describe(file)}"
            lines.append(text if len(text) <= WIDTH else text[: WIDTH - 1] + "…")
    lines += [
        "",
        "Run options (seed=0, trainer.max_steps=…, task.batch_size=…, optim.lr=…): every key and its value",
        "  for a command: python -m src.run --cfg job [overrides]    (trainer.*: conf/trainer/default.yaml)",
        "Hydra's own options (--cfg, --info, -m, --multirun, …): python -m src.run --hydra-help",
    ]
    return "\n".join(lines)


def config_groups() -> list[str]:
    """The groups in ``conf/``: its folders, and ``hydra/<group>`` for those under ``conf/hydra``."""
    groups = []
    for folder in sorted(p for p in CONF.iterdir() if p.is_dir()):
        if folder.name == "hydra":
            groups += [f"hydra/{p.name}" for p in sorted(folder.iterdir()) if p.is_dir()]
        elif any(folder.rglob("*.yaml")):
            groups.append(folder.name)
    return groups


def describe(file: Path) -> str:
    """The first comment line of ``file`` that is not Hydra's ``# @package`` directive."""
    for line in file.read_text(encoding="utf-8").splitlines():
        text = line.strip()
        if not text.startswith("#"):
            break
        text = text.lstrip("#").strip()
        if text and not text.startswith("@package"):
            return text.rstrip(":").strip()
    return ""


def default_choices() -> dict[str, str]:
    """``conf/config.yaml``'s defaults list as ``{group: option}``."""
    entries = yaml.safe_load((CONF / "config.yaml").read_text(encoding="utf-8")).get("defaults", [])
    return {k: str(v) for e in entries if isinstance(e, dict) for k, v in e.items()}
