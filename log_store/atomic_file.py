"""Durable file primitives: whole writes (plain and gathered), fsyncs, atomic replace of a small file.

``write_atomic`` writes ``<name>.tmp``, fsyncs it, renames it over ``<name>`` and fsyncs the directory,
so a crash at any point leaves either the old or the new content under the name, never a mix. A
left-over ``*.tmp`` is garbage and may be deleted by whoever owns the directory.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

TMP_SUFFIX = ".tmp"


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


def writev_all(fd: int, buffers: Sequence[bytes], total: int) -> None:
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


def write_atomic(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically and durably (temp file, fsync, rename, dir fsync)."""
    tmp = path.with_name(path.name + TMP_SUFFIX)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def make_dirs(path: Path) -> None:
    """Create ``path`` and missing parents, fsyncing each parent whose entries changed."""
    missing: list[Path] = []
    current = path
    while not current.exists():
        missing.append(current)
        current = current.parent
    for directory in reversed(missing):
        try:
            directory.mkdir()
        except FileExistsError:
            continue
        fsync_dir(directory.parent)
