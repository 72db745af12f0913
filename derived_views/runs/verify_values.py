"""How ``cdc verify`` reads source values and brings both sides to one comparable form.

The source is read in the session settings capture reads with (:data:`SESSION_OPTIONS`: ``TimeZone=UTC``,
``DateStyle=ISO``), native types as psycopg loads them and every other type as the server's text
(:func:`select_list`); a date or timestamp no Python ``date`` or ``datetime`` holds (``infinity``,
``-infinity``, a BC date, a year past 9999), in a column or an array, is read as the server's text
(:func:`read_every_value`). :func:`normalize` brings a value of either side to the same Python form:
decimals as :class:`~decimal.Decimal`, instants as UTC-aware datetimes, JSON documents parsed, uuids and
other text-form types as the server's text.
"""

from __future__ import annotations

import base64
import decimal
import ipaddress
import json
import math
import re
import struct
from collections.abc import Collection
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from derived_views.events.schema import TableSchema

if TYPE_CHECKING:
    import psycopg

_TEXT_TYPES = {"text", "varchar", "bpchar", "name", "citext"}
NATIVE = {"int2", "int4", "int8", "oid", "float4", "float8", "bool", "bytea", "date", "timestamp", "timestamptz", "numeric"}
#: The source session's settings: values in the text form capture reads them in (UTC, ISO dates).
SESSION_OPTIONS = "-c TimeZone=UTC -c DateStyle=ISO"
#: Rounds no decimal (``Decimal.normalize`` rounds to its context's precision, 28 digits by default).
EXACT = decimal.Context(prec=decimal.MAX_PREC, Emax=decimal.MAX_EMAX, Emin=decimal.MIN_EMIN)


def _from_text(value: str, type_name: str) -> Any:
    """A value a view holds as its JSON text (a column whose type changed, a multi-dimensional array, or
    a value its Spark type cannot hold; see :mod:`derived_views.events.column_types`) in the form the source
    type is compared in."""
    try:
        return _parsed_text(value, type_name)
    except ValueError:
        return _temporal_text(value, type_name.lstrip("_"))


def _temporal_text(value: str, base: str) -> str:
    """A date or timestamp Python cannot hold (``infinity``, BC, a year past 9999) in the server's text
    form, whichever side it comes from: the events write a timestamp with ``T`` and a UTC one with
    ``Z`` (docs/event-format.md), the server (in a UTC session) with a space and ``+00``."""
    if base not in ("timestamp", "timestamptz") or not value[:1].isdigit():
        return value
    value = value.replace("T", " ", 1)
    return value[:-1] + "+00" if value.endswith("Z") else value


_OFFSET = re.compile(r"([+-]\d{2})(?::?(\d{2}))?(?::?(\d{2}))?$")


def _timetz_text(value: str) -> str:
    """A ``timetz`` with its offset as ``±HH:MM[:SS]``, as the events write it (the server writes ``+02``)."""
    match = _OFFSET.search(value)
    if match is None:
        return value
    hours, minutes, seconds = match.groups()
    return value[: match.start()] + f"{hours}:{minutes or '00'}" + (f":{seconds}" if seconds else "")


def _special_float(value: float) -> str | None:
    """``NaN`` and negative zero as text: compared with ``==``, NaN equals nothing and ``-0.0`` equals
    ``0.0``, so neither a lost NaN nor a lost sign would show."""
    if math.isnan(value):
        return "NaN"
    if value == 0 and math.copysign(1.0, value) < 0:
        return "-0"
    return None


def _parsed_text(value: str, type_name: str) -> Any:
    base = type_name.lstrip("_")
    if type_name.startswith("_") or base in ("int2", "int4", "int8", "oid", "float4", "float8", "bool"):
        try:
            return json.loads(value)
        except ValueError:
            return value
    if base in ("timestamp", "timestamptz", "date") and value.endswith(" BC"):
        raise ValueError(value)  # Python reads "4713-01-01 BC" as 4713 AD
    if base in ("timestamp", "timestamptz"):
        return datetime.fromisoformat(value.replace(" ", "T").replace("Z", "+00:00"))
    if base == "date":
        return date.fromisoformat(value)
    if base == "bytea":
        return base64.b64decode(value)
    return value


def normalize(value: Any, type_name: str) -> Any:
    """One column value from either side in a comparable form (see the module docstring)."""
    if value is None:
        return None
    base = type_name.lstrip("_")
    if isinstance(value, str) and (type_name.startswith("_") or base in NATIVE):
        value = _from_text(value, type_name)
    if isinstance(value, list):
        return [normalize(v, base) for v in value]
    if base == "timetz" and isinstance(value, str):
        return _timetz_text(value)
    if base in ("inet", "cidr") and isinstance(value, str):
        # the server prints a host address without its full mask, a cast to text keeps it: one address
        return ipaddress.ip_interface(value)
    if base in ("json", "jsonb"):
        return json.loads(value) if isinstance(value, str) else value
    if isinstance(value, datetime):
        if base == "timestamptz":
            return value.astimezone(UTC)
        return value.replace(tzinfo=None)
    if base == "numeric":
        number = Decimal(str(value))
        return "NaN" if number.is_nan() else number  # NaN equals nothing, not even itself
    if isinstance(value, float) and _special_float(value) is not None:
        return _special_float(value)
    if base == "float4" and isinstance(value, float):
        # the source's text form is the shortest that reads back as the same float4; the view holds the float4
        return struct.unpack("f", struct.pack("f", value))[0] if abs(value) < 3.5e38 else value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, float) or base in NATIVE:
        return value
    return str(value)


def quote_identifier(name: str) -> str:
    """``name`` as a quoted SQL identifier (any character, ``"`` doubled)."""
    return '"' + name.replace('"', '""') + '"'


#: Types ``as_text`` loads as the server's text (:func:`loaded`).
TEXT_LOADED = frozenset({"numeric", "date", "timestamp", "timestamptz"})


def loaded(expression: str, type_name: str, masked: bool = False, *, as_text: bool = False) -> str:
    """``expression``, a value of type ``type_name``, as psycopg should load it: a native type as it is,
    any other as text; ``masked``, as the text its type's output function writes; ``as_text``, a
    decimal, a date or an instant as text too (:data:`TEXT_LOADED`)."""
    if masked:
        return f"CASE WHEN {expression} IS NOT NULL THEN format('%s', {expression}) END"
    if as_text and type_name in TEXT_LOADED:
        return f"{expression}::text"
    is_array = type_name.startswith("_")
    base = type_name.lstrip("_")
    # psycopg loads arrays of the built-in string types (a bpchar[] with its padding, which a cast to
    # text[] would cut), but knows no array of citext: that one is cast
    if base in NATIVE or (base in _TEXT_TYPES and (not is_array or base != "citext")):
        return expression
    return f"{expression}::text{'[]' if is_array else ''}"


#: Array element types whose JSON (``to_json``) reads back as the same comparable values as psycopg's
#: list of them (a decimal's JSON number would be read as a float, a float's ``-0`` as the integer 0, a
#: ``bytea``'s as its hex text).
_JSON_ELEMENTS = frozenset(
    {"int2", "int4", "int8", "oid", "bool", "date", "timestamp", "timestamptz", "uuid", "json", "jsonb"} | _TEXT_TYPES
)


def copied(expression: str, type_name: str, masked: bool = False) -> str | None:
    """``expression``, a value of type ``type_name``, as text for ``COPY ... (FORMAT csv)``, in a form
    whose comparable form (:func:`normalize`) is that of the value :func:`loaded` loads with ``as_text``
    (``None``: no such text: an array of decimals or of ``bytea``, an array of another type): a
    ``bytea`` as base64, a boolean as ``true``/``false``, an array as its JSON, any other value as its
    type's output function writes it (a masked one as :func:`loaded` has it)."""
    if masked:
        return loaded(expression, type_name, masked)
    if type_name.startswith("_"):
        return f"to_json({expression})::text" if type_name[1:] in _JSON_ELEMENTS else None
    if type_name == "bytea":
        return f"encode({expression}, 'base64')"
    if type_name == "bool":
        return f"CASE WHEN {expression} THEN 'true' WHEN NOT {expression} THEN 'false' END"
    return expression  # COPY writes its type's output (a cast to text would cut a character(n)'s padding)


def select_list(schema: TableSchema, masked: Collection[str] = (), *, as_text: bool = False) -> str:
    """Columns as psycopg should load them (:func:`loaded`), each under its name."""
    parts = []
    for column in schema.columns:
        name = quote_identifier(column.name)
        expression = loaded(name, column.type_name, column.name in masked, as_text=as_text)
        parts.append(name if expression == name else f"{expression} AS {name}")
    return ", ".join(parts)


#: The types psycopg loads as Python dates and times, which hold fewer values than PostgreSQL's.
_DATETIME_TYPES = ("date", "timestamp", "timestamptz")


def read_every_value(conn: psycopg.Connection) -> None:
    """Have ``conn`` load a ``date``, ``timestamp`` or ``timestamptz`` that Python's ``date`` /
    ``datetime`` cannot hold as the server's text, in a column or an array, instead of failing the
    whole read with ``psycopg.DataError`` (psycopg's own loaders refuse ``infinity``, BC dates and
    years past 9999). Every other value loads as psycopg loads it."""
    from psycopg.adapt import Loader
    from psycopg.errors import DataError
    from psycopg.pq import Format

    class _OrText(Loader):
        inner: type[Loader]

        def __init__(self, oid: int, context: Any = None) -> None:
            super().__init__(oid, context)
            self._inner = self.inner(oid, context)

        def load(self, data: Any) -> Any:
            try:
                return self._inner.load(data)
            except DataError:
                return bytes(data).decode()

    for name in _DATETIME_TYPES:
        info = conn.adapters.types[name]
        default = conn.adapters.get_loader(info.oid, Format.TEXT)
        if default is not None:
            conn.adapters.register_loader(name, type(f"{name.title()}OrText", (_OrText,), {"inner": default}))
