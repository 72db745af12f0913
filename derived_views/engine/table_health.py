"""How healthy a view table is, read without Spark: its files, size, versions and last maintenance.

Read with ``deltalake`` from the table's Delta log (its newest version's files, and the newest commits'
operations), plus the table's maintenance record: ``<table>/_cdc_maintenance.json``, written after each
compaction and vacuum (:mod:`derived_views.engine.maintenance`), which says when each last ran and at
which version the table was last compacted. Delta readers and ``VACUUM`` leave files whose names start
with ``_`` alone. A table on object storage keeps no record: its last compaction is looked up in its
newest commits instead.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from derived_views.engine.delta_sql import is_local

#: The record's name inside the table's directory.
MAINTENANCE_FILE = "_cdc_maintenance.json"

#: Delta's name of a compaction in a commit's ``operation``.
OPTIMIZE = "OPTIMIZE"


@dataclass(frozen=True)
class TableHealth:
    """One table's files (``small``: those under the small-file size), bytes, version and maintenance."""

    path: str
    files: int
    small_files: int
    bytes: int
    version: int
    versions_since_compaction: int
    """Commits since the table was last compacted (since it was created when it never was)."""
    compacted_at: str | None
    vacuumed_at: str | None

    @property
    def last_maintenance_at(self) -> str | None:
        """When the table was last compacted or vacuumed (ISO 8601 in UTC; ``None``: never)."""
        done = [moment for moment in (self.compacted_at, self.vacuumed_at) if moment]
        return max(done) if done else None

    def seconds_since_maintenance(self, now: float) -> float | None:
        """Seconds from its last maintenance to ``now`` (a POSIX time; ``None``: never maintained)."""
        last = self.last_maintenance_at
        return None if last is None else max(0.0, now - datetime.fromisoformat(last).timestamp())


def _record_file(path: str) -> Path | None:
    return Path(path.removeprefix("file://")) / MAINTENANCE_FILE if is_local(path) else None


def maintenance_record(path: str) -> dict[str, Any]:
    """The table's maintenance record (empty when it has none or it cannot be read)."""
    file = _record_file(path)
    if file is None or not file.is_file():
        return {}
    try:
        data = json.loads(file.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def record_maintenance(path: str, **done: Any) -> None:
    """Add ``done`` (``compacted_at``/``compacted_version``, ``vacuumed_at``, a purge's ``purged_at``) to the
    table's record."""
    file = _record_file(path)
    if file is None:
        return
    data = {**maintenance_record(path), **done}
    temporary = file.with_name(f"{MAINTENANCE_FILE}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(data, sort_keys=True))
    os.replace(temporary, file)


def table_health(path: str, small_file_bytes: int, lookback: int = 1000) -> TableHealth:
    """The health of the Delta table at ``path``; a file under ``small_file_bytes`` counts as small. With
    no record of its last compaction, the newest ``lookback`` commits are searched for one."""
    from deltalake import DeltaTable

    table = DeltaTable(path.removeprefix("file://"))
    sizes = table.get_add_actions(flatten=True).column("size_bytes").to_pylist()
    version = int(table.version())
    record = maintenance_record(path)
    compacted = record.get("compacted_version")
    if compacted is None:
        for commit in table.history(lookback):
            if commit.get("operation") == OPTIMIZE:
                compacted = max(int(commit.get("version", -1)), compacted if compacted is not None else -1)
    since = version - int(compacted) if compacted is not None else version + 1
    return TableHealth(
        path,
        len(sizes),
        sum(1 for size in sizes if size < small_file_bytes),
        int(sum(sizes)),
        version,
        since,
        record.get("compacted_at"),
        record.get("vacuumed_at"),
    )
