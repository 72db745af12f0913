"""What every view table's writes share: the rules both MERGEs keep, and the table plumbing they use.

Every table's batch comes from :mod:`derived_views.source.pending` (its pending events, reduced and typed,
with their :class:`~derived_views.events.batch_facts.BatchFacts`) and is written here.

Every view table is written through :func:`derived_views.write.scd1.merge_current` (one row per key, SCD type 1)
or :func:`derived_views.write.scd2.merge_history` (one row per version, SCD type 2); poison events go to the
view's dead-letter table (:mod:`derived_views.write.dead_letter`). Both MERGEs follow the same rules:

1. **Exactly the pending events.** A table reads ``[its progress, watermark)`` of the topics it
   consumes (:mod:`derived_views.source.pending`), so an event is applied to a table at most once; re-applying the same
   or an older batch is a no-op, so a deleted row can never come back from an older event.
2. **One Delta commit per table and batch**, carrying the new progress (offsets + watermark LSN and
   time, see :mod:`derived_views.engine.progress`) as its ``userMetadata``: data and position move together.
   (A MERGE takes it from the session setting, under :func:`~derived_views.engine.commit_progress.committing`; an
   append or overwrite from its write option, so it runs beside other tables' commits.)
3. **LSN guard.** A source row replaces a table row only if its ``(lsn, sequence)`` is newer.
4. **Partial rows.** Columns an update left out (``unchanged`` header) are folded from the key's
   earlier event in the batch (:mod:`derived_views.events.reduction`), else kept from the table row.
5. **Truncate** empties the rows older than the truncate's LSN in the same MERGE.
6. **Poison events** (an unreadable envelope, or values that do not fit the column types) are written
   to the view's dead-letter Delta table first (idempotently, keyed by topic/partition/offset) and
   left out of the MERGE; the rest of the batch applies whole.
7. **Insert-only batches append when none of their keys is in the table.** When every pending
   event is an insert (``c``), its keys (up to :data:`APPEND_CHECK_KEYS`) are looked up in the table
   (history: among its current versions); when none is there, the rows (history: the versions, ordered per key) are
   appended in one commit instead of merged, which gives the MERGE's result. The check is needed: a
   reduced batch can hide a delete before a re-insert of the same key, a view behind compaction can
   read a re-insert whose delete and tombstone compaction removed, a delete routed to the
   dead-letter table leaves its row in place, and some removals never reach the log at all (a
   ``TRUNCATE`` of one partition of a table published through its root, which PostgreSQL does not
   replicate). The batch alone cannot rule these out, so the table is always asked; a batch held in
   the driver hands its keys over directly (:attr:`BatchFacts.keys`).
8. **Whole-row batches read no table rows.** A batch without partial rows takes every column from the
   source: the current table's MERGE reads only the target's key and position, and the history table
   fills nothing from its current versions.
9. **Keyless batches append.** When no event of a batch carries a key (a table without a primary key
   or replica identity index), no row of it can match a table row: without a truncate or an added
   column's fill in its range, its rows (history: its versions, each current) but the deletes, which
   name no row, are appended in one commit, the MERGE's result without its scan of the table.

A rebuild (``replace=True``) computes the same rows from an empty table and overwrites the table in one
Delta commit (with ``overwriteSchema``), so readers see the old table until the new one is complete
(a large rebuild of one row per key reads, types and writes in one Spark job:
:func:`derived_views.write.steps.rebuild_in_one_pass`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from derived_views.engine.commit_progress import with_progress
from derived_views.engine.progress import Progress
from derived_views.events.batch_facts import APPEND_CHECK_KEYS
from derived_views.events.column_names import quote
from derived_views.events.metadata_columns import KEY, LSN, SEQ
from derived_views.write.table_evolution import overwriting_writer
from derived_views.write.table_keys import holds_any

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from derived_views.write.table_evolution import TableTypes


def append(spark: SparkSession, path: str, frame: DataFrame, progress: Progress) -> None:
    """Append ``frame`` to the table at ``path`` (columns matched by name, missing ones NULL) in one commit."""
    from pyspark.sql import functions as F

    target = spark.read.format("delta").load(path).schema
    present = set(frame.columns)
    aligned = frame.select(
        *[F.col(quote(f.name)) if f.name in present else F.lit(None).cast(f.dataType).alias(f.name) for f in target.fields]
    )
    with_progress(aligned.write.format("delta").mode("append"), progress).save(path)


def newer(prefix_lsn: str = LSN, prefix_seq: str = SEQ) -> str:
    """The LSN guard (rule 3) as a MERGE condition: the source row ``s`` is after the target row ``t``."""
    return f"(s.{LSN} > t.{prefix_lsn} OR (s.{LSN} = t.{prefix_lsn} AND s.{SEQ} > t.{prefix_seq}))"


def overwrite(frame: DataFrame, path: str, progress: Progress, types: TableTypes, partitioned_by: Sequence[str] = ()) -> None:
    """Replace the table at ``path`` by ``frame``, partitioned by ``partitioned_by``, in one commit carrying
    ``progress`` (a rebuild); a table feature its new columns need is enabled before, in a commit of its
    own (:meth:`~derived_views.write.table_evolution.TableTypes.prepare_overwrite`)."""
    types.prepare_overwrite(frame.sparkSession, path, [f.dataType.simpleString() for f in frame.schema.fields])
    with_progress(overwriting_writer(frame, partitioned_by), progress).save(path)
    types.forget(path)


def meets_table(
    spark: SparkSession, path: str, rows: DataFrame, known: Sequence[str] | None = None, *, current_only: bool = False
) -> bool:
    """Whether any key of ``rows`` may be in the table at ``path`` (``current_only``: among its current
    versions), see rule 7. The keys (``known``, else collected from ``rows``: ``True`` beyond
    :data:`APPEND_CHECK_KEYS`, so the batch is merged) are looked up in the table's key column read in
    the driver (:func:`~derived_views.write.table_keys.holds_any`), or with an ``IN`` filter on it (one Spark
    job) when the table cannot be read that way."""
    from pyspark.sql import functions as F

    if known is not None:
        keys = list(known)
    else:
        keys = [row[0] for row in rows.select(KEY).limit(APPEND_CHECK_KEYS + 1).collect()]
    if len(keys) > APPEND_CHECK_KEYS:
        return True
    if not keys:
        return False
    held = holds_any(path, keys, current_only=current_only)
    if held is not None:
        return held
    table = spark.read.format("delta").load(path).filter(F.col(KEY).isin(keys))
    if current_only:
        table = table.filter(F.col("_cdc_is_current"))
    return bool(table.select(KEY).limit(1).count())
