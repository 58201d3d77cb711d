"""Run labels (``task.name``) for data you bring: ``imagefolder-<folder>``, ``lm_char-<file>``.

The label names the run folder, the log lines, the W&B group and the report's rows, so it is kept
to characters a folder name takes. Torch-free: the config resolves it while it composes
(``${corpus_label:…}``, registered by :mod:`src.resolvers`; ``task=imagefolder``'s is
:func:`src.image_folder.label`).
"""

from __future__ import annotations

import re
from pathlib import Path

MAX_LABEL = 40  # characters of the data's name kept in the label (and the run folder's path)


def labelled(prefix: str, name: str) -> str:
    """``<prefix>-<name>``, the name kept to letters, digits, ``.``, ``_`` and ``-`` (it becomes a
    folder) and to :data:`MAX_LABEL` characters; ``prefix`` alone where nothing is left of it."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._")
    return f"{prefix}-{name[:MAX_LABEL]}" if name else prefix


def corpus_label(task: str, source: str | None, default: str | None = None) -> str:
    """A text task's ``task.name``: ``task`` on its own corpus (``source`` null or ``default``),
    else ``<task>-<source's name>`` (``lm_char-my_corpus`` for ``task.text_file=my_corpus.txt``,
    ``lm_tinystories-my_stories`` for ``task.folder=my_stories``), so that runs on your text are
    named by it in folders, W&B and the report, and never counted as the task's own (its claims)."""
    if source in (None, "", "None") or str(source) == str(default):
        return task
    return labelled(task, Path(str(source)).stem)
