"""One suite, two `FileSystem`s: `OsFileSystem` (the real one) and `SimFileSystem` (the
fault-injecting seam the crash tests use, with no fault scripted). Both run on a temporary
directory and must behave alike: creating and opening, absolute-offset reads and writes,
sizes, truncation, syncs, listing, existence, removal, directory creation, the data
directory lock and crash points. (The interface has no rename: the engine never renames.)"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from magnetar.storage import FileSystem, OsFileSystem
from magnetar.storage.testing.simfs import SimFileSystem

BAD_FD = rf"\[Errno {errno.EBADF}\]"
FACTORIES: list[Callable[[], FileSystem]] = [OsFileSystem, lambda: SimFileSystem(seed=3)]


@pytest.fixture(params=FACTORIES, ids=["os", "sim"])
def fs(request: pytest.FixtureRequest) -> FileSystem:
    made: FileSystem = request.param()
    return made


def test_a_created_file_reads_back_what_was_written_at_absolute_offsets(
        fs: FileSystem, tmp_path: Path) -> None:
    path = str(tmp_path / "f")
    handle = fs.open(path, create=True)
    try:
        assert handle.path == path
        assert handle.size() == 0
        handle.pwrite(b"hello world", 0)
        handle.pwrite(bytearray(b"W"), 6)
        handle.pwrite(memoryview(b"!!"), 11)
        assert handle.size() == 13
        assert handle.pread(13, 0) == b"hello World!!"
        assert handle.pread(5, 6) == b"World"
        assert handle.pread(100, 10) == b"d!!"  # short at the end of the file
        assert handle.pread(10, 50) == b""  # beyond the end
    finally:
        handle.close()


def test_a_write_past_the_end_leaves_a_hole_of_zeros(fs: FileSystem, tmp_path: Path) -> None:
    handle = fs.open(str(tmp_path / "f"), create=True)
    try:
        handle.pwrite(b"ab", 0)
        handle.pwrite(b"z", 5)
        assert handle.size() == 6
        assert handle.pread(6, 0) == b"ab\x00\x00\x00z"
    finally:
        handle.close()


def test_writes_are_visible_to_another_handle_at_once(fs: FileSystem, tmp_path: Path) -> None:
    path = str(tmp_path / "f")
    writer = fs.open(path, create=True)
    reader = fs.open_read(path)
    try:
        writer.pwrite(b"unsynced", 0)
        assert reader.pread(8, 0) == b"unsynced"
        assert reader.size() == 8
        writer.fdatasync()
        writer.fsync()
        fs.fsync_dir(str(tmp_path))
        assert reader.pread(8, 0) == b"unsynced"
    finally:
        writer.close()
        reader.close()


def test_opening_without_create_needs_the_file(fs: FileSystem, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        fs.open(str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError):
        fs.open_read(str(tmp_path / "missing"))
    assert not fs.exists(str(tmp_path / "missing"))


def test_reopening_keeps_the_contents(fs: FileSystem, tmp_path: Path) -> None:
    path = str(tmp_path / "f")
    first = fs.open(path, create=True)
    first.pwrite(b"kept", 0)
    first.fdatasync()
    first.close()
    for handle in (fs.open(path), fs.open(path, create=True), fs.open_read(path)):
        try:
            assert handle.pread(4, 0) == b"kept"
        finally:
            handle.close()


def test_truncate_shrinks_and_grows_with_zeros(fs: FileSystem, tmp_path: Path) -> None:
    handle = fs.open(str(tmp_path / "f"), create=True)
    try:
        handle.pwrite(b"0123456789", 0)
        handle.truncate(4)
        assert handle.size() == 4
        assert handle.pread(10, 0) == b"0123"
        handle.truncate(6)
        assert handle.pread(10, 0) == b"0123\x00\x00"
    finally:
        handle.close()


def test_a_read_only_handle_refuses_writes(fs: FileSystem, tmp_path: Path) -> None:
    path = str(tmp_path / "f")
    fs.open(path, create=True).close()
    handle = fs.open_read(path)
    try:
        with pytest.raises(OSError, match=BAD_FD):
            handle.pwrite(b"x", 0)
        assert handle.size() == 0
    finally:
        handle.close()


def test_a_closed_handle_refuses_io_and_closing_twice_is_fine(fs: FileSystem,
                                                              tmp_path: Path) -> None:
    handle = fs.open(str(tmp_path / "f"), create=True)
    handle.close()
    handle.close()
    with pytest.raises(OSError, match=BAD_FD):
        handle.pread(1, 0)


def test_listing_existence_and_removal(fs: FileSystem, tmp_path: Path) -> None:
    directory = str(tmp_path / "d")
    fs.makedirs(directory)
    for name in ("b", "a", "c"):
        fs.open(os.path.join(directory, name), create=True).close()
    fs.makedirs(os.path.join(directory, "sub"))
    assert fs.listdir(directory) == ["a", "b", "c", "sub"]  # sorted, directories too
    assert fs.exists(os.path.join(directory, "b"))
    fs.remove(os.path.join(directory, "b"))
    assert not fs.exists(os.path.join(directory, "b"))
    assert fs.listdir(directory) == ["a", "c", "sub"]
    with pytest.raises(FileNotFoundError):
        fs.remove(os.path.join(directory, "b"))
    with pytest.raises(FileNotFoundError):
        fs.listdir(str(tmp_path / "nowhere"))


def test_makedirs_makes_parents_and_is_idempotent(fs: FileSystem, tmp_path: Path) -> None:
    nested = str(tmp_path / "x" / "y" / "z")
    fs.makedirs(nested)
    fs.makedirs(nested)
    assert fs.exists(nested)
    assert fs.listdir(nested) == []
    fs.fsync_dir(nested)


def test_the_lock_is_exclusive_names_its_owner_and_can_be_taken_again(
        fs: FileSystem, tmp_path: Path) -> None:
    path = str(tmp_path / "LOCK")
    held = fs.lock(path)
    try:
        assert Path(path).read_text().strip() == str(os.getpid())
        with pytest.raises(BlockingIOError) as caught:
            fs.lock(path)
        assert getattr(caught.value, "owner_pid", None) == os.getpid()
    finally:
        held.release()
    held.release()  # releasing twice is fine
    again = fs.lock(path)
    again.release()


def test_crash_points_do_nothing_when_no_crash_is_scripted(fs: FileSystem,
                                                           tmp_path: Path) -> None:
    handle = fs.open(str(tmp_path / "f"), create=True)
    try:
        fs.point("checkpoint:begin")
        handle.pwrite(b"still alive", 0)
        assert handle.pread(5, 0) == b"still"
    finally:
        handle.close()
