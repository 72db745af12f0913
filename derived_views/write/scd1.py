"""One row per key (SCD type 1): the current tables of the warehouse and the views' own copies.

The rules every view table keeps are in :mod:`derived_views.write.apply`.

:func:`merge_current` MERGE, target ``t`` on ``t._cdc_key = s._cdc_key``, clauses in this order:

- ``WHEN MATCHED AND s is newer AND s._cdc_op = 'd' THEN DELETE``
- ``WHEN MATCHED AND s is newer THEN UPDATE SET`` every column (an unchanged column keeps ``t``'s value;
  a batch without partial rows sets every column from ``s``, so only ``t``'s key and position are read);
  in a batch that holds a truncate (a truncate, or a re-read's marker), a column of the table that the
  events no longer carry is set to NULL
- ``WHEN NOT MATCHED AND s._cdc_op <> 'd' THEN INSERT``
- ``WHEN NOT MATCHED BY SOURCE AND t._cdc_lsn < truncate_lsn THEN DELETE`` (only when the batch
  holds a truncate)
- ``WHEN NOT MATCHED BY SOURCE AND t is before a fill THEN UPDATE SET`` each filled column (only when
  the batch's range holds the position of a column added with a stored default, see
  :mod:`derived_views.write.stored_defaults`; the batch's own rows before it get the value in ``s``)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from derived_views.engine.commit_progress import committing
from derived_views.engine.delta_sql import merge_into
from derived_views.events.column_names import quote
from derived_views.events.metadata_columns import KEY, LSN, OP, SEQ, TS, UNCHANGED
from derived_views.events.schema import sql_string
from derived_views.source.table_step import TableStep
from derived_views.write.apply import append, meets_table, newer, overwrite
from derived_views.write.stored_defaults import fill_set, filled_rows

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from derived_views.write.table_evolution import TableTypes


CURRENT_META_DDL = f"{KEY} string, {LSN} bigint, {SEQ} bigint, {TS} timestamp, {OP} string"


def merge_current(spark: SparkSession, step: TableStep, source: DataFrame, *, types: TableTypes) -> None:
    """Apply ``step``'s latest-per-key typed rows (``source``) to the SCD1 table at its ``path`` in one
    commit with its ``progress`` (see module docstring); ``replace`` overwrites the table.

    ``inserts_only`` appends the rows when none of their keys (``keys`` when known, else collected from
    ``source``) is in the table (rule 7). ``whole_rows`` says no row of ``source`` lacks a column
    (``unchanged`` is empty everywhere): the update then takes every column from the source, so the
    MERGE reads only the target's key and position columns instead of whole rows.
    """
    from pyspark.sql import functions as F

    path, columns, progress, truncates, fills = step.path, step.stored_columns, step.recorded, step.truncates, step.fills
    replace, inserts_only, keys, whole_rows = step.replace, step.inserts_only, step.keys, step.whole_rows

    rows = filled_rows(source.filter(F.col("_cdc_error").isNull() & (F.col(OP) != "t")), fills)
    names = [n for n, _ in columns]
    ddl = ", ".join(f"{quote(n)} {t}" for n, t in columns) + ", " + CURRENT_META_DDL
    if replace:
        kept = rows.filter(F.col(OP) != "d").select(*[quote(n) for n in names], KEY, LSN, SEQ, TS, OP)
        overwrite(kept, path, progress, types)
        return
    types.ensure(spark, path, ddl)
    if step.keyless and not truncates and not fills:
        # rule 9: no row of the batch can match, so the MERGE would insert every row but the deletes
        append(spark, path, rows.filter(F.col(OP) != "d").select(*[quote(n) for n in names], KEY, LSN, SEQ, TS, OP), progress)
        return
    if inserts_only and not fills and not meets_table(spark, path, rows, keys):
        append(spark, path, rows.select(*[quote(n) for n in names], KEY, LSN, SEQ, TS, OP), progress)
        return
    update = {
        quote(n): f"s.{quote(n)}"
        if whole_rows
        else f"CASE WHEN array_contains(s.{UNCHANGED}, {sql_string(n)}) THEN t.{quote(n)} ELSE s.{quote(n)} END"
        for n in names
    }
    if truncates:
        # the rows a read after a truncate marker writes replace the table's rows whole: a column the
        # events no longer carry (dropped, or left out of the publication's column list) is NULL in them,
        # as in the rows inserted, so no value of it written before stays in a current row
        held = types.of(spark, path) or {}
        update.update({quote(c): "NULL" for c in held if c not in names and c not in (KEY, LSN, SEQ, TS, OP)})
    meta = {c: f"s.{c}" for c in (KEY, LSN, SEQ, TS, OP)}
    insert = {**{quote(n): f"s.{quote(n)}" for n in names}, **meta}
    builder = (
        merge_into(spark, path, rows, f"t.{KEY} = s.{KEY}")
        .when_matched_delete(condition=f"{newer()} AND s.{OP} = 'd'")
        .when_matched_update({**update, **meta}, condition=newer())
        .when_not_matched_insert(insert, condition=f"s.{OP} <> 'd'")
    )
    if truncates:
        builder = builder.when_not_matched_by_source_delete(condition=f"t.{LSN} < {max(truncates)}")
    if fills:
        before = " OR ".join(fill.before(f"t.{LSN}", f"t.{SEQ}") for fill in fills)
        builder = builder.when_not_matched_by_source_update(fill_set(fills, "true", f"t.{LSN}", f"t.{SEQ}"), condition=before)
    with committing(spark, progress):
        builder.execute()
