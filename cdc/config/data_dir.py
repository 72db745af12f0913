"""``CDC_DATA_DIR`` is its owner's only: it holds full source rows (emails, addresses).

The log makes each of its own files 0600 and directories 0700 whatever the umask
(:mod:`log_store.atomic_file`). The Delta tables of the views are written by Spark (Hadoop's local
filesystem), which creates files and directories by the umask, typically 0644 and 0755; rather than
chmod every file Spark writes, the data directory above them is made 0700, so that no other user can
traverse into it, whatever the modes below. A data directory that already lets others in (created by
hand, say) is narrowed to its owner, once, with a warning, when this process owns it.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

from log_store.atomic_file import DIR_MODE, make_dirs
from log_store.errors import StorageIOError

log = logging.getLogger("cdc.data_dir")


def secure_data_dir(data_dir: Path) -> None:
    """Create ``data_dir`` (mode 0700) if missing, and take group and other access away from it.

    Raises :class:`StorageIOError` when the disk refuses; a path that is not a directory is left for the
    caller's first use of it to report.
    """
    try:
        make_dirs(data_dir)
        info = data_dir.stat()
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
            return
        mode = stat.S_IMODE(info.st_mode)
        if mode & ~DIR_MODE & 0o777:
            os.chmod(data_dir, mode & DIR_MODE)
            log.warning(
                "data directory %s was mode %o, others could read the rows under it: now %o", data_dir, mode, mode & DIR_MODE
            )
    except NotADirectoryError:
        return
    except OSError as exc:
        raise StorageIOError(data_dir, exc) from exc
