"""What every view is as of, read from its Delta tables' commit metadata without starting Spark.

A view is a directory under ``CDC_DATA_DIR`` (``warehouse``, ``search``, ``cache``) holding Delta tables;
each table's newest commit that carries :class:`~derived_views.engine.progress.Progress` says which log offsets
and which watermark it has applied. Tables that never carried progress (a dead-letter table, say) are
not views of the log and are left out. Reading uses the ``deltalake`` library, which reads the same
table on local disk or object storage.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Protocol

from derived_views.engine.positions import local_position
from derived_views.engine.progress import Progress

log = logging.getLogger("cdc.views")


class _HasDataDir(Protocol):
    @property
    def data_dir(self) -> Path: ...


def delta_tables(root: Path) -> list[Path]:
    """Delta tables below ``root`` (a directory with a ``_delta_log`` child), not nested in another."""
    found: list[Path] = []
    if not root.is_dir():
        return found
    for log_dir in sorted(root.rglob("_delta_log")):
        table = log_dir.parent
        if not any(parent in found for parent in table.parents):
            found.append(table)
    return found


def table_progress(path: Path) -> Progress | None:
    """What the table is as of: its newest commit's progress, moved on by its position file when a step
    had nothing to apply to it since (:mod:`derived_views.engine.positions`); None when neither records any."""
    return local_position(str(path))


def readable_progress(path: Path) -> Progress | None:
    """:func:`table_progress`, or ``None`` (with a warning) for a table its reader cannot open: a
    damaged table must not hide what every other table is as of."""
    try:
        return table_progress(path)
    except Exception as exc:  # noqa: BLE001 - deltalake raises its own error kinds for a damaged log
        log.warning("cannot read the progress of the Delta table %s: %s", path, str(exc).splitlines()[0])
        return None


def view_directory(data_dir: Path, view: str) -> Path:
    """The directory of a view's tables: ``search.products`` lives in ``search/products``; ``search``
    alone is every search index."""
    return data_dir.joinpath(*view.split(".", 1))


def view_progress(settings: _HasDataDir, views: tuple[str, ...] = ("warehouse", "search", "cache")) -> dict[str, list[Progress]]:
    """Per view name (``warehouse``, ``search.<index>``, ``cache.<entity>``, or a whole kind), the progress
    of each of its tables that consumes the log (tables that cannot be read are left out, with a warning)."""
    out: dict[str, list[Progress]] = {}
    for view in views:
        progresses = [p for p in (readable_progress(t) for t in delta_tables(view_directory(settings.data_dir, view))) if p]
        if progresses:
            out[view] = progresses
    return out


def view_as_of_lsn(settings: _HasDataDir, view: str) -> int | None:
    """The commit LSN the whole view is as of (its least advanced table); None before its first sync."""
    progresses = view_progress(settings, (view,)).get(view)
    if not progresses:
        return None
    return min(progress.lsn for progress in progresses)
