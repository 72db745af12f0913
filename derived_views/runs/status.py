"""What a view table is as of, read from its Delta commit metadata without starting Spark.

A view is a directory under ``CDC_DATA_DIR`` (``warehouse``, ``search``, ``cache``) holding Delta tables;
each table's newest commit that carries :class:`~derived_views.engine.progress.Progress` says which log offsets
and which watermark it has applied, moved on by its position file while it had nothing to apply
(:mod:`derived_views.engine.positions`). Reading uses the ``deltalake`` library. Which tables a view
must have is :func:`derived_views.runs.listing.view_tables`.
"""

from __future__ import annotations

import logging
from pathlib import Path

from derived_views.engine.positions import local_position
from derived_views.engine.progress import Progress

log = logging.getLogger("cdc.views")


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
