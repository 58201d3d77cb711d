"""The one atomic writer: a crash between the write and the rename leaves the old content and no
temporary file; the file is fsynced before the rename and the folder after; concurrent writers
leave one whole content."""

from __future__ import annotations

import errno
import multiprocessing
import os
from pathlib import Path

import pytest
from conftest import recorded_fsyncs_and_renames

from src.engine.record import atomic


def test_bytes_and_text_round_trip_with_no_temporary_left(tmp_path):
    data = bytes(range(256)) * 3
    atomic.write_bytes(tmp_path / "data.bin", data)
    atomic.write_text(tmp_path / "notes.md", "héllo\nworld\n")
    assert (tmp_path / "data.bin").read_bytes() == data
    assert (tmp_path / "notes.md").read_bytes() == "héllo\nworld\n".encode()  # utf-8, no \r\n
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.bin", "notes.md"]


def test_a_streaming_writer_replaces_the_file_whole(tmp_path):
    path = tmp_path / "state.pt"
    path.write_bytes(b"old")
    with atomic.writing(path) as handle:
        handle.write(b"new ")
        assert path.read_bytes() == b"old"  # nothing in place until the block ends
        handle.write(b"content")
    assert path.read_bytes() == b"new content"


def test_a_crash_before_the_rename_leaves_the_old_content_and_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "summary.json"
    path.write_text('{"status": "completed"}\n')

    def crash(src, dst):
        raise OSError("killed between the write and the rename")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="killed"):
        atomic.write_text(path, "{}")
    assert path.read_text() == '{"status": "completed"}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]


def test_an_error_in_the_writer_leaves_the_old_content_and_no_temporary(tmp_path):
    path = tmp_path / "last.pt"
    path.write_bytes(b"old")
    with pytest.raises(RuntimeError, match="short write"), atomic.writing(path) as handle:
        handle.write(b"half")
        raise RuntimeError("short write")
    assert path.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt"]


def test_the_file_is_fsynced_before_the_rename_and_the_folder_after(tmp_path, monkeypatch):
    events = recorded_fsyncs_and_renames(monkeypatch, lambda src, dst: dst)
    path = tmp_path / "manifest.json"
    atomic.write_text(path, "{}")
    (synced, tmp), (renamed, target), (folder_synced, folder) = events
    assert (synced, renamed, folder_synced) == ("fsync", "rename", "fsync")
    assert Path(tmp).parent == tmp_path and Path(tmp).name.startswith(".manifest.json.")
    assert Path(tmp).name.endswith(".tmp") and target == str(path) and folder == str(tmp_path)


def test_before_replace_runs_once_the_new_content_is_on_disk(tmp_path, monkeypatch):
    """A checkpoint sets its predecessor aside there: after the fsync, before the rename."""
    events: list[str] = []
    fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append("fsync"), fsync(fd))[1])
    path = tmp_path / "last.pt"
    path.write_bytes(b"old")
    with atomic.writing(path, before_replace=lambda: events.append(f"aside {path.read_bytes()}")) as f:
        f.write(b"new")
    assert events == ["fsync", "aside b'old'", "fsync"] and path.read_bytes() == b"new"


def test_temporary_names_differ_between_calls_and_stay_hidden_and_skippable(tmp_path):
    names = {atomic.temporary_name(tmp_path / "results.json").name for _ in range(50)}
    assert len(names) == 50
    assert all(n.startswith(f".results.json.{os.getpid()}.") and n.endswith(".tmp") for n in names)
    assert atomic.temporary_name(tmp_path / ".lock").name.startswith(".lock.")  # no second dot


def write_many(path: str, fill: int, times: int) -> None:
    for _ in range(times):
        atomic.write_bytes(Path(path), bytes([fill]) * 200_000)


def test_two_processes_writing_one_path_leave_one_whole_content(tmp_path):
    path = tmp_path / "shared.bin"
    context = multiprocessing.get_context("fork")
    writers = [context.Process(target=write_many, args=(str(path), fill, 20)) for fill in (1, 2)]
    for writer in writers:
        writer.start()
    seen = set()
    while any(w.is_alive() for w in writers):
        if path.exists():
            data = path.read_bytes()
            seen.add((len(data), frozenset(data)))
    for writer in writers:
        writer.join()
        assert writer.exitcode == 0
    data = path.read_bytes()
    assert len(data) == 200_000 and len(set(data)) == 1 and data[0] in (1, 2)
    assert seen <= {(200_000, frozenset({1})), (200_000, frozenset({2}))}  # never torn, never mixed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shared.bin"]


def test_files_written_together_are_all_on_disk_before_any_is_renamed(tmp_path, monkeypatch):
    events: list[str] = []
    fsync, replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append("fsync"), fsync(fd))[1])
    monkeypatch.setattr(
        os, "replace", lambda src, dst: (events.append(f"rename {Path(dst).name}"), replace(src, dst))[1]
    )
    atomic.write_together({tmp_path / "report.md": b"# report\n", tmp_path / "results.json": b"[]\n"})
    assert events == ["fsync", "fsync", "rename report.md", "rename results.json", "fsync"]  # the folder last
    assert (tmp_path / "report.md").read_bytes() == b"# report\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.md", "results.json"]


def test_a_failure_writing_one_of_files_together_changes_none_and_names_its_target(tmp_path, monkeypatch):
    old = {tmp_path / "report.md": b"old report\n", tmp_path / "results.json": b"[1]\n"}
    for path, data in old.items():
        path.write_bytes(data)
    fsync, calls = os.fsync, []

    def second_fails(fd: int) -> None:
        calls.append(fd)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        fsync(fd)

    monkeypatch.setattr(os, "fsync", second_fails)
    with pytest.raises(OSError, match="No space left on device") as failed:
        atomic.write_together({path: b"new" for path in old})
    assert failed.value.errno == errno.ENOSPC and failed.value.filename == str(tmp_path / "results.json")
    assert {path: path.read_bytes() for path in old} == old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.md", "results.json"]


def test_a_folder_where_a_file_goes_is_refused_before_anything_is_written(tmp_path):
    (tmp_path / "results.json").mkdir()
    with pytest.raises(IsADirectoryError) as refused:
        atomic.write_together({tmp_path / "report.md": b"new", tmp_path / "results.json": b"[]"})
    assert refused.value.filename == str(tmp_path / "results.json")
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]
