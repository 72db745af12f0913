"""A view column's Spark type when its source column changes type, and the text form of earlier values.

A source column can change type (``ALTER TABLE ... ALTER COLUMN ... TYPE``), be dropped and added again
with another type, or hold a value its declared type does not describe (a multi-dimensional array in
an ``int[]`` column). A view table keeps every version of a row (history) or rows written before the
change (current state, for rows the change did not rewrite), so its column must hold the values of
every type the column has had. :func:`supertype` gives the narrowest Spark type that holds two types'
values exactly:

===============================================  ============================================
types                                            view type
===============================================  ============================================
the same type                                    that type
smallint / int / bigint                          the wider one
float and double                                 double
float or double with smallint or int             double (exact for both)
decimals, or a decimal with an integer type      a decimal with the most integer digits and the
                                                 largest scale, when that fits 38 digits
anything else                                    string
===============================================  ============================================

A column also becomes ``string`` when one of its values is one its Spark type cannot hold
(:func:`out_of_range`): PostgreSQL's dates and timestamps reach from 4713 BC to years past 9999
and hold ``infinity`` and ``-infinity``, and its ``numeric(p, s)`` holds ``NaN`` (an unconstrained
``numeric``, also ``±Infinity``, is ``string`` from the start), none of which Spark's ``date``,
``timestamp``, ``timestamp_ntz`` or ``decimal`` holds (nor does Spark's JSON reader read a BC date
or one past 9999 as itself: :data:`MISREAD_DATE`). Rather than lose the row (a poison event) or
write a placeholder, such a column holds every value as its event's text from then on; a rebuild that
reads such a value types the column the same way (a current-state table rebuilt after every such
value was updated away reads none, and keeps the narrower type, with equal values).

A ``string`` view column holds each value as the JSON text its event carried: a string's content, or
the literal text of a number, boolean, array or object (Spark parses any JSON value into a string
column that way). Values already in a table whose column becomes ``string`` are rewritten to the same
form by :func:`as_text` (numbers and booleans as their text, timestamps in ISO form with microseconds
and the server's fraction digits, binary as base64, arrays as compact JSON with the elements the
events carry as strings, decimals, dates, timestamps and binary, as strings), so a table converted on
the way reads as one rebuilt from the log.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import Column as SparkColumn

_INTEGRAL = ("smallint", "int", "bigint")
_INTEGER_DIGITS = {"smallint": 5, "int": 10, "bigint": 19}
_DECIMAL = re.compile(r"decimal\((\d+),\s*(\d+)\)")
_MAX_PRECISION = 38
_MICROS = "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX"
_MICROS_NTZ = "yyyy-MM-dd'T'HH:mm:ss.SSSSSS"


def _decimal(spark_type: str) -> tuple[int, int] | None:
    """``(precision, scale)`` of a decimal or integer type; ``None`` for any other type."""
    if spark_type in _INTEGER_DIGITS:
        return _INTEGER_DIGITS[spark_type], 0
    match = _DECIMAL.fullmatch(spark_type)
    return (int(match.group(1)), int(match.group(2))) if match else None


def supertype(left: str, right: str) -> str:
    """The narrowest Spark type holding every value of both types exactly (see the module docstring)."""
    if left == right:
        return left
    if left in _INTEGRAL and right in _INTEGRAL:
        return max(left, right, key=_INTEGRAL.index)
    pair = {left, right}
    if pair <= {"float", "double"} or (pair & {"float", "double"} and pair - {"float", "double"} <= {"smallint", "int"}):
        return "double"
    a, b = _decimal(left), _decimal(right)
    if a is not None and b is not None:
        scale = max(a[1], b[1])
        digits = max(a[0] - a[1], b[0] - b[1]) + scale
        if digits <= _MAX_PRECISION:
            return f"decimal({digits},{scale})"
    return "string"


def widest(types: list[str]) -> str:
    """:func:`supertype` of every type in ``types`` (at least one)."""
    result = types[0]
    for spark_type in types[1:]:
        result = supertype(result, spark_type)
    return result


#: Spark types narrower than the PostgreSQL types they are chosen for (see the module docstring).
_NARROWER = ("date", "timestamp", "timestamp_ntz")
#: The text of a value PostgreSQL's date or timestamp holds and Spark's does not: ``infinity``,
#: ``-infinity``, a BC date or timestamp, a year past 9999 (alone, or as an element of a JSON array).
OUT_OF_RANGE_TEMPORAL = r'(^|")(-?infinity|\d{4}-[^"]* BC|\d{5,}-[^"]*)("|$)'
#: The text of a value PostgreSQL's numeric holds and Spark's decimal does not.
OUT_OF_RANGE_DECIMAL = r'(^|")(NaN|-?Infinity)("|$)'
#: A date Spark's JSON reader takes without failing, as another date: ``4713-01-01 BC`` as 4713 AD,
#: a year past 9999 as a date that Python (so ``deltalake``'s Python readers and ``cdc verify``)
#: cannot hold.
MISREAD_DATE = r'(^|")(\d{4}-\d\d-\d\d BC|\d{5,}-\d\d-\d\d)("|$)'


def out_of_range(spark_type: str) -> str | None:
    """A regular expression (Java's and Python's syntax alike) matching the JSON text of a value that
    PostgreSQL holds and a view column of ``spark_type`` cannot (see the module docstring): such a value
    turns the column into text. ``None`` for a type without such values; any other misfit is poison."""
    element = spark_type.removeprefix("array<").removesuffix(">") if spark_type.startswith("array<") else spark_type
    if element in _NARROWER:
        return OUT_OF_RANGE_TEMPORAL
    return OUT_OF_RANGE_DECIMAL if _DECIMAL.fullmatch(element) else None


def as_text(column: SparkColumn, spark_type: str) -> SparkColumn:
    """``column`` (of ``spark_type``) as the JSON text its values are written with in a string column."""
    from pyspark.sql import functions as F

    if spark_type == "string":
        return column
    if spark_type.startswith("array<") and _in_quotes(spark_type[len("array<") : -1]):
        element = spark_type[len("array<") : -1]
        return F.to_json(F.transform(column, lambda value: as_text(value, element)))
    if spark_type == "timestamp":
        return F.concat(_without_zero_fraction(F.date_format(column, _MICROS_NTZ)), F.lit("Z"))
    if spark_type == "timestamp_ntz":
        return _without_zero_fraction(F.date_format(column, _MICROS_NTZ))
    if spark_type == "binary":
        return F.base64(column)
    if spark_type.startswith(("array<", "struct<", "map<")):
        return F.to_json(column, {"timestampFormat": _MICROS, "timestampNTZFormat": _MICROS_NTZ})
    return column.cast("string")


def _in_quotes(spark_type: str) -> bool:
    """Whether events carry values of ``spark_type`` as JSON strings (decimals, dates, timestamps, binary)."""
    return spark_type in (*_NARROWER, "binary") or _DECIMAL.fullmatch(spark_type) is not None


def _without_zero_fraction(text: SparkColumn) -> SparkColumn:
    """``...T12:00:00.500000`` as ``...T12:00:00.5`` and ``...T12:00:00.000000`` as ``...T12:00:00``: the
    fraction as the server prints it, so a converted value reads as the events' text does."""
    from pyspark.sql import functions as F

    return F.regexp_replace(F.regexp_replace(text, "0+$", ""), "\\.$", "")


def convert(column: SparkColumn, old: str, new: str) -> SparkColumn:
    """Values of ``old`` type as ``new`` (a :func:`supertype` of ``old``): exact casts, or the text form."""
    if new == "string":
        return as_text(column, old)
    return column.cast(new)
