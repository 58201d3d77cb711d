"""GLUE (Wang et al., 2019): its nine tasks read from GLUE's official files or a Hugging Face copy
(:mod:`tasks.glue.formats`), their official metrics and the GLUE average (:mod:`tasks.glue.metrics`),
fine-tuning from a masked-LM checkpoint (:mod:`tasks.glue.task`), and ``glue_tiny``, a small
generated set in GLUE's format (:mod:`tasks.glue.generate`)."""

from .task import Glue

__all__ = ["Glue"]
