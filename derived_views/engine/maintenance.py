"""Keeping a view table healthy: compaction of small files, removal of old files, checkpoints.

Every sync step adds files and a version to each table it changes, and a MERGE leaves the files it
replaced behind for readers of older versions. Left alone, reads slow down with the file count and the
disk fills. For each table, :func:`due` decides from its :class:`~derived_views.engine.table_health.TableHealth`
what :class:`MaintenancePolicy` asks for, and :func:`run` does it through delta-spark:

- **compaction** (``OPTIMIZE``) when the table holds at least :attr:`~MaintenancePolicy.small_files` files
  under :attr:`~MaintenancePolicy.small_file_bytes`, or :attr:`~MaintenancePolicy.versions` commits were
  made since it was last compacted. ``OPTIMIZE`` rewrites small files into large ones in one commit that
  changes no data (``dataChange=false``): the table's progress and every reader's result stay as they were;
- **vacuum** (``VACUUM ... RETAIN n HOURS``) when files that no version newer than the retention needs
  are still on disk (files a compaction or MERGE replaced, and files a failed write left). A reader of a
  version younger than the retention (a running query, a time-travel read, a ``cdclog``-fed job) keeps
  every file it needs;
- **checkpoints** as Delta writes them: a commit that reaches the table's checkpoint interval (100 for
  view tables) writes one, and Delta removes log entries older than its log retention (30 days) then;
- **retention** (``SET TBLPROPERTIES``) when the table's ``delta.logRetentionDuration`` or
  ``delta.deletedFileRetentionDuration`` is shorter than the policy's retention (Delta's defaults, 30
  and 7 days, are not, at the default retention): see below.

**Versions kept readable.** Every version *replaced* less than :attr:`~MaintenancePolicy.retention_hours`
ago (its next commit is younger than that) stays readable, as do the newest: what reads as of an LSN
(:mod:`derived_views.engine.exact_versions`) relies on. ``VACUUM ... RETAIN n HOURS`` deletes a file only
when no version references it and the commit that removed it from the table is more than ``n`` hours
old (or, for a file the log does not name, when the file is); Delta keeps the record of removed files
in its checkpoints for ``delta.deletedFileRetentionDuration`` (after which such a file counts as one
the log does not name) and the log's commits for ``delta.logRetentionDuration``. With both at least
the retention, the vacuum's own retention keeps those versions' files, and the log can still rebuild
them; the retention task raises the two properties when they are shorter.

Each task is one Delta commit (or, for ``VACUUM``, a deletion of files no kept version references): a
process killed during one leaves the table as it was or as the task left it, never in between, and the
next pass finds what is still due. Every task is recorded in the table's maintenance record
(:mod:`derived_views.engine.table_health`).
"""

from __future__ import annotations

import logging
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from derived_views.engine.delta_sql import is_local, table_ref
from derived_views.engine.table_health import TableHealth, record_maintenance

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("cdc.views")

COMPACT = "compact"
VACUUM = "vacuum"
RETAIN = "retain"

#: The table properties that bound how long a replaced version stays readable, with Delta's defaults (hours).
RETENTION_PROPERTIES = {"delta.logRetentionDuration": 30 * 24.0, "delta.deletedFileRetentionDuration": 7 * 24.0}

_INTERVAL = re.compile(r"^\s*interval\s+(\d+(?:\.\d+)?)\s+(second|minute|hour|day|week)s?\s*$", re.IGNORECASE)
_UNIT_HOURS = {"second": 1 / 3600, "minute": 1 / 60, "hour": 1.0, "day": 24.0, "week": 168.0}

#: Session settings of a ``VACUUM`` call, unset after it. The retention is the one the call names (the
#: policy's, which settings bound, or for a purge 0): Delta's check that it is at least the table's
#: deleted-file retention (7 days by default) is off, and so is its rule that ignores any retention but 0
#: given to ``VACUUM`` (``retentionWindowIgnore``, on by default, which would keep every file younger than
#: the table's 7 days whatever ``CDC_VACUUM_RETENTION_HOURS`` says). The call lists the table's
#: directories in a Spark job of a few tasks, a view table having at most two partition directories (a
#: history table's; Spark's default, 10000 tasks, makes a vacuum of a small table take minutes on local
#: Spark).
VACUUM_CONF = {
    "spark.databricks.delta.retentionDurationCheck.enabled": "false",
    "spark.databricks.delta.vacuum.retentionWindowIgnore.enabled": "false",
    "spark.sql.sources.parallelPartitionDiscovery.parallelism": "4",
}


@dataclass(frozen=True)
class MaintenancePolicy:
    """When a table is compacted and which old files are removed (``CDC_MAINTENANCE_*`` and
    ``CDC_VACUUM_RETENTION_HOURS``, see ``docs/configuration.md``)."""

    small_files: int = 32
    """Compact a table holding at least this many small files."""
    small_file_bytes: int = 16 << 20
    """A file under this size is small."""
    versions: int = 200
    """Compact a table after this many commits since its last compaction."""
    retention_hours: float = 168.0
    """Vacuum keeps every file a version younger than this needs (Delta's default: 7 days)."""
    interval_s: float = 300.0
    """How often a continuous sync looks at its tables' health."""


@dataclass(frozen=True)
class Task:
    """One maintenance task of one table, and why it is due."""

    path: str
    action: str
    reason: str


def due(health: TableHealth, policy: MaintenancePolicy, old_files: int) -> list[Task]:
    """The tasks ``policy`` asks of a table with ``health`` and ``old_files`` files a vacuum would remove."""
    tasks = []
    reasons = []
    if health.small_files >= policy.small_files:
        reasons.append(f"{health.small_files} small files (compacted from {policy.small_files})")
    if health.versions_since_compaction >= policy.versions:
        since = health.versions_since_compaction
        reasons.append(f"{since} versions since its last compaction (compacted from {policy.versions})")
    if reasons and health.files > 1:
        tasks.append(Task(health.path, COMPACT, ", ".join(reasons)))
    if old_files:
        tasks.append(Task(health.path, VACUUM, f"{old_files} files no version of the last {policy.retention_hours:g} h needs"))
    return tasks


#: On object storage, where the files a vacuum would remove are not checked one by one, a table is
#: vacuumed at most this often (its log keeps the removed files' entries until its next checkpoint).
REMOTE_VACUUM_EVERY_MS = 24 * 3600 * 1000


def removable_files(path: str, policy: MaintenancePolicy) -> int:
    """How many files a vacuum with the policy's retention would remove from the table at ``path``: files
    the log no longer references past the retention, and (on local disk) files no commit ever added, read
    with ``deltalake`` without removing any. The log names removed files until its next checkpoint, also
    once a vacuum deleted them: on local disk only those still there count; on object storage a table
    vacuumed in the last :data:`REMOTE_VACUUM_EVERY_MS` counts none. A hidden file (``.`` or ``_``
    first) never counts: Delta's ``VACUUM`` leaves them, and ``deltalake`` lists those in a partition's
    directory (the checksum Spark writes beside each data file on local disk), so counting them would
    find a vacuum due after every vacuum."""
    import time

    from deltalake import DeltaTable

    local = is_local(path)
    table = DeltaTable(path.removeprefix("file://"))
    hours = int(policy.retention_hours)
    files = table.vacuum(retention_hours=hours, dry_run=True, enforce_retention_duration=False, full=local)
    if local:
        root = path.removeprefix("file://")
        return sum(
            1
            for file in files
            if not os.path.basename(file).startswith((".", "_"))
            and os.path.exists(file if os.path.isabs(file) else os.path.join(root, file))
        )
    recent = time.time() * 1000 - REMOTE_VACUUM_EVERY_MS
    if any(c.get("operation") == "VACUUM END" and int(c.get("timestamp", 0)) > recent for c in table.history(1000)):
        return 0
    return len(files)


def retention_properties(configuration: Mapping[str, str | None], policy: MaintenancePolicy) -> dict[str, str]:
    """The table properties to set on a table whose properties are ``configuration`` so that it keeps
    readable every version replaced less than the policy's retention ago (none when its own values, or
    Delta's defaults, already keep them that long; a value that does not parse is set anew)."""
    wanted = f"interval {math.ceil(policy.retention_hours)} hours"
    short = {}
    for key, default in RETENTION_PROPERTIES.items():
        held: float | None = default
        if key in configuration:
            match = _INTERVAL.match(configuration[key] or "")
            held = float(match.group(1)) * _UNIT_HOURS[match.group(2).lower()] if match else None
        if held is None or held < policy.retention_hours:
            short[key] = wanted
    return short


def _short_retention(path: str, policy: MaintenancePolicy) -> dict[str, str]:
    from deltalake import DeltaTable

    return retention_properties(DeltaTable(path.removeprefix("file://")).metadata().configuration, policy)


def tasks_for(path: str, policy: MaintenancePolicy, health: TableHealth) -> list[Task]:
    """The tasks due on the table at ``path`` whose health is ``health``: first, table properties that keep
    too short a time what the retention promises readable (:data:`RETAIN`), then :func:`due`'s."""
    tasks = due(health, policy, removable_files(path, policy))
    short = _short_retention(path, policy)
    if short:
        reason = f"{', '.join(sorted(short))} shorter than the {policy.retention_hours:g} h versions are kept readable"
        tasks.insert(0, Task(path, RETAIN, reason))
    return tasks


def run(spark: SparkSession, task: Task, policy: MaintenancePolicy) -> None:
    """Do ``task`` through delta-spark and record it in the table's maintenance record; one log line says
    the task starts (``compacting <path>: <reason>``, ``vacuuming ...``), one that it is done."""
    ref = table_ref(task.path)
    now = datetime.now(UTC).isoformat(timespec="seconds")
    if task.action == RETAIN:
        short = _short_retention(task.path, policy)
        if short:
            settings = ", ".join(f"'{key}' = '{value}'" for key, value in sorted(short.items()))
            spark.sql(f"ALTER TABLE {ref} SET TBLPROPERTIES ({settings})").collect()
        log.info("kept %s readable for %g h: %s", task.path, policy.retention_hours, task.reason)
        return
    log.info("%s %s: %s", "compacting" if task.action == COMPACT else "vacuuming", task.path, task.reason)
    if task.action == COMPACT:
        spark.sql(f"OPTIMIZE {ref}").collect()
        from deltalake import DeltaTable

        record_maintenance(task.path, compacted_at=now, compacted_version=DeltaTable(task.path.removeprefix("file://")).version())
    else:
        vacuum(spark, task.path, policy.retention_hours)
        record_maintenance(task.path, vacuumed_at=now)
    log.info("%s %s: %s", "compacted" if task.action == COMPACT else "vacuumed", task.path, task.reason)


def vacuum(spark: SparkSession, path: str, retention_hours: float) -> None:
    """``VACUUM`` the Delta table at ``path``, keeping the files a version younger than ``retention_hours``
    needs, with :data:`VACUUM_CONF` for this call only."""
    for key, value in VACUUM_CONF.items():
        spark.conf.set(key, value)
    try:
        spark.sql(f"VACUUM {table_ref(path)} RETAIN {retention_hours:g} HOURS").collect()
    finally:
        for key in VACUUM_CONF:
            spark.conf.unset(key)
