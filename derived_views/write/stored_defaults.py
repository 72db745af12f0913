"""The values of added columns that rows older than the column hold, applied to a view table with its batch.

A column added in the source with a constant default (``ALTER TABLE ... ADD COLUMN c ... DEFAULT v``)
gives every existing row ``c = v`` without a change event; capture writes that fact into the column's
entry of the table's schema record (``"filled": {"value", "lsn", "sequence"}``, docs/event-format.md):
*every row whose last event is before (P, S) holds v*. A view applies it in the commit of the batch
whose range holds (P, S), which is the batch whose watermark first reaches P (the schema topic is read
at the same watermark as the events, so the fact and every event before it arrive together or the fact
later; never before its events):

- in the batch's rows, an event before (P, S) gets ``c = v`` (it was written without the column;
  events at or after carry their own value, left as they are);
- in the table's rows the batch does not touch, the MERGE's ``WHEN NOT MATCHED BY SOURCE`` clause sets
  ``c = v`` on every row before (P, S) (every row there is: the table is as of an earlier watermark);
- a history table keeps versions as of their own events: a version that was current at (P, S) (begun
  before it, ended at or after it or not at all) holds v, for its whole span (a version is not split at
  a schema change); a version that ended before (P, S) keeps null, as the column did not exist then.

So the table changes in the batch's one commit, with its progress: applying the batch again (a crash
before the progress) repeats the same commit, and a batch after it no longer holds the fact in its range
(P is at or before its start). A rebuild (:func:`~derived_views.write.steps.rebuild_in_one_pass`) reads every
event and every fact in one batch, so it writes the same table as the batches one by one.

The value is typed by the very parsing that types the events (:func:`~derived_views.events.spark_typing.typed`
over an event carrying it), then written into the MERGE as a Spark SQL expression (its JSON text read
back by ``from_json``), which is checked to give the same value before it is used: a value it does not
give stops the table's step with an error naming the column (never a null in its place). A value the
column's Spark type cannot hold (``infinity`` in a date) makes the column text, as such a value in an
event does (:class:`NeedsTextError`, caught where the batch's column types are chosen).

A fact as a view applies it is a :class:`~derived_views.source.table_step.Fill`: defined with the table's
step that carries it (below this layer, so that the step's value can hold it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import orjson

from derived_views.errors import ViewError
from derived_views.events.column_names import quote
from derived_views.events.metadata_columns import LSN, SEQ
from derived_views.events.reduction import EVENT_DDL
from derived_views.events.schema import TableSchema, sql_string
from derived_views.events.spark_typing import typed
from derived_views.source.table_step import Fill

if TYPE_CHECKING:
    from pyspark.sql import Column as SparkColumn
    from pyspark.sql import DataFrame, SparkSession

#: ``to_json``/``from_json`` options that keep every digit of a timestamp (the default keeps milliseconds)
_JSON_OPTIONS = {
    "timestampFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX",
    "timestampNTZFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSS",
    "allowNonNumericNumbers": "true",
}


class NeedsTextError(Exception):
    """A fact's value that its column's Spark type cannot hold (``infinity`` in a date column, ...): the
    column is then stored as text, as for an event holding such a value (:attr:`columns`: source names)."""

    def __init__(self, columns: tuple[str, ...]) -> None:
        super().__init__(", ".join(columns))
        self.columns = columns


def fills_for(
    spark: SparkSession, schema: TableSchema, since: int | None, columns: list[tuple[str, str]], stored_as: dict[str, str]
) -> tuple[Fill, ...]:
    """The facts of ``schema`` a batch after LSN ``since`` applies (all of them when ``None``: a new or
    rebuilt table), for the columns of ``columns`` (source name, view type), named as ``stored_as`` says."""
    types = dict(columns)
    wanted = [
        column
        for column in schema.columns
        if column.filled is not None and column.name in types and (since is None or column.filled.lsn > since)
    ]
    if not wanted:
        return ()
    view_columns = [(column.name, types[column.name]) for column in wanted]
    after = b"{" + b",".join(orjson.dumps(c.name) + b":" + c.filled.value for c in wanted if c.filled) + b"}"
    event = spark.createDataFrame(
        [(schema.topic, 0, 0, None, "c", 0, 0, 0, '{"after":' + after.decode() + "}", [], None)], EVENT_DDL
    )
    row = typed(event, view_columns, schema.qualified, stored_as={c.name: f"v{i}" for i, c in enumerate(wanted)})
    error = row.select("_cdc_error", "_cdc_widen").first()
    if error is not None and error[0]:
        if error[1]:
            raise NeedsTextError(tuple(str(name) for name in error[1]))
        raise ViewError(f"{schema.qualified}: the value older rows hold in an added column does not fit the view: {error[0]}")
    fills = []
    for index, column in enumerate(wanted):
        assert column.filled is not None
        spark_type = types[column.name]
        text = row.select(_to_json(f"v{index}")).first()
        assert text is not None
        expression = f"from_json({sql_string(str(text[0]))}, {sql_string('v ' + spark_type)}, {_options_sql()}).v"
        same = row.select(_same(expression, f"v{index}")).first()
        if same is None or not same[0]:
            raise ViewError(
                f"{schema.qualified}: the value older rows hold in column {column.name} cannot be written exactly "
                f"as a {spark_type} expression; rebuild the view after capture reads the table again (cdc snapshot)"
            )
        fills.append(Fill(stored_as.get(column.name, column.name), expression, column.filled.lsn, column.filled.sequence))
    return tuple(fills)


def _to_json(name: str) -> SparkColumn:
    from pyspark.sql import functions as F

    return F.to_json(F.struct(F.col(name).alias("v")), _JSON_OPTIONS)


def _same(expression: str, name: str) -> SparkColumn:
    from pyspark.sql import functions as F

    return F.expr(f"{expression} <=> {quote(name)}")


def _options_sql() -> str:
    return "map(" + ", ".join(f"{sql_string(k)}, {sql_string(v)}" for k, v in _JSON_OPTIONS.items()) + ")"


def filled_rows(frame: DataFrame, fills: tuple[Fill, ...], lsn: str = LSN, seq: str = SEQ, upto: str | None = None) -> DataFrame:
    """``frame`` with each fill's column set to its value where the row's position ``(lsn, seq)`` is before
    the fill's (and, with ``upto``, the position ``upto`` names, ``<lsn column>,<seq column>`` where the
    row ends, NULL for never, is at or after it: a version current at the fill's position)."""
    from pyspark.sql import functions as F

    for fill in fills:
        condition = fill.before(lsn, seq)
        if upto is not None:
            end_lsn, end_seq = upto.split(",")
            condition = f"{condition} AND ({end_lsn} IS NULL OR {fill.at_or_after(end_lsn, end_seq)})"
        frame = frame.withColumn(fill.column, F.when(F.expr(condition), F.expr(fill.value)).otherwise(F.col(quote(fill.column))))
    return frame


def fill_set(fills: tuple[Fill, ...], condition: str, lsn: str, seq: str) -> dict[str, str]:
    """MERGE ``SET`` assignments for a target row ``t`` under ``condition``: each fill's column gets its
    value where ``t``'s position ``(lsn, seq)`` is before the fill's, else keeps its own."""
    return {
        quote(fill.column): f"CASE WHEN {condition} AND {fill.before(lsn, seq)} THEN {fill.value} ELSE t.{quote(fill.column)} END"
        for fill in fills
    }
