"""A run folder is data: what of its recorded config the suite may build.

``python -m src.eval RUN`` rebuilds a run's task and model from the config its record holds. That
file is as trustworthy as whoever sent the folder: Hydra's ``instantiate`` calls whatever
``_target_`` it names with whatever arguments it holds (``torch.load`` with ``weights_only: false``
fed by ``base64.b64decode`` runs a pickled payload), and Hydra's own blocklist stops only a few
names. So before anything is imported or built from a recorded config, :func:`check_buildable`
checks each ``_target_`` in it against the suite's own configs: a ``_target_`` is allowed only
where a file of ``conf/`` puts one (the same key: ``task._target_``, ``backbone.model._target_``)
and only with a value some file of ``conf/`` gives there. A record's config is resolved when it is
written, so an interpolation (``${…}``) in it is refused too: resolving it would call resolvers on
the folder's behalf.

Anything else ends in one :class:`UntrustedConfig` line naming the file, the key and the value.

Nothing read from disk is resolved with OmegaConf's resolvers either: :func:`as_data` gives a
recorded config's values with its node interpolations (``${seed}``, ``${task.name}``) followed and
every resolver call (``${oc.env:…}``, the suite's own ``${cpus_at_most:…}``, any other) left as its
literal text, so that a folder cannot make the reader look up an environment variable, a file or
anything else on its behalf. The suite's resolvers resolve configs it composes for a new run, never
a record read back.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.grammar.gen.OmegaConfGrammarParser import OmegaConfGrammarParser
from omegaconf.grammar_parser import parse

from src.errors import ConfigError

CONF = Path(__file__).resolve().parents[3] / "conf"
TARGET = "_target_"


class UntrustedConfig(ConfigError):
    """A recorded config that names something the suite's configs do not build."""


def check_buildable(tree: Any, source: Path | str, resolved: bool = True) -> None:
    """Raise :class:`UntrustedConfig` unless every ``_target_`` in ``tree`` (a plain container of a
    run's config, read without resolving it) is one the suite's ``conf/`` sets at that key, and,
    for a config written ``resolved`` (the record's ``config.yaml``, not Hydra's
    ``.hydra/config.yaml``), no value is an interpolation. ``source`` names the file read."""
    allowed = suite_targets()
    for path, value in walk(tree):
        key = ".".join(path)
        if path and path[-1] == TARGET:
            node = pattern(path[:-1])
            if value not in allowed.get(node, ()):
                where = "a key where" if node not in allowed else f"{key}, where"
                raise UntrustedConfig(
                    f"{source} names _target_ {value!r} at {key}: no config of the suite builds it there "
                    f"({where} conf/ sets {'no _target_' if node not in allowed else 'other classes'}). "
                    "A run folder is data, and the suite builds only what its own configs name: refused"
                )
        elif resolved and isinstance(value, str) and "${" in value:
            raise UntrustedConfig(
                f"{source} holds an interpolation at {key} ({value[:60]!r}); a recorded config is written "
                "resolved, so this one was edited: refused"
            )


def walk(tree: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """``(key path, value)`` of every leaf of ``tree`` (list items as their index)."""
    if isinstance(tree, dict):
        for key, value in tree.items():
            yield from walk(value, (*path, str(key)))
    elif isinstance(tree, list):
        for index, value in enumerate(tree):
            yield from walk(value, (*path, str(index)))
    else:
        yield path, tree


def pattern(path: tuple[str, ...]) -> str:
    """A node's dotted key with list indices as ``*`` (``attn.parts.0`` -> ``attn.parts.*``)."""
    return ".".join("*" if part.isdigit() else part for part in path)


@functools.lru_cache(maxsize=1)
def suite_targets() -> dict[str, frozenset[str]]:
    """``{node's dotted key: the _target_ values conf/ gives it}``, over every file of ``conf/``
    but Hydra's own (``conf/hydra/``, which a run's record does not keep): a group's file is
    placed at its group (``conf/backbone/x.yaml`` at ``backbone``), a ``# @package _global_`` file
    at the root."""
    from .identity import MOVED_TARGETS  # a record made before a class moved names its old path

    found: dict[str, set[str]] = {}
    for file in sorted(CONF.rglob("*.yaml")):
        relative = file.relative_to(CONF)
        if relative.parts[0] == "hydra":
            continue
        text = file.read_text(encoding="utf-8")
        package = package_of(text, relative)
        for path, value in walk(yaml.safe_load(text) or {}):
            if path and path[-1] == TARGET and isinstance(value, str):
                node = pattern((*package, *path[:-1]))
                found.setdefault(node, set()).add(value)
    for values in found.values():
        values.update(old for old, new in MOVED_TARGETS.items() if new in values)
    return {node: frozenset(values) for node, values in found.items()}


def package_of(text: str, relative: Path) -> tuple[str, ...]:
    """Where Hydra places a config file's content: its ``# @package`` line, else its group."""
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped.startswith("#"):
            break
        if stripped.lstrip("#").strip().startswith("@package"):
            package = stripped.split("@package", 1)[1].strip()
            return () if package == "_global_" else tuple(package.split("."))
    return tuple(relative.parent.parts)


# -- values as data: no resolver runs on a config read from disk -------------------------------------


def as_data(tree: dict[str, Any]) -> dict[str, Any]:
    """``tree`` (a config read unresolved) with its node interpolations followed (``${seed}``,
    ``${.parts}``, ``x${task.name}``) and each string that calls a resolver kept as its literal
    text, also where another value copies it: no resolver (``oc.env``, ``oc.decode``, the suite's
    own, any registered) is called. An interpolation that cannot be followed (a missing key) is kept
    as its text too."""
    literal: dict[str, str] = {}

    def mask(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: mask(v) for k, v in value.items()}
        if isinstance(value, list):
            return [mask(v) for v in value]
        if isinstance(value, str) and "${" in value and calls_resolver(value):
            token = f"\x00literal{len(literal)}\x00"  # no "${": OmegaConf reads it as plain text
            literal[token] = value
            return token
        return value

    def unmask(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: unmask(v) for k, v in value.items()}
        if isinstance(value, list):
            return [unmask(v) for v in value]
        if isinstance(value, str) and "\x00literal" in value:
            for token, text in literal.items():
                value = value.replace(token, text)
        return value

    masked = mask(tree)
    return unmask(followed(OmegaConf.create(masked), masked))


def followed(node: DictConfig | ListConfig, raw: Any) -> Any:
    """``node``'s values, each interpolation followed where it can be, else ``raw``'s text."""
    keys = list(raw) if isinstance(raw, dict) else range(len(raw))
    out = {} if isinstance(raw, dict) else [None] * len(raw)
    for key in keys:
        value = raw[key]
        if isinstance(value, (dict, list)):
            out[key] = followed(node[key], value)
            continue
        try:
            got = node[key]
            copied = isinstance(got, (DictConfig, ListConfig))  # ${a.node}: a copy of a node, masked too
            out[key] = OmegaConf.to_container(got, resolve=True) if copied else got
        except Exception:  # noqa: BLE001  a missing key, a "???": the text as written
            out[key] = value
    return out


def calls_resolver(text: str) -> bool:
    """Whether OmegaConf would call a resolver to resolve ``text`` (``${oc.env:X}``, ``a${b:c}``);
    text it cannot parse counts as one (it is then never resolved)."""
    try:
        tree = parse(text)
    except Exception:  # noqa: BLE001  OmegaConf's grammar errors
        return True
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, OmegaConfGrammarParser.InterpolationResolverContext):
            return True
        stack.extend(node.getChildren() if hasattr(node, "getChildren") else [])
    return False
