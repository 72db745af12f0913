"""Whether a one-shot run is small enough for a driver JVM that compiles with C1 alone.

The reasons and measurements are in :mod:`derived_views.engine.driver_jit`; this module decides, from
the log's offsets and the view tables' progress and size alone (no Spark), whether a run is small:
at most :data:`~derived_views.engine.evaluation.SMALL_BATCH_EVENTS` events pending, and view tables
small on local disk (:func:`~derived_views.engine.evaluation.small_tables`). A log in Kafka is never small.
"""

from __future__ import annotations

import logging
from pathlib import Path

from derived_views.engine.evaluation import SMALL_BATCH_EVENTS, small_tables
from derived_views.engine.progress import Progress, min_offsets
from derived_views.runs.status import delta_tables, table_progress
from derived_views.source.as_of import pending_events
from derived_views.source.log_location import LogLocation
from derived_views.source.log_source import read_watermark

log = logging.getLogger("cdc.views")


def pending_everywhere(location: LogLocation, tables: list[Path], prefix: str) -> int | None:
    """Events of the source tables' topics (``prefix``) up to the log's latest watermark not yet applied
    by the view table furthest behind on each log partition, over the Delta ``tables`` (every event of a
    topic no table has applied yet); ``None`` when the log cannot be read here (the run itself then says why)."""
    try:
        watermark = read_watermark(location)
    except Exception as exc:  # noqa: BLE001 - only a hint: the run reports what is wrong with the log
        log.debug("no estimate of the pending work: %s", exc)
        return None
    if watermark is None:
        return 0
    progresses = [progress for progress in map(_quiet_progress, tables) if progress is not None]
    pending = 0
    for topic in watermark.offsets:
        if topic.startswith(f"{prefix}.__"):
            continue  # the log's own topics (the schemas, the snapshot ledger): no view applies them
        applying = [progress for progress in progresses if topic in progress.offsets]
        pending += pending_events(watermark, [topic], Progress(min_offsets(applying, [topic])))
    return pending


def _quiet_progress(table: Path) -> Progress | None:
    """The table's progress; ``None`` for a table that cannot be read (its own step reports it)."""
    try:
        return table_progress(table)
    except Exception:  # noqa: BLE001 - deltalake raises its own error kinds for a damaged log
        return None


def short_run(location: LogLocation, views_dir: Path, prefix: str) -> bool:
    """Whether a one-shot run over the log at ``location`` (topics named with ``prefix``) into the views
    under ``views_dir`` is small enough to compile with C1 alone (see the module docstring)."""
    if location.kafka is not None:
        return False
    tables = delta_tables(views_dir)
    pending = pending_everywhere(location, tables, prefix)
    return pending is not None and pending <= SMALL_BATCH_EVENTS and small_tables(str(table) for table in tables)
