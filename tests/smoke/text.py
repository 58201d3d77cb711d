"""Masked LM and GLUE: a small corpus in the hub's parquet layout for ``mlm`` (CPython's documentation
topics, as the LM family's), every GLUE task's files in GLUE's own layout (a few rows each, written from
the official layouts by ``tests/glue_fixtures.py``); the ``glue_tiny`` tasks generate their own.
Without a pretrained checkpoint the GLUE tasks fine-tune from random initialisation (their warning)."""

from __future__ import annotations

from pathlib import Path

TINY_TEXT = ["task.seq_len=32", "task.batch_size=4", "task.eval_batch_size=4", "trainer.num_workers=0"]
#: no pretraining run here: the experiments' pretrained_by would name one (tests/test_glue_pipeline.py
#: runs the pipeline that makes it)
GLUE = [*TINY_TEXT, "backbone.model.pretrained=null"]
GLUE_TASKS = ("cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte", "wnli")

OVERRIDES = {
    "mlm": [
        *TINY_TEXT,
        "task.vocab_size=300",
        "task.val_fraction=0.1",
        "trainer.accumulate=1",
        "trainer.precision=fp32",
    ],  # fmt: skip
    "mlm_tiny": TINY_TEXT,
    **{f"glue_{t}": [*GLUE, "task.vocab_size=200"] for t in GLUE_TASKS},
    "glue_tiny_sst2": GLUE,
    "glue_tiny_rte": GLUE,
}
#: the full-size Crammed BERT (120M parameters) trains its two steps on the embedded pretraining only;
#: on the other tasks, whose data paths the micro model covers, it composes
FULL_SIZE_TRAINS_ON = ["mlm_tiny"]


def prepare(data_dir: Path) -> None:
    from glue_fixtures import write_official

    from smoke.lm import documents, write_parquet

    train, _ = documents()
    write_parquet(data_dir / "wikipedia" / "20231101.en", {"train": train})
    write_official(data_dir)
