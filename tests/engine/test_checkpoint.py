"""Checkpoints: RNG states round-trip, writes are atomic, loads are weights-only."""

from __future__ import annotations

import errno
import os
import random

import numpy as np
import pytest
import torch

from src.engine.record import checkpoint


def draws():
    return random.random(), np.random.rand(), torch.rand(()).item(), np.random.randn()


def test_rng_states_round_trip_through_a_weights_only_file(tmp_path):
    torch.manual_seed(0), np.random.seed(0), random.seed(0)
    np.random.randn()  # leaves a cached Gaussian in NumPy's state
    checkpoint.save({"rng": checkpoint.rng_state()}, tmp_path / "last.pt")
    expected = draws()
    checkpoint.set_rng_state(checkpoint.load(tmp_path / "last.pt")["rng"])
    assert draws() == expected


def test_a_failed_write_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "last.pt"
    checkpoint.save({"step": 1}, path)

    def broken_save(obj, f):
        f.write(b"partial")
        raise OSError("No space left on device")

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(checkpoint.CheckpointError, match="No space left on device.*last.pt is kept"):
        checkpoint.save({"step": 2}, path)
    assert checkpoint.load(path)["step"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt"]  # no temporary left


def test_the_previous_checkpoint_is_set_aside_only_once_the_new_one_is_on_disk(tmp_path, monkeypatch):
    """A write that fails at its fsync (a full disk found at the flush) leaves the rotation alone."""
    path = tmp_path / "last.pt"
    checkpoint.save({"step": 1}, path)
    checkpoint.save({"step": 2}, path)

    def disk_full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(checkpoint.CheckpointError, match="No space left on device.*last.pt is kept"):
        checkpoint.save({"step": 3}, path)
    assert checkpoint.load(path)["step"] == 2 and checkpoint.load(tmp_path / "previous.pt")["step"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt", "previous.pt"]


def test_loading_refuses_arbitrary_objects(tmp_path):
    torch.save({"evil": object()}, tmp_path / "bad.pt")
    with pytest.raises(Exception, match="[Ww]eights only"):
        checkpoint.load(tmp_path / "bad.pt")
