"""The MERGEs every view table is written through: one row per key (SCD1) or one row per version (SCD2).

Every table's batch comes from :mod:`derived_views.pending` (its pending events, reduced and typed,
with their :class:`~derived_views.pending.BatchFacts`) and is written here.

Every view table is written through :func:`merge_current` (one row per key, SCD type 1) or
:func:`merge_history` (one row per version, SCD type 2). Both follow the same rules:

1. **Exactly the pending events.** A table reads ``[its progress, watermark)`` of the topics it
   consumes (:mod:`derived_views.pending`), so an event is applied to a table at most once; re-applying the same
   or an older batch is a no-op, so a deleted row can never come back from an older event.
2. **One Delta commit per table and batch**, carrying the new progress (offsets + watermark LSN and
   time, see :mod:`derived_views.progress`) as its ``userMetadata``: data and position move together.
   (A MERGE takes it from the session setting, under :func:`~derived_views.progress.committing`; an
   append or overwrite from its write option, so it runs beside other tables' commits.)
3. **LSN guard.** A source row replaces a table row only if its ``(lsn, sequence)`` is newer.
4. **Partial rows.** Columns an update left out (``unchanged`` header) are folded from the key's
   earlier event in the batch (:mod:`derived_views.reduction`), else kept from the table row.
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

:func:`merge_current` MERGE, target ``t`` on ``t._cdc_key = s._cdc_key``, clauses in this order:

- ``WHEN MATCHED AND s is newer AND s._cdc_op = 'd' THEN DELETE``
- ``WHEN MATCHED AND s is newer THEN UPDATE SET`` every column (an unchanged column keeps ``t``'s value;
  a batch without partial rows sets every column from ``s``, so only ``t``'s key and position are read)
- ``WHEN NOT MATCHED AND s._cdc_op <> 'd' THEN INSERT``
- ``WHEN NOT MATCHED BY SOURCE AND t._cdc_lsn < truncate_lsn THEN DELETE`` (only when the batch
  holds a truncate)

:func:`merge_history` uses the staged-union form: each key that has events gets a *close* row
(merge key = its key) and every event an *insert* row (merge key NULL); target ``t`` on
``t._cdc_key = s._merge_key AND t._cdc_is_current``:

- ``WHEN MATCHED AND s is newer than t's valid-from THEN UPDATE`` valid-to := s's first position,
  ``_cdc_is_current := false``
- ``WHEN NOT MATCHED AND s._merge_key IS NULL THEN INSERT`` the version row
- ``WHEN NOT MATCHED BY SOURCE AND t._cdc_is_current AND t valid-from < truncate THEN UPDATE``
  valid-to := the truncate, ``_cdc_is_current := false`` (only when the batch holds a truncate)

A rebuild (``replace=True``) computes the same rows from an empty table and overwrites the table in one
Delta commit (with ``overwriteSchema``), so readers see the old table until the new one is complete
(a large rebuild of one row per key reads, types and writes in one Spark job:
:func:`derived_views.steps.rebuild_in_one_pass`).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

from derived_views.column_types import convert, supertype
from derived_views.delta_sql import (
    create_if_missing,
    is_delta_table,
    merge_into,
    table_ref,
)
from derived_views.pending import APPEND_CHECK_KEYS, KEY, LSN, OP, SEQ, TS, UNCHANGED
from derived_views.progress import Progress, committing, with_progress
from derived_views.schema import quote, sql_string
from derived_views.table_keys import holds_any

if TYPE_CHECKING:
    from pyspark.sql import Column as SparkColumn
    from pyspark.sql import DataFrame, SparkSession

CURRENT_META_DDL = f"{KEY} string, {LSN} bigint, {SEQ} bigint, {TS} timestamp, {OP} string"
HISTORY_META_DDL = (
    f"{KEY} string, _cdc_valid_from_lsn bigint, _cdc_valid_from_seq bigint, _cdc_valid_from_ts timestamp, "
    "_cdc_valid_to_lsn bigint, _cdc_valid_to_seq bigint, _cdc_valid_to_ts timestamp, "
    f"_cdc_is_current boolean, {OP} string"
)
DEAD_LETTER_DDL = (
    "target string, topic string, partition int, offset bigint, key string, value string, error string, "
    "lsn bigint, recorded_at timestamp"
)


def append(spark: SparkSession, path: str, frame: DataFrame, progress: Progress) -> None:
    """Append ``frame`` to the table at ``path`` (columns matched by name, missing ones NULL) in one commit."""
    from pyspark.sql import functions as F

    target = spark.read.format("delta").load(path).schema
    present = set(frame.columns)
    aligned = frame.select(
        *[F.col(quote(f.name)) if f.name in present else F.lit(None).cast(f.dataType).alias(f.name) for f in target.fields]
    )
    with_progress(aligned.write.format("delta").mode("append"), progress).save(path)


def dead_letter(spark: SparkSession, path: str, frame: DataFrame, target: str) -> None:
    """Record the poison events of ``frame`` in the dead-letter table at ``path`` (idempotent).

    The tables of a view share one dead-letter table and may be applied side by side in separate
    sessions, so its creation and MERGEs are serialized in this process (:data:`_DEAD_LETTER_WRITES`)."""
    with _DEAD_LETTER_WRITES:
        _dead_letter(spark, path, frame, target)


#: Held while a dead-letter table is written (poison events are rare; one lock for all of them).
_DEAD_LETTER_WRITES = threading.Lock()


def _dead_letter(spark: SparkSession, path: str, frame: DataFrame, target: str) -> None:
    from pyspark.sql import functions as F

    ensure_table(spark, path, DEAD_LETTER_DDL)
    poison = frame.filter(F.col("_cdc_error").isNotNull()).select(
        F.lit(target).alias("target"),
        F.col("_cdc_topic").alias("topic"),
        F.col("_cdc_partition").alias("partition"),
        F.col("_cdc_offset").alias("offset"),
        F.col(KEY).alias("key"),
        F.col("_cdc_raw").alias("value"),
        F.col("_cdc_error").alias("error"),
        F.col(LSN).alias("lsn"),
        F.current_timestamp().alias("recorded_at"),
    )
    with committing(spark, None):
        merge_into(
            spark, path, poison,
            "t.target = s.target AND t.topic = s.topic AND t.partition = s.partition AND t.offset = s.offset",
        ).when_not_matched_insert_all().execute()


_KNOWN_TYPES: dict[str, dict[str, str]] = {}


def table_types(spark: SparkSession, path: str) -> dict[str, str] | None:
    """Column name -> Spark type (DDL form) of the Delta table at ``path``; ``None`` when there is none."""
    known = _KNOWN_TYPES.get(path)
    if known is not None:
        return known
    if not is_delta_table(spark, path):
        return None
    types = {f.name: f.dataType.simpleString() for f in spark.read.format("delta").load(path).schema.fields}
    _KNOWN_TYPES[path] = types
    return types


def ensure_table(spark: SparkSession, path: str, ddl: str) -> None:
    """Create the Delta table at ``path`` with ``ddl``, or bring it to ``ddl``: columns it lacks are
    added, and a column whose type differs is converted to the :func:`~derived_views.column_types.supertype`
    of both (:func:`_retype`); a column is never narrowed."""
    from pyspark.sql.types import StructType

    wanted = cast(StructType, StructType.fromDDL(ddl))
    wanted_types = {f.name: f.dataType.simpleString() for f in wanted.fields}
    existing = table_types(spark, path)
    if existing is not None and all(existing.get(n) == t for n, t in wanted_types.items()):
        return
    if existing is None:
        with committing(spark, None):
            create_if_missing(spark, path, ddl)
        _KNOWN_TYPES[path] = wanted_types
        return
    changed = {n: supertype(existing[n], t) for n, t in wanted_types.items() if n in existing and existing[n] != t}
    changed = {n: t for n, t in changed.items() if t != existing[n]}
    missing = [f for f in wanted.fields if f.name not in existing]
    forget_table(path)  # read again after a failure part way: a conversion must start from the table's types
    if changed:
        _retype(spark, path, existing, changed)
    if missing:
        added = ", ".join(f"{quote(f.name)} {f.dataType.simpleString()}" for f in missing)
        with committing(spark, None):
            spark.sql(f"ALTER TABLE {table_ref(path)} ADD COLUMNS ({added})")
    _KNOWN_TYPES[path] = {**existing, **changed, **{f.name: f.dataType.simpleString() for f in missing}}


def _retype(spark: SparkSession, path: str, existing: dict[str, str], changed: dict[str, str]) -> None:
    """Rewrite the table at ``path`` with the ``changed`` columns converted to their new (wider) types,
    in one Delta commit that carries no progress (the table stays as of the watermark it recorded).

    Readers see the old table until the commit; a sync killed before it converts again on its next run.
    The conversion is exact (:func:`~derived_views.column_types.convert`): integer, float and decimal
    widenings are casts, and a column that becomes ``string`` holds each value's JSON text.
    """
    from pyspark.sql import functions as F

    frame = spark.read.format("delta").load(path)
    converted = frame.select(*[
        convert(F.col(quote(name)), existing[name], changed[name]).alias(name) if name in changed else F.col(quote(name))
        for name in frame.columns
    ])
    with committing(spark, None):
        converted.write.format("delta").mode("overwrite").option("overwriteSchema", "true").save(path)


def rename_columns(spark: SparkSession, path: str, renames: dict[str, str]) -> None:
    """Rename columns of the table at ``path`` (``{old: new}``) in one commit that carries no progress,
    by rewriting it: a rename in place needs Delta's column mapping, which not every reader supports."""
    from pyspark.sql import functions as F

    frame = spark.read.format("delta").load(path)
    renamed = frame.select(*[F.col(quote(name)).alias(renames.get(name, name)) for name in frame.columns])
    with committing(spark, None):
        renamed.write.format("delta").mode("overwrite").option("overwriteSchema", "true").save(path)
    forget_table(path)


def forget_table(path: str) -> None:
    """Drop cached knowledge of ``path``'s columns (after a rebuild replaced its schema)."""
    _KNOWN_TYPES.pop(path, None)


def forget_tables() -> None:
    """Drop cached knowledge of every table's columns (another process may have changed them)."""
    _KNOWN_TYPES.clear()


def _newer(prefix_lsn: str = LSN, prefix_seq: str = SEQ) -> str:
    return f"(s.{LSN} > t.{prefix_lsn} OR (s.{LSN} = t.{prefix_lsn} AND s.{SEQ} > t.{prefix_seq}))"


def _overwrite(frame: DataFrame, path: str, progress: Progress) -> None:
    with_progress(frame.write.format("delta").mode("overwrite").option("overwriteSchema", "true"), progress).save(path)
    forget_table(path)


def merge_current(
    spark: SparkSession,
    path: str,
    source: DataFrame,
    columns: list[tuple[str, str]],
    progress: Progress,
    truncates: tuple[int, ...] = (),
    *,
    replace: bool = False,
    inserts_only: bool = False,
    keys: Sequence[str] | None = None,
    whole_rows: bool = False,
) -> None:
    """Apply latest-per-key typed rows to the SCD1 table at ``path`` in one commit (see module docstring).

    ``inserts_only`` appends the rows when none of their keys (``keys`` when known, else collected from
    ``source``) is in the table (rule 7). ``whole_rows`` says no row of ``source`` lacks a column
    (``unchanged`` is empty everywhere): the update then takes every column from the source, so the
    MERGE reads only the target's key and position columns instead of whole rows.
    """
    from pyspark.sql import functions as F

    rows = source.filter(F.col("_cdc_error").isNull() & (F.col(OP) != "t"))
    names = [n for n, _ in columns]
    ddl = ", ".join(f"{quote(n)} {t}" for n, t in columns) + ", " + CURRENT_META_DDL
    if replace:
        kept = rows.filter(F.col(OP) != "d").select(*[quote(n) for n in names], KEY, LSN, SEQ, TS, OP)
        _overwrite(kept, path, progress)
        return
    ensure_table(spark, path, ddl)
    if inserts_only and not _meets_table(spark, path, rows, keys):
        append(spark, path, rows.select(*[quote(n) for n in names], KEY, LSN, SEQ, TS, OP), progress)
        return
    update = {
        quote(n): f"s.{quote(n)}" if whole_rows
        else f"CASE WHEN array_contains(s.{UNCHANGED}, {sql_string(n)}) THEN t.{quote(n)} ELSE s.{quote(n)} END"
        for n in names
    }
    meta = {c: f"s.{c}" for c in (KEY, LSN, SEQ, TS, OP)}
    insert = {**{quote(n): f"s.{quote(n)}" for n in names}, **meta}
    builder = (
        merge_into(spark, path, rows, f"t.{KEY} = s.{KEY}")
        .when_matched_delete(condition=f"{_newer()} AND s.{OP} = 'd'")
        .when_matched_update({**update, **meta}, condition=_newer())
        .when_not_matched_insert(insert, condition=f"s.{OP} <> 'd'")
    )
    if truncates:
        builder = builder.when_not_matched_by_source_delete(condition=f"t.{LSN} < {max(truncates)}")
    with committing(spark, progress):
        builder.execute()


def _close_at(truncates: tuple[int, ...], lsn: SparkColumn, next_lsn: SparkColumn) -> SparkColumn | None:
    """The first truncate after ``lsn`` and before ``next_lsn`` (a version's end by truncation)."""
    from pyspark.sql import functions as F

    result = None
    for truncate in truncates:
        hit = (lsn < F.lit(truncate)) & (next_lsn.isNull() | (next_lsn > F.lit(truncate)))
        result = F.when(hit, F.lit(truncate)) if result is None else result.when(hit, F.lit(truncate))
    return result


def merge_history(
    spark: SparkSession,
    path: str,
    source: DataFrame,
    columns: list[tuple[str, str]],
    progress: Progress,
    truncates: tuple[int, ...] = (),
    *,
    replace: bool = False,
    inserts_only: bool = False,
    keys: Sequence[str] | None = None,
    whole_rows: bool = False,
) -> None:
    """Apply every typed event as a version row of the SCD2 table at ``path`` (see module docstring).

    ``whole_rows`` says no event of ``source`` lacks a column: nothing is then filled from the table's
    current versions (which are not read). ``inserts_only`` appends the versions instead of merging
    them when no key of the batch (``keys`` when known) is current in the table (rule 7).
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    names = [n for n, _ in columns]
    ddl = ", ".join(f"{quote(n)} {t}" for n, t in columns) + ", " + HISTORY_META_DDL
    events = source.filter(F.col("_cdc_error").isNull() & (F.col(OP) != "t") & F.col(KEY).isNotNull())
    if not replace:
        ensure_table(spark, path, ddl)
        if not whole_rows:
            events = _fill_from_current(spark, path, events, names)
    by_key = Window.partitionBy(KEY).orderBy(LSN, SEQ)
    nxt = events.select(
        "*",
        F.lead(LSN).over(by_key).alias("_next_lsn"),
        F.lead(SEQ).over(by_key).alias("_next_seq"),
        F.lead(TS).over(by_key).alias("_next_ts"),
        F.row_number().over(by_key).alias("_rank"),
    )
    is_delete = F.col(OP) == "d"
    truncated = _close_at(truncates, F.col(LSN), F.col("_next_lsn"))
    to_lsn = F.when(is_delete, F.col(LSN)).otherwise(F.col("_next_lsn"))
    to_seq = F.when(is_delete, F.col(SEQ)).otherwise(F.col("_next_seq"))
    to_ts = F.when(is_delete, F.col(TS)).otherwise(F.col("_next_ts"))
    if truncated is not None:
        to_lsn = F.when(~is_delete & truncated.isNotNull(), truncated).otherwise(to_lsn)
        to_seq = F.when(~is_delete & truncated.isNotNull(), F.lit(-1)).otherwise(to_seq)
        to_ts = F.when(~is_delete & truncated.isNotNull(), F.lit(None).cast("timestamp")).otherwise(to_ts)
    versions = nxt.select(
        *[quote(n) for n in names],
        KEY,
        F.col(LSN).alias("_cdc_valid_from_lsn"),
        F.col(SEQ).alias("_cdc_valid_from_seq"),
        F.col(TS).alias("_cdc_valid_from_ts"),
        to_lsn.cast("bigint").alias("_cdc_valid_to_lsn"),
        to_seq.cast("bigint").alias("_cdc_valid_to_seq"),
        to_ts.alias("_cdc_valid_to_ts"),
        (to_lsn.isNull() & ~is_delete).alias("_cdc_is_current"),
        OP,
        F.col("_rank"),
    )
    if replace:
        _overwrite(versions.drop("_rank"), path, progress)
        return
    if inserts_only and not _meets_table(spark, path, events, keys, current_only=True):
        append(spark, path, versions.drop("_rank"), progress)
        return
    first = versions.filter(F.col("_rank") == 1)
    first_truncate = _close_at(truncates, F.lit(-1), F.col("_cdc_valid_from_lsn"))
    close_lsn = F.col("_cdc_valid_from_lsn")
    close_seq = F.col("_cdc_valid_from_seq")
    close_ts = F.col("_cdc_valid_from_ts")
    if first_truncate is not None:
        close_lsn = F.coalesce(first_truncate, close_lsn)
        close_seq = F.when(first_truncate.isNotNull(), F.lit(-1)).otherwise(close_seq)
        close_ts = F.when(first_truncate.isNotNull(), F.lit(None).cast("timestamp")).otherwise(close_ts)
    close = first.select(
        F.col(KEY).alias("_merge_key"),
        *[F.lit(None).cast(t).alias(n) for n, t in columns],
        KEY,
        close_lsn.cast("bigint").alias("_close_lsn"),
        close_seq.cast("bigint").alias("_close_seq"),
        close_ts.alias("_close_ts"),
    )
    staged = versions.drop("_rank").select(F.lit(None).cast("string").alias("_merge_key"), "*")
    close_full = close.select(
        "_merge_key",
        *[quote(n) for n in names],
        KEY,
        F.col("_close_lsn").alias("_cdc_valid_from_lsn"),
        F.col("_close_seq").alias("_cdc_valid_from_seq"),
        F.col("_close_ts").alias("_cdc_valid_from_ts"),
        F.lit(None).cast("bigint").alias("_cdc_valid_to_lsn"),
        F.lit(None).cast("bigint").alias("_cdc_valid_to_seq"),
        F.lit(None).cast("timestamp").alias("_cdc_valid_to_ts"),
        F.lit(False).alias("_cdc_is_current"),
        F.lit("close").alias(OP),
    )
    merged = staged.unionByName(close_full)
    newer = (
        "(s._cdc_valid_from_lsn > t._cdc_valid_from_lsn OR "
        "(s._cdc_valid_from_lsn = t._cdc_valid_from_lsn AND s._cdc_valid_from_seq > t._cdc_valid_from_seq))"
    )
    insert = {quote(n): f"s.{quote(n)}" for n in names}
    insert.update(
        {
            c: f"s.{c}"
            for c in (
                KEY, "_cdc_valid_from_lsn", "_cdc_valid_from_seq", "_cdc_valid_from_ts", "_cdc_valid_to_lsn",
                "_cdc_valid_to_seq", "_cdc_valid_to_ts", "_cdc_is_current", OP,
            )
        }
    )
    builder = (
        merge_into(spark, path, merged, f"t.{KEY} = s._merge_key AND t._cdc_is_current")
        .when_matched_update(
            {
                "_cdc_valid_to_lsn": "s._cdc_valid_from_lsn",
                "_cdc_valid_to_seq": "s._cdc_valid_from_seq",
                "_cdc_valid_to_ts": "s._cdc_valid_from_ts",
                "_cdc_is_current": "false",
            },
            condition=newer,
        )
        .when_not_matched_insert(insert, condition="s._merge_key IS NULL")
    )
    if truncates:
        first_t = min(truncates)
        builder = builder.when_not_matched_by_source_update(
            {"_cdc_valid_to_lsn": str(first_t), "_cdc_valid_to_seq": "-1", "_cdc_is_current": "false"},
            condition=f"t._cdc_is_current AND t._cdc_valid_from_lsn < {first_t}",
        )
    with committing(spark, progress):
        builder.execute()


def _meets_table(
    spark: SparkSession, path: str, rows: DataFrame, known: Sequence[str] | None = None, *, current_only: bool = False
) -> bool:
    """Whether any key of ``rows`` may be in the table at ``path`` (``current_only``: among its current
    versions), see rule 7. The keys (``known``, else collected from ``rows``: ``True`` beyond
    :data:`APPEND_CHECK_KEYS`, so the batch is merged) are looked up in the table's key column read in
    the driver (:func:`~derived_views.table_keys.holds_any`), or with an ``IN`` filter on it (one Spark
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


def _fill_from_current(spark: SparkSession, path: str, events: DataFrame, names: list[str]) -> DataFrame:
    """Take the columns a batch's first partial event lacks from the key's current version in ``path``."""
    from pyspark.sql import functions as F

    current = (
        spark.read.format("delta").load(path)
        .filter(F.col("_cdc_is_current"))
        .select(F.col(KEY).alias("_fill_key"), *[F.col(quote(n)).alias(f"_fill_{i}") for i, n in enumerate(names)])
    )
    partial_rows = events.filter(F.size(UNCHANGED) > 0)
    whole = events.filter(F.size(UNCHANGED) == 0)
    joined = partial_rows.join(current, partial_rows[KEY] == current["_fill_key"], "left")
    filled = joined.select(
        *[
            F.when(F.array_contains(F.col(UNCHANGED), n), F.col(f"_fill_{i}")).otherwise(F.col(quote(n))).alias(n)
            for i, n in enumerate(names)
        ],
        *[c for c in events.columns if c not in names],
    )
    return whole.unionByName(filled)

