"""Change events typed by Spark: each envelope parsed once into the view's columns, poison kept and named.

:func:`typed` turns reduced events (rows of :data:`~derived_views.events.reduction.EVENT_DDL`) into typed
rows: the data columns, then :data:`~derived_views.events.metadata_columns.TYPED_METADATA`. A value that
does not fit its column marks the event as poison (``_cdc_error``), never a silent null.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from derived_views.events.column_names import quote, stored_names
from derived_views.events.column_types import MISREAD_DATE, out_of_range
from derived_views.events.metadata_columns import KEY, LSN, OP, SEQ, TS, TYPED_METADATA, UNCHANGED

if TYPE_CHECKING:
    from pyspark.sql import Column as SparkColumn
    from pyspark.sql import DataFrame


#: How events are parsed: ``((from LSN, from sequence), (name, Spark type) of each column)`` in position
#: order, see :meth:`derived_views.events.schema.TableSchema.parse_plan`.
Plan = list[tuple[tuple[int, int], list[tuple[str, str]]]]


def _before(position: tuple[int, int]) -> SparkColumn:
    """Whether an event's ``(lsn, seq)`` is before ``position``."""
    from pyspark.sql import functions as F

    lsn, seq = position
    return (F.col("lsn") < F.lit(lsn)) | ((F.col("lsn") == F.lit(lsn)) & (F.col("seq") < F.lit(seq)))


def _by_version(plan: Plan, parse: Callable[[list[tuple[str, str]]], SparkColumn]) -> SparkColumn:
    """``parse(types)`` with the types of the version in force at each event's position."""
    from pyspark.sql import functions as F

    if len(plan) == 1:
        return parse(plan[0][1])
    result = F.when(_before(plan[1][0]), parse(plan[0][1]))
    for (_, types), (upto, _) in zip(plan[1:-1], plan[2:], strict=True):
        result = result.when(_before(upto), parse(types))
    return result.otherwise(parse(plan[-1][1]))


def _json_path(*names: str) -> str:
    return "$" + "".join("['" + name.replace("'", "") + "']" for name in names)


def typed(
    events: DataFrame,
    columns: list[tuple[str, str]],
    table: str,
    plan: Plan | None = None,
    *,
    stored_as: Mapping[str, str] | None = None,
) -> DataFrame:
    """Typed rows: the data columns parsed from the event (after, else before, else key) plus metadata.

    Events typed by Arrow in the reduction (``parsed`` true, :mod:`derived_views.events.typed_rows`) bring
    their ``after`` and ``before`` rows; any other envelope (``value``) is parsed once by Spark into
    them, with the column types in force at the event's LSN (``plan``, default: ``columns`` throughout), then cast to
    ``columns`` (the view's types, which hold every version's values) under their stored names
    (``stored_as``, by default those of a new table: :mod:`derived_views.events.column_names`, as are the names
    ``_cdc_unchanged`` lists). ``_cdc_error`` is set on poison
    events: an unreadable envelope, or values that do not fit; it names each column, its type and the
    value that does not fit. ``_cdc_widen`` lists the columns of a poison event that a string column
    holds the value of (:data:`~derived_views.events.batch_facts.BatchFacts.widen`): a date, timestamp or
    decimal column (or an array of them) holding a value PostgreSQL has and its type cannot hold
    (:func:`~derived_views.events.column_types.out_of_range`), and an array column holding a
    multi-dimensional array.
    """
    from pyspark.sql import functions as F

    plan = plan or [((0, 0), columns)]
    parsed = _parsed(events, columns, plan)
    has_after = F.col("_cdc_env.after").isNotNull()
    has_before = F.col("_cdc_env.before").isNotNull()
    corrupt = (F.col("op") != "t") & (
        F.col("_cdc_env._cdc_corrupt").isNotNull() | F.col("_cdc_keyed._cdc_corrupt").isNotNull() | _misread_dates(columns)
    )
    bad, widen = _misfits(columns, plan, table, corrupt)
    renamed = (
        stored_names([name for name, _ in columns], table)
        if stored_as is None
        else {n: s for n, s in stored_as.items() if s != n}
    )
    metadata = {
        KEY: F.col("key"),
        LSN: F.col("lsn"),
        SEQ: F.col("seq"),
        TS: F.timestamp_millis(F.col("commit_ts_ms")),
        OP: F.col("op"),
        UNCHANGED: _stored_unchanged(F.col("unchanged"), renamed),
        "_cdc_topic": F.col("topic"),
        "_cdc_partition": F.col("partition"),
        "_cdc_offset": F.col("offset"),
        "_cdc_raw": F.coalesce(F.col("value"), F.col("key")),
        "_cdc_error": F.coalesce(F.col("error"), bad),
        "_cdc_widen": F.when(corrupt, F.array_compact(F.array(*widen)) if widen else F.array().cast("array<string>")),
    }
    return parsed.select(
        *[
            F.when(has_after, F.col("_cdc_env.after").getField(name))
            .when(has_before, F.col("_cdc_env.before").getField(name))
            .otherwise(F.col("_cdc_keyed").getField(name))
            .alias(renamed.get(name, name))
            for name, _ in columns
        ],
        *[metadata[name].alias(name) for name, _ in TYPED_METADATA],
    )


#: JSON parsing that keeps a row it cannot read, naming it in ``_cdc_corrupt``
_PERMISSIVE = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": "_cdc_corrupt"}


def _parsed(events: DataFrame, columns: list[tuple[str, str]], plan: Plan) -> DataFrame:
    """``events`` with ``_cdc_env`` (the envelope's ``after`` and ``before``, as parsed by Arrow or else
    by Spark with the types in force at each event's LSN, cast to ``columns``) and ``_cdc_keyed`` (the
    key's columns, for an event with neither)."""
    from pyspark.sql import functions as F

    view_envelope = f"struct<after: struct<{_struct_ddl(columns)}>, before: struct<{_struct_ddl(columns)}>, _cdc_corrupt: string>"
    view_key = f"struct<{_struct_ddl(columns)}, _cdc_corrupt: string>"

    def envelope(types: list[tuple[str, str]]) -> SparkColumn:
        parsed = F.from_json(
            F.col("value"),
            f"after struct<{_struct_ddl(types)}>, before struct<{_struct_ddl(types)}>, _cdc_corrupt string",
            _PERMISSIVE,
        )
        return parsed if types == columns else parsed.cast(view_envelope)

    def keyed(types: list[tuple[str, str]]) -> SparkColumn:
        parsed = F.from_json(F.col("key"), ", ".join(f"{quote(n)} {t}" for n, t in types) + ", _cdc_corrupt string", _PERMISSIVE)
        return parsed if types == columns else parsed.cast(view_key)

    env = _by_version(plan, envelope)
    if "parsed" in events.columns:  # typed by Arrow where it could (see derived_views.events.typed_rows)
        env = F.when(
            F.col("parsed"),
            F.struct(
                F.col("after").alias("after"), F.col("before").alias("before"), F.lit(None).cast("string").alias("_cdc_corrupt")
            ),
        ).otherwise(env)
    # the two JSON parses (not compiled by Spark) get projections of their own, so that the one
    # picking the columns, which refers to them many times, is compiled
    has_after = F.col("_cdc_env.after").isNotNull()
    has_before = F.col("_cdc_env.before").isNotNull()
    return events.select("*", env.alias("_cdc_env")).select(
        "*", F.when(~has_after & ~has_before & F.col("key").isNotNull(), _by_version(plan, keyed)).alias("_cdc_keyed")
    )


def _column_text(name: str) -> SparkColumn:
    """The JSON text of column ``name`` in an event: its ``after``, else its ``before``, else (a
    tombstone) its key."""
    from pyspark.sql import functions as F

    return F.coalesce(
        F.get_json_object(F.col("value"), _json_path("after", name)),
        F.get_json_object(F.col("value"), _json_path("before", name)),
        F.when(F.col("value").isNull(), F.get_json_object(F.col("key"), _json_path(name))),
    )


#: View types whose values Spark's JSON reader may read as another date (see :func:`_misread_dates`).
_DATES = ("date", "array<date>")


def _misread_dates(columns: list[tuple[str, str]]) -> SparkColumn:
    """Whether an event holds a date that Spark's JSON reader takes without failing, as another value
    (:data:`~derived_views.events.column_types.MISREAD_DATE`). Such a date is a misfit like ``infinity``: its
    column becomes text."""
    from pyspark.sql import functions as F

    checks = [F.coalesce(_column_text(name).rlike(MISREAD_DATE), F.lit(False)) for name, view in columns if view in _DATES]
    result = F.lit(False)
    for check in checks:
        result = result | check
    return result


def _misfits(
    columns: list[tuple[str, str]], plan: Plan, table: str, corrupt: SparkColumn
) -> tuple[SparkColumn, list[SparkColumn]]:
    """The error of a poison event (``corrupt``): each column whose value (in ``after``, ``before``, or
    for a tombstone the key) does not fit its type, with the value; and the names of the columns a
    string column would hold the value of (see :func:`typed`)."""
    from pyspark.sql import functions as F

    misfits = []
    widen = []
    for index, (name, view_type) in enumerate(columns):

        def single(types: list[tuple[str, str]], index: int = index) -> SparkColumn:
            one = _struct_ddl([types[index]])
            return (
                F.from_json(F.col("value"), f"after struct<{one}>, before struct<{one}>, _cdc_corrupt string", _PERMISSIVE)
                .getField("_cdc_corrupt")
                .isNotNull()
            )

        def single_key(types: list[tuple[str, str]], index: int = index) -> SparkColumn:
            name, spark_type = types[index]
            parsed = F.from_json(F.col("key"), f"{quote(name)} {spark_type}, _cdc_corrupt string", _PERMISSIVE)
            return F.get_json_object(F.col("key"), _json_path(name)).isNotNull() & parsed.getField("_cdc_corrupt").isNotNull()

        text = _column_text(name)
        bad = F.when(F.col("value").isNotNull(), _by_version(plan, single)).otherwise(
            F.col("key").isNotNull() & _by_version(plan, single_key)
        )
        if view_type in _DATES:
            bad = bad | F.coalesce(text.rlike(MISREAD_DATE), F.lit(False))
        misfits.append(
            F.when(
                bad,
                F.concat(
                    F.lit(f"column {quote(name)} ({view_type}) cannot hold "),
                    F.coalesce(F.substring(text, 1, 200), F.lit("its value")),
                ),
            )
        )
        pattern = out_of_range(view_type)
        if pattern is not None:
            widen.append(F.when(bad & text.rlike(pattern), F.lit(name)))
        elif view_type.startswith("array<") and not view_type.startswith("array<array<"):
            widen.append(F.when(bad & text.startswith("[["), F.lit(name)))
    detail = F.concat_ws("; ", *misfits) if misfits else F.lit("")
    ddl = ", ".join(f"{quote(n)} {t}" for n, t in columns)
    error = F.when(
        corrupt,
        F.concat(
            F.lit(f"values do not fit the columns of {table}: "),
            F.when(detail != "", detail).otherwise(F.lit(f"the key or the envelope does not fit ({ddl})")),
        ),
    )
    return error, widen


def _stored_unchanged(unchanged: SparkColumn, renamed: dict[str, str]) -> SparkColumn:
    """An event's list of unchanged columns, each under its stored name (``renamed``: source -> stored)."""
    from pyspark.sql import functions as F

    if not renamed:
        return unchanged

    (first, first_stored), *rest = renamed.items()

    def one(name: SparkColumn) -> SparkColumn:
        result = F.when(name == F.lit(first), F.lit(first_stored))
        for source, target in rest:
            result = result.when(name == F.lit(source), F.lit(target))
        return result.otherwise(name)

    return F.transform(unchanged, one)


def widened(frame: DataFrame) -> tuple[str, ...]:
    """The column names of ``frame``'s ``_cdc_widen`` lists (poison events whose values a string column holds)."""
    from pyspark.sql import functions as F

    rows = frame.filter(F.size("_cdc_widen") > 0).select(F.explode("_cdc_widen").alias("name")).distinct().collect()
    return tuple(sorted(row["name"] for row in rows))


def _struct_ddl(columns: list[tuple[str, str]]) -> str:
    return ", ".join(f"{quote(n)}: {t}" for n, t in columns)
