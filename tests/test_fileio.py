"""Atomic writes and the JSON-lines reader (jdml/fileio.py)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from jdml.errors import OutputPathError
from jdml.fileio import atomic_path, atomic_write, check_output_path, read_jsonl


def test_atomic_write_replaces_whole_files_and_creates_folders(tmp_path) -> None:
    target = tmp_path / "a" / "b" / "out.txt"
    atomic_write(target, "first\n")
    assert target.read_text() == "first\n"
    atomic_write(target, b"\x00second", durable=True)
    assert target.read_bytes() == b"\x00second"
    atomic_write(str(target), "line\r\nkept as given ✓")
    assert target.read_bytes() == "line\r\nkept as given ✓".encode()
    assert sorted(os.listdir(target.parent)) == ["out.txt"]  # no temporary file left


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path) -> None:
    target = tmp_path / "results.json"
    atomic_write(target, "old")
    with pytest.raises(RuntimeError, match="disk full"), atomic_path(target) as tmp:
        with open(tmp, "w") as f:
            f.write("half of the new")
        raise RuntimeError("disk full")
    assert target.read_text() == "old"
    assert os.listdir(tmp_path) == ["results.json"]


def test_atomic_path_keeps_the_suffix_writers_need(tmp_path) -> None:
    target = tmp_path / "index.npz"
    with atomic_path(target, ".npz") as tmp:
        assert tmp.endswith(".npz") and os.path.dirname(tmp) == str(tmp_path)
        np.savez(tmp, x=np.arange(3))  # np.savez would append .npz to another suffix
    with np.load(target) as data:
        np.testing.assert_array_equal(data["x"], np.arange(3))


def test_read_jsonl_skips_what_a_kill_or_an_editor_leaves(tmp_path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(
        b'{"step": 1, "loss": 0.5}\n\n[1, 2]\n{"step": 2, "loss": 0.4}\n\xff\xfe not json\n'
        b'{"step": 3, "lo'
    )
    want = [{"step": 1, "loss": 0.5}, {"step": 2, "loss": 0.4}]
    assert read_jsonl(path) == want
    with pytest.warns(UserWarning, match=r"metrics.jsonl:3: skipping a line that is not an"):
        assert read_jsonl(path, warn=True) == want
    with pytest.raises(FileNotFoundError):
        read_jsonl(tmp_path / "missing.jsonl")


def test_an_interrupted_durable_write_leaves_no_file(tmp_path, monkeypatch) -> None:
    """The glyph and emoji caches are written with durable=True: a kill during the fsync leaves
    neither the target nor a temporary."""
    from jdml import fileio

    def boom(fd: int) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(fileio.os, "fsync", boom)
    with pytest.raises(KeyboardInterrupt):
        atomic_write(tmp_path / "x" / "glyphs.npz", b"data", durable=True)
    assert list((tmp_path / "x").iterdir()) == []


def test_only_new_paths_and_regular_files_are_written(tmp_path) -> None:
    """A folder, a named pipe, a symbolic link and a device are refused in one line before
    anything is written, and stay as they were; a regular file is replaced."""
    folder = tmp_path / "folder"
    folder.mkdir()
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    outside = tmp_path / "outside.txt"
    outside.write_text("not ours")
    link = tmp_path / "link.json"
    link.symlink_to(outside)
    cases = {
        folder: r"is a folder, not a file: give the file to write, e.g. .*folder/out\.json",
        pipe: "is a named pipe, not a regular file",
        link: "is a symbolic link .*outside.txt.*remove the link",
    }
    for path, message in cases.items():
        with pytest.raises(OutputPathError, match=message):
            atomic_write(path, "new")
        assert sorted(os.listdir(tmp_path)) == ["folder", "link.json", "outside.txt", "pipe"]
    assert link.is_symlink() and outside.read_text() == "not ours"
    assert os.listdir(folder) == []
    with pytest.raises(OutputPathError, match="/dev/null is a character device"):
        check_output_path("/dev/null")  # checked only: a broken check must not write there
    regular = tmp_path / "regular.json"
    regular.write_text("old")
    atomic_write(regular, "new")
    assert regular.read_text() == "new"
    check_output_path(tmp_path / "new.json")  # a new path


def test_a_special_file_appearing_before_the_rename_is_not_replaced(tmp_path) -> None:
    target = tmp_path / "out.json"
    with pytest.raises(OutputPathError, match="named pipe"), atomic_path(target) as tmp:
        with open(tmp, "w") as f:
            f.write("new")
        os.mkfifo(target)  # another program put it there meanwhile
    assert sorted(os.listdir(tmp_path)) == ["out.json"]  # the pipe, and no temporary file


def test_a_name_near_the_limit_is_written_through_a_short_temporary(tmp_path):
    """A legal 244-byte name: the temporary file beside it would pass 255 bytes, so it takes a
    digest of the name instead, and the error-free write leaves only the target."""
    from jdml.fileio import temporary_name

    name = "r" * 244
    atomic_write(tmp_path / name, "kept")
    assert (tmp_path / name).read_text() == "kept" and os.listdir(tmp_path) == [name]
    short = temporary_name(str(tmp_path), name)
    assert short.startswith(".jdml-") and len(short) <= 255
    assert temporary_name(str(tmp_path), "run.json").startswith(".run.json.")
