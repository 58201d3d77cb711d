"""Language modelling: causal decoders on an embedded byte-level corpus, TinyStories and
WikiText-103 (see :mod:`tasks.lm.task`).

The task classes are imported on first use (PEP 562), so that ``python -m tasks.lm.sample --help``
answers without importing torch."""

from __future__ import annotations

from typing import Any

__all__ = ["CharCorpus", "HubTextCorpus", "LanguageModelling", "TinyStories", "WikiText103"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import task

        return getattr(task, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
