"""The local disk under ``CDC_DATA_DIR`` refused a file operation: one line naming the path, the cause and the fix.

A full disk, permission bits the running user does not pass, a read-only filesystem or a file where a
directory belongs are not bugs of the pipeline: the user fixes them outside it and runs the command
again. The log reports them as :class:`log_store.errors.StorageIOError`; other code's plain
:class:`OSError` gets the same explanation from :func:`storage_error`.

For capture the line also says what the source was told, because that is what makes running it again
safe: the slot is confirmed only after the log has fsynced every event up to the confirmed commit
(:mod:`cdc.run.coordinator`), so a write that failed was never confirmed, and the slot resends it.
"""

from __future__ import annotations

from pathlib import Path

from cdc.capture.lsn import Lsn
from cdc.errors import CdcError
from log_store.errors import StorageIOError, process_user


class StorageError(CdcError):
    """A file or directory under ``CDC_DATA_DIR`` cannot be used; the message names path, cause and fix."""

    exit_code = 5


def _fix(problem: StorageIOError, data_dir: Path) -> str:
    if problem.cause.startswith("is a file") and problem.path in (data_dir, *data_dir.parents):
        return f"point CDC_DATA_DIR at a directory (it is created if missing), or move {problem.path} away"
    if problem.cause.startswith("permission denied"):
        user = process_user()
        return (
            f"make {data_dir} and everything below it writable by {user} (`chown -R {user} {data_dir}`), "
            "or run cdc as the user that owns it"
        )
    return problem.fix


def storage_error(error: OSError | StorageIOError, data_dir: Path, doing: str) -> StorageError:
    """The :class:`StorageError` for ``error`` met while ``doing`` something below ``data_dir``."""
    problem = error if isinstance(error, StorageIOError) else StorageIOError(data_dir, error)
    return StorageError(f"{doing}: {problem.what}; {_fix(problem, data_dir)}")


def capture_storage_error(error: StorageIOError, data_dir: Path, position: Lsn | None) -> StorageError:
    """The :class:`StorageError` of a capture run stopped by ``error``, saying what the source was told.

    ``position``: the log's watermark position (every transaction committed at or before it is in the
    log, see :mod:`cdc.run.coordinator`), ``Lsn(0)`` before a complete snapshot, ``None`` when the log was
    never opened.
    """
    if position is None:
        told = "nothing was confirmed to the source (nothing was read from it)"
        resume = "it starts from the log as it was"
    elif position == 0:
        told = "the initial snapshot did not complete and nothing was confirmed to the source"
        resume = "it takes the snapshot again"
    else:
        told = (
            f"nothing was confirmed to the source past LSN {Lsn(position + 1)}, the end of what the "
            "log holds (the slot is confirmed only after the log fsyncs)"
        )
        resume = "the slot resends everything after that"
    return StorageError(
        f"capture stopped, the log cannot be written: {error.what}; {told}; "
        f"{_fix(error, data_dir)}, then run `cdc capture` again: {resume}"
    )
