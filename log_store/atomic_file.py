"""Durable file primitives: whole writes (plain and gathered), fsyncs, atomic replace of a small file.

``start_writeback`` asks the kernel to start writing a file's dirty pages now (Linux
``sync_file_range(SYNC_FILE_RANGE_WRITE)``, through ``ctypes``; a no-op elsewhere). It is only a hint
that makes no promise of its own: durability still comes from ``fdatasync``. The writer uses it to have
every file of a group written out (and, on ext4, its blocks allocated) from one thread before the
files' ``fdatasync`` calls run concurrently, so that they tend to share one journal commit, and, inside
a large group, every few megabytes, so that the disk works while the group is still being written.

Every file and directory the log creates is its owner's only (:data:`FILE_MODE`, :data:`DIR_MODE`),
whatever the process umask: the records are full source rows (emails, addresses). :func:`create_file`
and :func:`make_dirs` set the mode explicitly after creating, since the umask can only take bits away
from what ``open``/``mkdir`` ask for, and a umask such as 0o000 would leave them readable by everyone.

``write_atomic`` writes ``<name>.tmp``, fsyncs it, renames it over ``<name>`` and fsyncs the directory,
so a crash at any point leaves either the old or the new content under the name, never a mix. A
left-over ``*.tmp`` is garbage and may be deleted by whoever owns the directory.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import cast

TMP_SUFFIX = ".tmp"
#: Mode of every file of the log: read and write for its owner only.
FILE_MODE = 0o600
#: Mode of every directory of the log: its owner only (others cannot even list or traverse it).
DIR_MODE = 0o700


def create_file(path: Path, flags: int) -> int:
    """``os.open(path, flags | O_CREAT)`` with the file's mode :data:`FILE_MODE` whatever the umask.

    The mode of a file that already existed is set too when this process owns it (a lock file opened
    again, say), so a log written before this rule comes into line.
    """
    fd = os.open(path, flags | os.O_CREAT, FILE_MODE)
    try:
        stat = os.fstat(fd)
        if stat.st_mode & 0o777 != FILE_MODE and stat.st_uid == os.geteuid():
            os.fchmod(fd, FILE_MODE)
    except BaseException:
        os.close(fd)
        raise
    return fd


def fsync_dir(path: Path) -> None:
    """Make the directory entries of ``path`` (creations, renames, deletions) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes | memoryview) -> None:
    """Write every byte of ``data`` at the file's current position (handles short writes)."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


#: Buffers handed to one ``writev`` call (the kernel's ``IOV_MAX`` is 1024 on Linux).
_IOV_MAX = 1024


def writev_all(fd: int, buffers: Sequence[bytes | memoryview], total: int) -> None:
    """Write ``buffers`` back to back at the file's current position (``total`` bytes; short writes are
    finished with plain writes)."""
    for first in range(0, len(buffers), _IOV_MAX):
        chunk = buffers[first : first + _IOV_MAX]
        want = total if len(buffers) <= _IOV_MAX else sum(map(len, chunk))
        written = os.writev(fd, chunk)
        if written == want:
            continue
        for buffer in chunk:  # a short write: finish the rest buffer by buffer
            if written >= len(buffer):
                written -= len(buffer)
                continue
            write_all(fd, memoryview(buffer)[written:])
            written = 0


_SYNC_FILE_RANGE_WRITE = 2


def _sync_file_range() -> Callable[[int, int, int, int], int] | None:
    """libc's ``sync_file_range``, or ``None`` where there is none."""
    try:
        function = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    function.restype = ctypes.c_int
    return cast("Callable[[int, int, int, int], int]", function)


_SYNC_RANGE = _sync_file_range()


def start_writeback(fd: int) -> None:
    """Start writing ``fd``'s dirty pages to the disk without waiting (a hint, see the module
    docstring; errors are left to the ``fdatasync`` that follows)."""
    if _SYNC_RANGE is not None:
        _SYNC_RANGE(fd, 0, 0, _SYNC_FILE_RANGE_WRITE)


def write_atomic(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically and durably (temp file, fsync, rename, dir fsync)."""
    tmp = path.with_name(path.name + TMP_SUFFIX)
    fd = create_file(tmp, os.O_WRONLY | os.O_TRUNC)
    try:
        write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def make_dirs(path: Path) -> None:
    """Create ``path`` and missing parents (mode :data:`DIR_MODE`), fsyncing each parent whose entries
    changed."""
    missing: list[Path] = []
    current = path
    while not current.exists():
        missing.append(current)
        current = current.parent
    for directory in reversed(missing):
        try:
            directory.mkdir(DIR_MODE)
        except FileExistsError:
            continue
        os.chmod(directory, DIR_MODE)  # exactly, whatever the umask
        fsync_dir(directory.parent)
