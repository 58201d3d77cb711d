"""What ``launch.analysis.settle`` launches: each experiment's command rebuilt from its records and checked.

A sweep folder is data, perhaps someone else's, and its ``.hydra/overrides.yaml`` and
``multirun.yaml`` are files like any other: a ``_target_`` chaining ``torch.load`` over
``base64.b64decode`` in an override, or ``+hydra.callbacks.pwn=…`` among the sweep's Hydra
overrides, would run as code in every new seed if they were repeated. So nothing is repeated as
written. Each run's overrides file is parsed (Hydra's own parser, nothing resolved) and every
override is checked by the rules a record's ``config.yaml`` is (:mod:`src.engine.record.safe_config`):

* no Hydra override (``hydra.…``, ``hydra/…``) and no Hydra special key (``_target_``, ``_args_``,
  ``_partial_``, ``_recursive_``, ``_convert_``), at any depth of a key or of a value;
* no interpolation (``${…}``) anywhere in a value: none would be the suite's to resolve;
* a config group (``task=``, ``reading=``, ``experiment=``) only to one of the suite's own files;
* every other value the one the run's record holds at that key (a file that says otherwise
  disagrees with its record).

The command is then the suite's: the group choices, each checked value written by Hydra's own
serialiser (the text Hydra names the run folder by, so an unfinished seed resumes in its folder),
and the data folder the record's identity names; it is composed before anything is launched and
must give the record's identity (:func:`check_composes`). A file that breaks a rule or disagrees
is refused in one line naming it, before anything is written.

From ``multirun.yaml`` only the launcher is kept: ``hydra/launcher=<one the suite knows>``, its
plain size and queue values (:data:`LAUNCHER_VALUES`: a partition, a number of GPUs, never
``setup`` lines, ``srun_args`` or ``additional_parameters``, which reach a shell), and the removal
of one of the suite's own callbacks (``~hydra.callbacks.data_prepared``). Anything else is refused
in one line; what a user trusts is given on settle's own command line instead.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from src.errors import SuiteError

MAX_FILE_BYTES = 1 << 20  # an overrides file or multirun.yaml larger than this is not a command
#: submitit's launcher values that are sizes, names or queues (none reaches a shell as a command)
LAUNCHER_VALUES = frozenset(
    (
        "partition",
        "account",
        "qos",
        "comment",
        "constraint",
        "exclude",
        "gres",
        "nodes",
        "tasks_per_node",
        "gpus_per_node",
        "gpus_per_task",
        "cpus_per_task",
        "cpus_per_gpu",
        "mem_gb",
        "mem_per_gpu",
        "mem_per_cpu",
        "timeout_min",
        "signal_delay_s",
        "max_num_timeout",
        "array_parallelism",
        "stderr_to_stdout",
    )
)
PLAIN_TEXT = re.compile(r"[\w.,:@%+/\[\]-]*")  # a launcher value's text: no space, quote, $ or newline
SPECIAL_KEY = re.compile(r"_.*_")  # Hydra's instantiate keys: _target_, _args_, _partial_, …


class Refused(SuiteError):
    """A file of a sweep folder that the suite will not turn into a command."""


@dataclass(frozen=True)
class Command:
    """One experiment's command for new seeds: ``overrides`` (without the seed), and the overrides
    file it was checked against."""

    overrides: tuple[str, ...]
    source: Path


# -- reading the files as data ----------------------------------------------------------------


def read_list(path: Path) -> list[str]:
    """``path`` (YAML) as a list of strings, or one :class:`Refused` line."""
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            raise Refused(f"{path} is over {MAX_FILE_BYTES >> 20} MB: not a list of overrides; refused")
        items = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        raise Refused(f"{path} is not readable YAML ({one_line(error)}); refused") from None
    items = [] if items is None else items
    if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
        raise Refused(f"{path} is not a list of overrides (it holds {type(items).__name__}); refused")
    return items


def parsed(path: Path, lines: list[str]) -> list[Any]:
    """``lines`` parsed by Hydra's override parser (nothing resolved, nothing imported)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        return OverridesParser.create().parse_overrides(lines)
    except HydraException as error:
        raise Refused(f"{path}: {one_line(error)}; refused") from None


def one_line(error: object, limit: int = 200) -> str:
    line = " ".join(str(error).split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def refuse_code(path: Path, text: str, key: str, value: Any) -> None:
    """:class:`Refused` where ``key`` or ``value`` holds a Hydra setting, a special key or an
    interpolation (``text``: the override as written, for the message)."""
    parts = re.split(r"[./]", key.lstrip("~+"))
    inner = [(keys, leaf) for keys, leaf in leaves(value)]
    special = [k for k in [*parts, *(k for keys, _ in inner for k in keys)] if SPECIAL_KEY.fullmatch(k)]
    texts = [*(k for keys, _ in inner for k in keys), *(leaf for _, leaf in inner if isinstance(leaf, str))]
    why = None
    if parts[0] == "hydra":
        why = "a Hydra setting (callbacks, launchers and the like are not repeated from a file)"
    elif special:
        why = f"Hydra's special key {special[0]}"
    elif any("${" in t for t in texts):
        why = "an interpolation (a recorded command holds plain values)"
    if why:
        raise Refused(
            f"{path}: {text[:80]!r} sets {why}; a sweep folder is data, and the suite repeats only "
            "its own configs and plain values: refused"
        )


def leaves(value: Any, path: tuple[str, ...] = ()) -> Iterable[tuple[tuple[str, ...], Any]]:
    """``(keys, leaf)`` of a parsed value (dict keys as keys, list items as leaves)."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from leaves(v, (*path, str(k)))
    elif isinstance(value, list):
        for v in value:
            yield from leaves(v, path)
    else:
        yield path, value


# -- one run's command ------------------------------------------------------------------------


def run_command(folder: Path, record: dict[str, Any], identity: dict[str, Any]) -> Command:
    """The command of the run in ``folder`` for new seeds, rebuilt from its ``.hydra/overrides.yaml``
    checked against ``record`` (its config as data, :func:`launch.analysis.records.run_config`) and
    ``identity`` (its identity's config): see the module docstring."""
    from hydra.core.override_parser.types import Quote, QuotedString

    path = folder / ".hydra" / "overrides.yaml"
    lines = read_list(path)
    groups = job_groups()
    out: list[str] = []
    for text, override in zip(lines, parsed(path, lines), strict=True):
        key = override.key_or_group
        refuse_code(path, text, key, override.value())
        if override.package is not None or override.is_sweep_override():
            raise Refused(f"{path}: {text[:80]!r} is not one run's override (a package or a sweep); refused")
        if key in groups:
            choice = override.value()
            if choice is not None and (not isinstance(choice, str) or choice not in group_choices(key)):
                raise Refused(f"{path}: {text[:80]!r} selects no file of the suite's conf/{key}/; refused")
        else:
            check_agrees(path, text, override, record)
        if key == "seed" or key == "paths.data_dir":
            continue  # the seed is settle's; the data folder the identity's, below
        if override.is_delete() and override.value() is None:
            out.append(override.get_key_element())
        else:
            out.append(f"{override.get_key_element()}={override.get_value_element_as_str()}")
    data_dir = (identity.get("paths") or {}).get("data_dir")
    if data_dir is not None:
        refuse_code(folder / "identity.json", f"paths.data_dir={data_dir}", "paths.data_dir", data_dir)
        out.append(f"paths.data_dir={QuotedString(text=str(data_dir), quote=Quote.single).with_quotes()}")
    return Command(tuple(out), path)


def check_agrees(path: Path, text: str, override: Any, record: dict[str, Any]) -> None:
    """:class:`Refused` unless the value ``override`` sets is the one the run's record holds."""
    found, held = lookup(record, override.key_or_group)
    if override.is_delete():
        agrees = not found or held is None
    else:
        agrees = found and same(override.value(), held)
    if not agrees:
        shown = "nothing" if not found else repr(held)[:60]
        raise Refused(
            f"{path}: {text[:80]!r} disagrees with the run's record, which holds {shown} there; "
            "the folder's command is not the one its record ran: refused"
        )


def lookup(tree: Any, key: str) -> tuple[bool, Any]:
    """``(found, value)`` at dotted ``key`` of ``tree``."""
    for part in key.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return False, None
        tree = tree[part]
    return True, tree


def same(given: Any, held: Any) -> bool:
    """Whether an override's value is the record's: equal, numbers as numbers, text as its text
    (the schema turns ``1`` into ``1.0``, a name ``123`` into ``"123"``)."""
    if isinstance(given, dict) and isinstance(held, dict):
        return given.keys() == held.keys() and all(same(given[k], held[k]) for k in given)
    if isinstance(given, list) and isinstance(held, list):
        return len(given) == len(held) and all(same(a, b) for a, b in zip(given, held, strict=True))
    if isinstance(given, bool) or isinstance(held, bool):
        return given is held or str(given).lower() == str(held).lower()
    if isinstance(given, (int, float)) and isinstance(held, (int, float)):
        return given == held
    return given == held or (given is not None and held is not None and str(given) == str(held))


def job_groups() -> frozenset[str]:
    """The suite's config groups a run's command may select (``conf/<group>/``; not Hydra's)."""
    from src.cli import config_groups

    return frozenset(g for g in config_groups() if not g.startswith("hydra/"))


def group_choices(group: str) -> list[str]:
    from src.cli import group_options
    from src.configs import loader

    return group_options(loader(), group)


# -- the command must compose to the record ---------------------------------------------------


def check_composes(command: Command, seed: int, expected: Any, extra: tuple[str, ...] = ()) -> None:
    """Compose ``command`` with ``seed`` (and ``extra``: ``stage=confirm``) as ``python -m src.run``
    would, and :class:`Refused` (naming the overrides file) unless its identity without the seed is
    ``expected`` (the record's :class:`~src.engine.record.identity.Identity` without its seed; for
    ``extra``, both without the keys ``extra`` sets). Keys only a running job resolves
    (``${pretrained_by:…}``) are left out of the comparison."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    overrides = [*command.overrides, f"seed={seed}", *extra]
    try:
        composed, unknown = composed_identity(overrides)
    except (HydraException, OmegaConfBaseException, SuiteError, ValueError) as error:
        why = one_line(error)
        raise Refused(f"{command.source}: its command does not compose ({why}); refused") from None
    set_here = [o.partition("=")[0].lstrip("+~") for o in extra]
    got = composed.without(*set_here)
    want = expected.without(*unknown, *set_here)
    if got.hash != want.hash:
        differs = want.differences(got)
        listed = "; ".join(f"{k}: {v[0]!r} → {v[1]!r}"[:120] for k, v in list(differs.items())[:4])
        raise Refused(
            f"{command.source}: its command composes to another configuration than the run's record "
            f"({listed}); the folder's command is not the one its record ran: refused"
        )


def composed_identity(overrides: list[str], complete: bool = False) -> tuple[Any, list[str]]:
    """The identity without the seed of the run ``python -m src.run <overrides>`` would make, as
    far as composing tells it, and the keys only a running job resolves (``${pretrained_by:…}``),
    left out of it (compare a record's identity without them too; and its ``data``, which only a
    run reads). ``complete``: a composition's parts' options filled in as a run records them
    (:func:`src.attention.config.complete`; imports torch). Hydra's and OmegaConf's own errors
    where the overrides do not compose."""
    from omegaconf import OmegaConf

    from src.configs import compose
    from src.engine.record.identity import Identity, flatten
    from src.engine.record.safe_config import followed

    cfg = compose(overrides)
    if complete:
        from src.attention.config import complete as completed

        completed(cfg.attn)
    raw = OmegaConf.to_container(cfg, resolve=False)
    values = followed(OmegaConf.create(raw), raw)
    unknown = [k for k, v in flatten(values).items() if isinstance(v, str) and "${" in v]
    follows_seed = [k for k, v in flatten(raw).items() if v == "${seed}"]
    return Identity.of(values).without("seed", *follows_seed, *unknown), unknown


# -- the sweep's Hydra overrides --------------------------------------------------------------


def sweep_hydra(root: Path) -> list[str]:
    """The Hydra overrides of the sweep in ``root`` that new seeds repeat (its launcher and the
    launcher's plain values, removed suite callbacks), from ``multirun.yaml``'s
    ``hydra.overrides.hydra``; :class:`Refused` for any other."""
    path = root / "multirun.yaml"
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            raise Refused(f"{path} is over {MAX_FILE_BYTES >> 20} MB; refused")
        tree = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        raise Refused(f"{path} is not readable YAML ({one_line(error)}); refused") from None
    given = dig(tree, "hydra", "overrides", "hydra")
    if given is None:
        given = []
    if not isinstance(given, list) or not all(isinstance(o, str) for o in given):
        raise Refused(f"{path}: hydra.overrides.hydra is not a list of overrides; refused")
    kept = []
    for text, override in zip(given, parsed(path, given), strict=True):
        key = override.key_or_group
        if key in ("hydra.mode", "hydra.sweep.dir"):
            continue  # settle's own launches are sweeps into this folder
        kept.append(launcher_override(path, text, override))
    return kept


def launcher_override(path: Path, text: str, override: Any) -> str:
    """``override`` of ``multirun.yaml`` as the suite writes it, where it is one settle repeats."""
    key, value = override.key_or_group, override.value()
    plain = (
        value is None
        or isinstance(value, (bool, int, float))
        or (isinstance(value, str) and PLAIN_TEXT.fullmatch(value) is not None)
    )
    simple = override.package is None and not override.is_sweep_override() and plain
    if simple and key == "hydra/launcher" and not override.is_delete():
        if isinstance(value, str) and value in group_choices("hydra/launcher"):
            return f"hydra/launcher={value}"
    elif simple and launcher_key(key) is not None:
        return f"{override.get_key_element()}={override.get_value_element_as_str()}"
    elif simple and override.is_delete() and value is None and key.startswith("hydra.callbacks."):
        if key.removeprefix("hydra.callbacks.") in suite_callbacks():
            return override.get_key_element()
    raise Refused(
        f"{path}: {text[:80]!r} is not repeated from a file (settle repeats the sweep's launcher, "
        "its plain sizes and queues, and removed suite callbacks); if you trust it, give it on "
        "settle's command line after the folder: refused"
    )


def launcher_key(key: str) -> str | None:
    """``partition`` for ``hydra.launcher.partition``, where it is one of :data:`LAUNCHER_VALUES`."""
    name = key.removeprefix("hydra.launcher.")
    return name if key.startswith("hydra.launcher.") and name in LAUNCHER_VALUES else None


def suite_callbacks() -> frozenset[str]:
    from src.cli import CONF

    tree = yaml.safe_load((CONF / "config.yaml").read_text(encoding="utf-8"))
    return frozenset(dig(tree, "hydra", "callbacks") or {})


def dig(tree: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(tree, dict):
            return None
        tree = tree.get(key)
    return tree
