"""Rows typed by Arrow in the same parse that reduces them: each envelope is parsed once.

The vectorised reduction (:func:`derived_views.events.arrow_reduction.reduce_vectorised`) parses every envelope with
Arrow's JSON reader to learn its op and position (:func:`parse_envelopes`). Given the view's columns,
that same parse also reads ``after`` and ``before`` into typed Arrow columns (:func:`row_type`,
:func:`typed_images`), and the reduced rows carry them
(``parsed`` true) instead of the envelope's text, so Spark never parses those envelopes again
(:func:`derived_views.events.spark_typing.typed`).

Exactness rests on Arrow's reader being stricter than Spark's ``from_json`` on every value capture
writes (``docs/event-format.md``): a value Arrow cannot hold exactly in the column's type (a number
too large, a decimal with more digits than the scale, ``"NaN"`` in a float column, ``"infinity"`` in
a date column, a multi-dimensional array, a duplicate field) fails the whole parse, and that log
partition's rows then keep their envelope text (``parsed`` false) for Spark to parse, which finds the
values a column's type cannot hold (its column then becomes text, :mod:`derived_views.events.column_types`)
and names poison values as it always did. So a typed row is never a poison row, and holds the values Spark
would have parsed. Columns whose values Arrow cannot parse exactly at all (``binary``, which the log
carries as base64, and arrays of dates) leave the whole table to Spark (:func:`row_type` is ``None``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from derived_views.events.column_names import quote

#: Spark type (DDL form) -> Arrow type name, for types Arrow's JSON reader parses as Spark does.
_ARROW_TYPES = {
    "smallint": "int16",
    "int": "int32",
    "bigint": "int64",
    "float": "float32",
    "double": "float64",
    "boolean": "bool_",
    "string": "string",
    "date": "date32",
    "timestamp": "timestamp_utc",
    "timestamp_ntz": "timestamp_us",
}
_DECIMAL = re.compile(r"decimal\((\d+),\s*(\d+)\)")


def arrow_type(spark_type: str, *, in_array: bool = False) -> Any | None:
    """The Arrow type a value of ``spark_type`` is parsed into, or ``None`` when Arrow cannot parse it
    exactly (``binary``; a ``date`` inside an array)."""
    import pyarrow as pa

    if spark_type.startswith("array<") and spark_type.endswith(">"):
        element = arrow_type(spark_type[len("array<") : -1], in_array=True)
        return None if element is None else pa.list_(element)
    decimal = _DECIMAL.fullmatch(spark_type)
    if decimal:
        return pa.decimal128(int(decimal[1]), int(decimal[2]))
    name = _ARROW_TYPES.get(spark_type)
    if name is None or (in_array and name == "date32"):
        return None
    if name == "timestamp_utc":
        return pa.timestamp("us", tz="UTC")
    if name == "timestamp_us":
        return pa.timestamp("us")
    return getattr(pa, name)()


def row_type(columns: Sequence[tuple[str, str]]) -> Any | None:
    """The Arrow struct of a row of ``columns`` (``(name, Spark type)``), or ``None`` when a column's
    values cannot be typed by Arrow (the table's envelopes are then parsed by Spark)."""
    import pyarrow as pa

    fields = []
    for name, spark_type in columns:
        typ = arrow_type(spark_type)
        if typ is None:
            return None
        fields.append(pa.field(name, typ))
    return pa.struct(fields)


def parse_type(row: Any) -> Any:
    """The struct Arrow's JSON reader fills for ``row``: dates as text (it reads dates from numbers
    only), converted by :func:`finish`."""
    import pyarrow as pa

    return pa.struct([pa.field(f.name, pa.string()) if f.type == pa.date32() else f for f in row])


def finish(parsed: Any, row: Any) -> Any:
    """A parsed struct column (of :func:`parse_type`) as ``row``: dates converted from their text.

    Raises ``pyarrow.ArrowInvalid`` for a date that is not ``YYYY-MM-DD`` (``infinity``, a year past
    9999 or before 1): the caller then leaves the partition to Spark.
    """
    import pyarrow as pa

    if parse_type(row) == row:
        return parsed
    parsed = parsed.combine_chunks() if isinstance(parsed, pa.ChunkedArray) else parsed
    children = [
        child.cast(field.type) if child.type != field.type else child for child, field in zip(parsed.flatten(), row, strict=True)
    ]
    return pa.StructArray.from_arrays(children, fields=list(row), mask=parsed.is_null())


def typed_ddl(columns: Sequence[tuple[str, str]]) -> str:
    """The Spark DDL of the columns typed rows add to :data:`derived_views.events.reduction.EVENT_DDL`."""
    struct = ", ".join(f"{quote(name)}: {spark_type}" for name, spark_type in columns)
    return f"parsed boolean, after struct<{struct}>, before struct<{struct}>"


def parse_envelopes(texts: list[Any], row: Any | None) -> Any | None:
    """The envelopes' op and position (and, with ``row``, their ``after`` and ``before`` as
    :func:`parse_type` of it) parsed by Arrow; ``None`` when Arrow cannot parse them so."""
    import pyarrow as pa
    import pyarrow.json as pj

    fields = [("op", pa.string()), ("source", pa.struct([("lsn", pa.int64()), ("sequence", pa.int64()), ("ts_ms", pa.int64())]))]
    if row is not None:
        fields += [("after", parse_type(row)), ("before", parse_type(row))]
    try:
        return pa.concat_tables(
            [
                pj.read_json(
                    pa.BufferReader(text),
                    read_options=pj.ReadOptions(use_threads=False, block_size=1 << 24),
                    parse_options=pj.ParseOptions(explicit_schema=pa.schema(fields), unexpected_field_behavior="ignore"),
                )
                for text in texts
            ]
        )
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        return None


def typed_images(parsed: Any, row: Any) -> tuple[Any, Any] | None:
    """The typed ``after`` and ``before`` columns of parsed envelopes (``before`` only where there is no
    ``after``: a row's values come from its ``after`` when it has one); ``None`` when a value does not
    convert (see :func:`finish`)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    try:
        after = finish(parsed.column("after").combine_chunks(), row)
        before = finish(parsed.column("before").combine_chunks(), row)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        return None
    if after.null_count < len(after):
        before = pa.StructArray.from_arrays(before.flatten(), fields=list(row), mask=pc.or_(before.is_null(), after.is_valid()))
    return after, before
