"""Dropping every earlier version of a view table: its old files, its change files and its log.

A Delta table keeps what each earlier version needs: data files a MERGE, UPDATE or compaction replaced,
change-data-feed files (``_change_data/``), deletion-vector files, and in its log (``_delta_log/``) every
commit, each holding its files' column statistics (the least and greatest value of the first columns:
values, in clear JSON), the checksum file written beside each commit (``.crc``, which can list every
file with its statistics too) and checkpoints. :func:`drop_earlier_versions` leaves a table with its
newest version alone, so no byte that only an earlier version held stays anywhere under the table:

1. files with deletion vectors are rewritten without the rows they mark (``REORG TABLE ... APPLY
   (PURGE)``), when the table has deletion vectors;
2. ``VACUUM ... RETAIN 0 HOURS`` removes every data, change and deletion-vector file the newest version
   does not reference (Delta's retention check is off for that call only);
3. one commit sets the table's checkpoint interval to 1 and its log and deleted-file retentions to 0:
   Delta writes a checkpoint of that version (the newest files and their statistics, and no entry of a
   removed file, none being retained), and every commit, checksum and checkpoint file of an earlier
   version is then deleted;
4. one last commit sets those three properties back as they were.

Every commit carries the table's progress (:func:`~derived_views.engine.commit_progress.committing`), so the
newest commit with progress, which says what the table is as of, is never one of those deleted. A
process killed during these steps leaves the table readable and exact as of its progress (each step is a
Delta commit or a deletion of files no version the log still holds needs, steps 2 and 3 being such
deletions); running it again finishes the work (and puts the properties back). Readers of an earlier
version, and time travel to one, fail from then on: that is what the drop is for.

Step 3's properties as they were are kept in the table's maintenance record until step 4 is done, so a
run after one killed in between puts back the table's own values. Only tables on local disk are handled
(the log's files are listed and deleted one by one).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from derived_views.engine.commit_progress import committing
from derived_views.engine.delta_sql import is_local, table_ref
from derived_views.engine.maintenance import vacuum
from derived_views.engine.progress import Progress
from derived_views.engine.table_health import maintenance_record, record_maintenance
from derived_views.errors import ViewError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("cdc.views")

#: The table properties step 3 sets for one commit, and their values then.
_DROPPING = {
    "delta.checkpointInterval": "1",
    "delta.deletedFileRetentionDuration": "interval 0 seconds",
    "delta.logRetentionDuration": "interval 0 seconds",
}

#: A file of the log that belongs to one version: a commit, its checksum, a checkpoint (or a part of
#: one), and the local file system's own checksum of each (``.<name>.crc``).
_VERSION_FILE = re.compile(r"^\.?(\d{20})\.")


@dataclass(frozen=True)
class Dropped:
    """What dropping the earlier versions of one table removed."""

    path: str
    version: int
    """The table's version afterwards: the only one it keeps."""
    log_files: int
    """Files of the log deleted (commits, checksums, checkpoints of earlier versions)."""


def drop_earlier_versions(spark: SparkSession, path: str, progress: Progress | None) -> Dropped:
    """Leave the Delta table at ``path`` with its newest version alone (see the module docstring); its
    commits carry ``progress`` (``None`` for a table without progress, a dead-letter table)."""
    from deltalake import DeltaTable

    if not is_local(path):
        raise ViewError(
            f"cannot drop the earlier versions of {path}: that works on a views directory on local disk only "
            "(remove the view's tables and run `cdc rebuild VIEW` instead)"
        )
    local = path.removeprefix("file://")
    ref = table_ref(path)
    configuration = DeltaTable(local).metadata().configuration
    before = _properties_before(path, configuration)
    with committing(spark, progress):
        if configuration.get("delta.enableDeletionVectors") == "true":
            spark.sql(f"REORG TABLE {ref} APPLY (PURGE)").collect()
        vacuum(spark, path, 0)
        record_maintenance(path, **{_SAVED: before})  # a run killed before step 4 finds them there
        spark.sql(f"ALTER TABLE {ref} SET TBLPROPERTIES ({_properties(_DROPPING)})")
        checkpoint = DeltaTable(local).version()
        removed = _delete_log_before(Path(local) / "_delta_log", checkpoint)
        kept = {key: before[key] for key in _DROPPING if key in before}
        if kept:
            spark.sql(f"ALTER TABLE {ref} SET TBLPROPERTIES ({_properties(kept)})")
        unset = [key for key in _DROPPING if key not in before]
        if unset:
            spark.sql(f"ALTER TABLE {ref} UNSET TBLPROPERTIES IF EXISTS ({', '.join(_quoted(key) for key in unset)})")
    now = datetime.now(UTC).isoformat(timespec="seconds")
    record_maintenance(path, vacuumed_at=now, purged_at=now, **{_SAVED: None})
    version = DeltaTable(local).version()
    log.info("dropped the versions of %s before version %d: %d log files deleted", path, checkpoint, removed)
    return Dropped(path, version, removed)


#: The key of the table's maintenance record that holds step 3's properties as they were before it.
_SAVED = "properties_before_purge"


def _properties_before(path: str, configuration: dict[str, str]) -> dict[str, str]:
    """Step 3's properties as the table had them before: as an earlier run killed between steps 3 and 4
    saved them, else as ``configuration`` holds them."""
    saved = maintenance_record(path).get(_SAVED)
    if isinstance(saved, dict):
        return {str(key): str(value) for key, value in saved.items()}
    return {key: configuration[key] for key in _DROPPING if key in configuration}


def _quoted(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _properties(values: dict[str, str]) -> str:
    return ", ".join(f"{_quoted(key)} = {_quoted(value)}" for key, value in values.items())


def _delete_log_before(log_dir: Path, checkpoint: int) -> int:
    """Delete every file of ``log_dir`` that belongs to a version before ``checkpoint``, once the
    checkpoint of that version is written; how many were deleted."""
    if not any(log_dir.glob(f"{checkpoint:020d}.checkpoint*.parquet")):
        raise ViewError(
            f"Delta wrote no checkpoint of version {checkpoint} of {log_dir.parent}: its earlier versions were "
            "kept; run the command again"
        )
    removed = 0
    for file in sorted(log_dir.iterdir()):
        match = _VERSION_FILE.match(file.name)
        if match and int(match[1]) < checkpoint and file.is_file():
            file.unlink()
            removed += 1
    return removed
