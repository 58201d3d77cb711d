"""Language modelling: causal decoders on an embedded byte-level corpus, TinyStories and
WikiText-103 (see :mod:`tasks.lm.task`)."""

from .task import CharCorpus, HubTextCorpus, LanguageModelling, TinyStories, WikiText103

__all__ = ["CharCorpus", "HubTextCorpus", "LanguageModelling", "TinyStories", "WikiText103"]
