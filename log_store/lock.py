"""Process locks on lock files: ``writer.lock`` (one writer) and ``cleaner.lock`` (one cleaner).

A lock is an exclusive, non-blocking ``fcntl.flock`` on the lock file, held for as long as the file
descriptor is open; the kernel releases it when the holder exits, however it exits, so a stale lock
file never blocks anyone. After taking the lock the holder writes its pid into the file (for the error
message of the next contender); the file is never deleted (deleting lock files races with contenders).
``flock`` locks belong to the open file description, so two opens in one process also exclude each
other. Not for network file systems.
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

from log_store.atomic_file import create_file
from log_store.errors import LogLockedError


def holder_pid(path: Path) -> int | None:
    """The pid written in a lock file, if it holds one."""
    try:
        text = path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return int(text) if text.isdigit() else None


class FileLock:
    """An exclusive lock on one file; raises ``error_type`` naming the holder when it is taken."""

    def __init__(self, path: Path, error_type: type[LogLockedError] = LogLockedError) -> None:
        self.path = path
        self._error_type = error_type
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        """Whether this object holds the lock."""
        return self._fd is not None

    def acquire(self, *, blocking: bool = False) -> None:
        """Take the lock, or raise ``error_type`` at once (blocking=False) when another holds it."""
        if self._fd is not None:
            return
        fd = create_file(self.path, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise self._error_type(self.path, holder_pid(self.path)) from None
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
        self._fd = fd

    def try_acquire(self) -> bool:
        """Take the lock if free; ``False`` when another holds it."""
        try:
            self.acquire()
        except LogLockedError:
            return False
        return True

    def release(self) -> None:
        """Release the lock (idempotent)."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def __enter__(self) -> FileLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
