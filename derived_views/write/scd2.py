"""One row per version (SCD type 2): the history tables of the warehouse.

The rules every view table keeps are in :mod:`derived_views.write.apply`.

:func:`merge_history` uses the staged-union form: each key that has events gets a *close* row
(merge key = its key) and every event an *insert* row (merge key NULL); target ``t`` on
``t._cdc_key = s._merge_key AND t._cdc_is_current``:

- ``WHEN MATCHED AND s is newer than t's valid-from THEN UPDATE`` valid-to := s's first position,
  ``_cdc_is_current := false``
- ``WHEN NOT MATCHED AND s._merge_key IS NULL THEN INSERT`` the version row
- ``WHEN NOT MATCHED BY SOURCE AND t._cdc_is_current AND t valid-from < truncate THEN UPDATE``
  valid-to := the truncate, ``_cdc_is_current := false`` (only when the batch holds a truncate)
- ``WHEN NOT MATCHED BY SOURCE AND t._cdc_is_current AND t valid-from is before a fill THEN UPDATE SET``
  each filled column (only when the batch's range holds the position of a column added with a stored
  default, :mod:`derived_views.write.stored_defaults`): a version current at the fill's position holds its
  value, for its whole span; the first two clauses set it too on the versions they end at or after it,
  and the batch's own versions current at it get it in ``s``

A keyless table (no primary key or replica identity index: its events carry a null key) is append-only,
as its current table is: every inserted or updated row is a version of its own, current until a
truncate ends it (the truncate clause above); a delete names no version, so it adds none. The current
versions therefore equal the current table.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from derived_views.engine.commit_progress import committing
from derived_views.engine.delta_sql import merge_into
from derived_views.engine.progress import Progress
from derived_views.events.column_names import quote
from derived_views.events.metadata_columns import KEY, LSN, OP, SEQ, TS, UNCHANGED
from derived_views.source.table_step import Fill, TableStep
from derived_views.write.apply import append, meets_table, overwrite
from derived_views.write.stored_defaults import fill_set, filled_rows

if TYPE_CHECKING:
    from pyspark.sql import Column as SparkColumn
    from pyspark.sql import DataFrame, SparkSession

    from derived_views.write.table_evolution import TableTypes


HISTORY_META_DDL = (
    f"{KEY} string, _cdc_valid_from_lsn bigint, _cdc_valid_from_seq bigint, _cdc_valid_from_ts timestamp, "
    "_cdc_valid_to_lsn bigint, _cdc_valid_to_seq bigint, _cdc_valid_to_ts timestamp, "
    f"_cdc_is_current boolean, {OP} string"
)


#: The history tables' partitioning: the current versions apart from the ended ones. A step's MERGE matches
#: only current versions (its condition names ``t._cdc_is_current``), so Delta reads and rewrites only the
#: files of the current partition, as large as the current table, never the ended versions, which grow
#: with every change; an ended version is written once, into the other partition, and rewritten only by
#: a purge. A batch holding a truncate or a fill still reads the whole table (its clauses apply to rows no
#: event matches, so Delta skips no file) but rewrites current versions only. Without the partitioning
#: each step rewrote every history file holding a current version of a changed key: with scattered
#: changes, nearly the whole history.
#: A table made before it keeps its layout until a rebuild (``cdc rebuild``) writes it again.
HISTORY_PARTITIONS = ("_cdc_is_current",)


def _close_at(truncates: tuple[int, ...], lsn: SparkColumn, next_lsn: SparkColumn) -> SparkColumn | None:
    """The first truncate after ``lsn`` and before ``next_lsn`` (a version's end by truncation)."""
    from pyspark.sql import functions as F

    result = None
    for truncate in truncates:
        hit = (lsn < F.lit(truncate)) & (next_lsn.isNull() | (next_lsn > F.lit(truncate)))
        result = F.when(hit, F.lit(truncate)) if result is None else result.when(hit, F.lit(truncate))
    return result


def merge_history(spark: SparkSession, step: TableStep, source: DataFrame, *, types: TableTypes) -> None:
    """Apply every typed event of ``step`` (``source``) as a version row of the SCD2 table at its ``path``
    in one commit with its ``progress`` (see module docstring); ``replace`` overwrites the table.

    ``whole_rows`` says no event of ``source`` lacks a column: nothing is then filled from the table's
    current versions (which are not read). ``inserts_only`` appends the versions instead of merging
    them when no key of the batch (``keys`` when known) is current in the table (rule 7).
    """
    from pyspark.sql import functions as F

    path, columns, progress, truncates, fills = step.path, step.stored_columns, step.recorded, step.truncates, step.fills
    replace, inserts_only, keys, whole_rows = step.replace, step.inserts_only, step.keys, step.whole_rows

    names = [n for n, _ in columns]
    ddl = ", ".join(f"{quote(n)} {t}" for n, t in columns) + ", " + HISTORY_META_DDL
    keyless_delete = F.col(KEY).isNull() & (F.col(OP) == "d")
    events = source.filter(F.col("_cdc_error").isNull() & (F.col(OP) != "t") & ~keyless_delete)
    if not replace:
        types.ensure(spark, path, ddl, HISTORY_PARTITIONS)
        if not whole_rows:
            events = _fill_from_current(spark, path, events, names)
    versions = filled_rows(
        _versions(events, names, truncates),
        fills,
        "_cdc_valid_from_lsn",
        "_cdc_valid_from_seq",
        "_cdc_valid_to_lsn,_cdc_valid_to_seq",
    )
    if replace:
        overwrite(versions.drop("_rank"), path, progress, types, HISTORY_PARTITIONS)
        return
    if step.keyless and not truncates and not fills:
        # rule 9: a keyless version ends no other, so the MERGE would insert every version
        append(spark, path, versions.drop("_rank"), progress)
        return
    if inserts_only and not fills and not meets_table(spark, path, events, keys, current_only=True):
        append(spark, path, versions.drop("_rank"), progress)
        return
    _merge_versions(spark, path, _with_closes(versions, columns, truncates), names, truncates, progress, fills)


def _versions(events: DataFrame, names: list[str], truncates: tuple[int, ...]) -> DataFrame:
    """One version row per event: valid from the event, to the key's next event (a delete: to itself;
    a truncate in between: to the truncate), with ``_rank`` the event's place among its key's. A keyless
    event's version has no next event (only a truncate ends it) and rank 1."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    by_key = Window.partitionBy(KEY).orderBy(LSN, SEQ)
    keyed = F.col(KEY).isNotNull()
    nxt = events.select(
        "*",
        F.when(keyed, F.lead(LSN).over(by_key)).alias("_next_lsn"),
        F.when(keyed, F.lead(SEQ).over(by_key)).alias("_next_seq"),
        F.when(keyed, F.lead(TS).over(by_key)).alias("_next_ts"),
        F.when(keyed, F.row_number().over(by_key)).otherwise(F.lit(1)).alias("_rank"),
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
    return versions


def _with_closes(versions: DataFrame, columns: list[tuple[str, str]], truncates: tuple[int, ...]) -> DataFrame:
    """The staged union: every version (``_merge_key`` NULL, inserted), and per key a *close* row keyed
    ``_merge_key`` that ends the table's current version where the batch's first version (or an earlier
    truncate) begins."""
    from pyspark.sql import functions as F

    names = [n for n, _ in columns]
    first = versions.filter((F.col("_rank") == 1) & F.col(KEY).isNotNull())  # a keyless version ends no other
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
    return staged.unionByName(close_full)


def _merge_versions(
    spark: SparkSession,
    path: str,
    merged: DataFrame,
    names: list[str],
    truncates: tuple[int, ...],
    progress: Progress,
    fills: tuple[Fill, ...] = (),
) -> None:
    """The MERGE of the staged union into the table at ``path``, in one commit carrying ``progress``: a
    close row ends the key's current version when it is newer, a version row is inserted, and a
    truncate ends every current version that began before it."""
    newer = (
        "(s._cdc_valid_from_lsn > t._cdc_valid_from_lsn OR "
        "(s._cdc_valid_from_lsn = t._cdc_valid_from_lsn AND s._cdc_valid_from_seq > t._cdc_valid_from_seq))"
    )
    insert = {quote(n): f"s.{quote(n)}" for n in names}
    insert.update(
        {
            c: f"s.{c}"
            for c in (
                KEY,
                "_cdc_valid_from_lsn",
                "_cdc_valid_from_seq",
                "_cdc_valid_from_ts",
                "_cdc_valid_to_lsn",
                "_cdc_valid_to_seq",
                "_cdc_valid_to_ts",
                "_cdc_is_current",
                OP,
            )
        }
    )
    t_from = ("t._cdc_valid_from_lsn", "t._cdc_valid_from_seq")
    builder = (
        merge_into(spark, path, merged, f"t.{KEY} = s._merge_key AND t._cdc_is_current")
        .when_matched_update(
            {
                "_cdc_valid_to_lsn": "s._cdc_valid_from_lsn",
                "_cdc_valid_to_seq": "s._cdc_valid_from_seq",
                "_cdc_valid_to_ts": "s._cdc_valid_from_ts",
                "_cdc_is_current": "false",
                **{
                    column: value
                    for fill in fills
                    for column, value in fill_set(
                        (fill,), fill.at_or_after("s._cdc_valid_from_lsn", "s._cdc_valid_from_seq"), *t_from
                    ).items()
                },
            },
            condition=newer,
        )
        .when_not_matched_insert(insert, condition="s._merge_key IS NULL")
    )
    if truncates:
        first_t = min(truncates)
        ended = {
            column: value
            for fill in fills
            for column, value in fill_set((fill,), fill.at_or_after(str(first_t), "-1"), *t_from).items()
        }
        builder = builder.when_not_matched_by_source_update(
            {"_cdc_valid_to_lsn": str(first_t), "_cdc_valid_to_seq": "-1", "_cdc_is_current": "false", **ended},
            condition=f"t._cdc_is_current AND t._cdc_valid_from_lsn < {first_t}",
        )
    if fills:
        before = " OR ".join(fill.before(*t_from) for fill in fills)
        builder = builder.when_not_matched_by_source_update(
            fill_set(fills, "true", *t_from), condition=f"t._cdc_is_current AND ({before})"
        )
    with committing(spark, progress):
        builder.execute()


def _fill_from_current(spark: SparkSession, path: str, events: DataFrame, names: list[str]) -> DataFrame:
    """Take the columns a batch's first partial event lacks from the key's current version in ``path``."""
    from pyspark.sql import functions as F

    current = (
        spark.read.format("delta")
        .load(path)
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
