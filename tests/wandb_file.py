"""Reading an offline W&B run's ``run-*.wandb`` file, for the tests that check what a run sent
(every dashboard panel's key, the summary). wandb 0.31 ships no reader for it in Python."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any


def offline_run(wandb_file: Path) -> tuple[set[str], dict[str, Any]]:
    """The history keys and the final summary of an offline run's ``run-*.wandb`` file: a
    LevelDB-style log (7-byte header, 32 KiB blocks of CRC, length, type chunks) of W&B's
    ``Record`` protobufs, the file ``wandb sync`` uploads."""
    from wandb.proto import wandb_internal_pb2 as pb

    keys: set[str] = set()
    summary: dict[str, Any] = {}
    for record in _records(Path(wandb_file).read_bytes(), pb.Record):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            keys |= {item.key or ".".join(item.nested_key) for item in record.history.item}
        elif kind == "summary":
            for item in record.summary.update:
                summary[item.key or ".".join(item.nested_key)] = json.loads(item.value_json)
    return {k for k in keys if not k.startswith("_")}, summary


def _records(data: bytes, record_type: type) -> Any:
    """The protobuf records of a ``.wandb`` file's bytes ``data``."""
    if data[:4] != b":W&B":
        raise ValueError("not a W&B run file (no ':W&B' header)")
    block, pos, pending = 32768, 7, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if left < 7 or (length == 0 and kind == 0):  # the block's zero-padded tail
            pos += left
            continue
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a whole record, or the last chunk of one
            record = record_type()
            record.ParseFromString(pending)
            pending = b""
            yield record


def offline_records(wandb_file: Path) -> dict[str, Any]:
    """What else an offline run's file says: ``run`` (its id, ``job_type``, ``group`` and
    ``config``, flat keys with JSON values decoded) and ``artifacts`` (each logged artifact's
    ``name``, ``type``, ``aliases`` and ``metadata``), in the order they were logged."""
    from wandb.proto import wandb_internal_pb2 as pb

    run: dict[str, Any] = {"config": {}}
    artifacts: list[dict[str, Any]] = []
    for record in _records(Path(wandb_file).read_bytes(), pb.Record):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            r = record.run
            run.update(id=r.run_id, job_type=r.job_type, group=r.run_group)
            run["config"].update({i.key: json.loads(i.value_json) for i in r.config.update if i.key})
        elif kind == "config":
            run["config"].update({i.key: json.loads(i.value_json) for i in record.config.update if i.key})
        elif kind == "artifact":
            a = record.artifact
            meta = json.loads(a.metadata) if a.metadata else {}
            artifacts.append(dict(name=a.name, type=a.type, aliases=list(a.aliases), metadata=meta))
    return {"run": run, "artifacts": artifacts}
