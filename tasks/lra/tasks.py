"""The five LRA tasks and the generated ListOps of the embedded default, each reading its
official on-disk format under ``paths.data_dir / folder`` (see the modules that read them)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from src.engine.generated import ensure_generated, read_marker
from src.errors import DataError

from . import images, listops, text
from .base import LRATask, Sequences, Split


class ListOps(LRATask):
    """ListOps: ``listops-1000/basic_{train,val,test}.tsv``, 10 classes, length 2000."""

    vocab_size = listops.VOCAB_SIZE

    def __init__(self, keep_parens: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.keep_parens = keep_parens

    def load(self, root: Path, split: Split) -> Sequences:
        rows = listops.read_split(root, split)
        seqs = [listops.tokenize(source, self.max_length, self.keep_parens) for source, _ in rows]
        labels = [target for _, target in rows]
        if not all(0 <= t < self.num_classes for t in labels):
            raise DataError(
                f"{root / listops.SPLITS[split]}: targets must be digits 0-{self.num_classes - 1}"
            )
        return Sequences(labels, seqs)


class ListOpsSmall(ListOps):
    """ListOps generated on first use into ``folder`` (the release's TSV format), then read
    back through :class:`ListOps`: the embedded default of the LRA family.

    The generator's options (``generate``: ``num_train``, ``num_val``, ``num_test``,
    ``min_length``, ``max_length``, ``max_depth``, ``max_args``, ``seed``) are those of
    :class:`tasks.lra.listops.ListOpsSpec`; they are kept beside the files (``generator.json``),
    and files generated with other options are generated again
    (:func:`src.engine.generated.ensure_generated`).
    """

    def __init__(self, generate: dict[str, int] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.spec = listops.ListOpsSpec(**dict(generate or {}))

    def prepare_data(self, data_dir: Path) -> None:
        """The three TSV files, generated unless they are there (what :meth:`datasets` reads)."""
        ensure_listops(Path(data_dir) / self.folder, self.spec)

    def load(self, root: Path, split: Split) -> Sequences:
        """As :class:`ListOps` reads it; an error in a file this task generated says so, and that
        deleting the folder makes it again (its manifest's check regenerates damaged files first,
        so this is a file damaged since, or a generator's fault)."""
        try:
            return super().load(root, split)
        except DataError as error:
            if read_marker(root / "generator.json") is None:  # the user's own files
                raise
            raise DataError(
                f"{error}; {root} holds generated data (generator.json): delete the folder and the "
                "next run generates it again"
            ) from None

    def datasets(self, data_dir: Path):
        self.prepare_data(data_dir)
        return super().datasets(data_dir)

    def eval_dataset(self, data_dir: Path, split: str) -> Sequences:
        self.check_split(split)
        self.prepare_data(data_dir)
        return super().eval_dataset(data_dir, split)


def ensure_listops(folder: Path, spec: listops.ListOpsSpec) -> None:
    """The three TSV files of ``spec`` in ``folder``, generated unless they are there."""
    files = [folder / name for name in listops.SPLITS.values()]

    def damage(saved: dict) -> str | None:
        missing = [f.name for f in files if not f.is_file()]
        return f"missing {', '.join(missing)}" if missing else None

    ensure_generated(
        folder / "generator.json",
        dataclasses.asdict(spec),
        lambda: listops.write_release(folder, listops.generate(spec)),
        damage,
        present=lambda: all(f.is_file() for f in files),  # files without generator.json: the user's
        what=f"ListOps ({spec.num_train:,} train / {spec.num_val:,} val / {spec.num_test:,} test)",
        outputs=files,
    )


class Text(LRATask):
    """IMDB at byte level, 2 classes; ``val`` is IMDB's test split, as in LRA: IMDB has no
    third split, so ``val`` and ``test`` read the same 25,000 reviews (never a split made up here)."""

    vocab_size = text.BYTE_VOCAB_SIZE

    def load(self, root: Path, split: Split) -> Sequences:
        texts, labels = text.read_imdb(root, "train" if split == "train" else "test")
        return Sequences(labels, [text.encode_bytes(t, self.max_length) for t in texts])


class Retrieval(LRATask):
    """AAN document pairs at byte level, 2 classes, two towers."""

    vocab_size = text.BYTE_VOCAB_SIZE
    dual = True

    def load(self, root: Path, split: Split) -> Sequences:
        first, second, labels = text.read_aan(root, split)
        return Sequences(
            labels,
            [text.encode_bytes(t, self.max_length) for t in first],
            [text.encode_bytes(t, self.max_length) for t in second],
        )


class Image(LRATask):
    """Grayscale CIFAR-10 as 1024 pixel tokens, 10 classes."""

    vocab_size = images.PIXEL_VOCAB_SIZE

    def __init__(self, val_size: int = 5000, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.val_size = val_size

    def load(self, root: Path, split: Split) -> Sequences:
        pixels, labels = images.cifar_split(root, split, self.val_size)
        return Sequences(labels, pixels[:, : self.max_length])


class Pathfinder(LRATask):
    """Pathfinder images as pixel tokens, 2 classes; ``difficulty`` is the release's sub-folder."""

    vocab_size = images.PIXEL_VOCAB_SIZE

    def __init__(self, difficulty: str = "curv_contour_length_14", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.difficulty = difficulty

    def load(self, root: Path, split: Split) -> Sequences:
        pixels, labels = images.read_pathfinder(root / self.difficulty, split)
        return Sequences(labels, pixels[:, : self.max_length])
