"""Compare a view with the source tables read in one consistent snapshot, and list the differences.

The source is read with psycopg in a single ``REPEATABLE READ`` read-only transaction, so every table
comes from the same snapshot. Values are compared after bringing both sides to the same Python form
(:func:`normalize`): decimals as :class:`~decimal.Decimal`, instants as UTC-aware datetimes, JSON
documents parsed, uuids and other text-form types as the server's text. The comparison is exact only
when the view has synced to a watermark at or after the snapshot and no transaction committed between
them, so ``cdc verify`` syncs the view first and is meant for a quiet source (or a paused workload).
"""

from __future__ import annotations

import base64
import json
import struct
from dataclasses import dataclass, field
from datetime import date, datetime, timezone
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from derived_views import cache, search, warehouse
from derived_views.errors import MissingTableError, UnknownViewError
from derived_views.log_source import LogWatermark
from derived_views.schema import TableSchema

if TYPE_CHECKING:
    import psycopg

    from derived_views.context import ViewContext

_TEXT_TYPES = {"text", "varchar", "bpchar", "name", "citext"}
_NATIVE = {"int2", "int4", "int8", "oid", "float4", "float8", "bool", "bytea", "date", "timestamp", "timestamptz",
           "numeric"}
_SHOWN = 20


@dataclass
class Report:
    """Differences found by one verification."""

    view: str
    compared: int = 0
    differences: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """What was not compared, and why (a table no longer in the source)."""

    @property
    def ok(self) -> bool:
        """True when the view equals the source."""
        return not self.differences


def _from_text(value: str, type_name: str) -> Any:
    """A value a view holds as its JSON text (a column whose type changed, or a multi-dimensional
    array; see :mod:`derived_views.column_types`) in the form the source type is compared in."""
    try:
        return _parsed_text(value, type_name)
    except ValueError:
        return value  # a form the source keeps as text too (infinity, a BC date): compared as written


def _parsed_text(value: str, type_name: str) -> Any:
    base = type_name.lstrip("_")
    if type_name.startswith("_") or base in ("int2", "int4", "int8", "oid", "float4", "float8", "bool"):
        try:
            return json.loads(value)
        except ValueError:
            return value
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
    if isinstance(value, str) and (type_name.startswith("_") or base in _NATIVE):
        value = _from_text(value, type_name)
    if isinstance(value, list):
        return [normalize(v, base) for v in value]
    if base in ("json", "jsonb"):
        return json.loads(value) if isinstance(value, str) else value
    if isinstance(value, datetime):
        if base == "timestamptz":
            return value.astimezone(timezone.utc)
        return value.replace(tzinfo=None)
    if base == "numeric":
        return Decimal(str(value))
    if base == "float4" and isinstance(value, float):
        # the source's text form is the shortest that reads back as the same float4; the view holds the float4
        return struct.unpack("f", struct.pack("f", value))[0] if abs(value) < 3.5e38 else value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, float) or base in _NATIVE:
        return value
    return str(value)


def quote_identifier(name: str) -> str:
    """``name`` as a quoted SQL identifier (any character, ``"`` doubled)."""
    return '"' + name.replace('"', '""') + '"'


def _select_list(schema: TableSchema) -> str:
    """Columns as psycopg should load them: native types as they are, everything else as text."""
    parts = []
    for column in schema.columns:
        name = quote_identifier(column.name)
        is_array = column.type_name.startswith("_")
        base = column.type_name.lstrip("_")
        if base in _NATIVE or base in _TEXT_TYPES:
            parts.append(name)
        else:
            parts.append(f"{name}::text{'[]' if is_array else ''} AS {name}")
    return ", ".join(parts)


def source_rows(conn: psycopg.Connection, schema: TableSchema) -> list[dict[str, Any]]:
    """Every row of a source table as a dict of its columns."""
    from psycopg.rows import dict_row

    table = f"{quote_identifier(schema.schema)}.{quote_identifier(schema.table)}"
    with conn.cursor(row_factory=dict_row) as cursor:
        return list(cursor.execute(f"SELECT {_select_list(schema)} FROM {table}"))  # noqa: S608 - quoted names


def _exists(conn: psycopg.Connection, schema: TableSchema) -> bool:
    """Whether the source still has the table ``schema`` describes."""
    name = '"' + schema.schema.replace('"', '""') + '"."' + schema.table.replace('"', '""') + '"'
    row = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (name,)).fetchone()
    return bool(row and row[0])


def _key(row: dict[str, Any], schema: TableSchema) -> tuple[Any, ...]:
    columns = schema.key_columns or schema.columns
    return tuple(repr(normalize(row[c.name], c.type_name)) for c in columns)


def compare_rows(
    label: str, schema: TableSchema, source: list[dict[str, Any]], view: list[dict[str, Any]],
    extra: dict[str, str] | None = None,
) -> list[str]:
    """Differences between source and view rows of one table, one line each."""
    types = {c.name: c.type_name for c in schema.columns} | (extra or {})
    by_key_source = {_key(r, schema): r for r in source}
    by_key_view = {_key(r, schema): r for r in view}
    out = []
    for key in sorted(by_key_source.keys() - by_key_view.keys()):
        out.append(f"{label}: key {key} is in the source but not in the view")
    for key in sorted(by_key_view.keys() - by_key_source.keys()):
        out.append(f"{label}: key {key} is in the view but not in the source")
    for key in sorted(by_key_source.keys() & by_key_view.keys()):
        left, right = by_key_source[key], by_key_view[key]
        for name, type_name in types.items():
            a, b = normalize(left.get(name), type_name), normalize(right.get(name), type_name)
            if a != b:
                out.append(f"{label}: key {key} column {name}: source {a!r} != view {b!r}")
    return out


def _delta_rows(ctx: ViewContext, path: str, view: str) -> list[dict[str, Any]]:
    from delta.tables import DeltaTable

    if not DeltaTable.isDeltaTable(ctx.spark, path):
        raise MissingTableError(path, view)
    return [r.asDict(recursive=True) for r in ctx.spark.read.format("delta").load(path).collect()]


def _warehouse(ctx: ViewContext, conn: psycopg.Connection, schemas: dict[str, TableSchema], report: Report) -> None:
    """Each source table against its current-state table and, for a table with a key, against its
    history table's current versions."""
    for name, schema in sorted(schemas.items()):
        if not ctx.definitions.warehouse.keeps(schema.dotted_name):
            continue
        if not _exists(conn, schema):
            report.notes.append(f"{schema.qualified} is no longer in the source (dropped or renamed): its warehouse "
                                "tables keep the rows it had, and were not compared")
            continue
        source = source_rows(conn, schema)
        view = _delta_rows(ctx, warehouse.current_path(ctx, name), warehouse.NAME)
        report.compared += len(source)
        report.differences += compare_rows(schema.qualified, schema, source, view)
        if not schema.key_columns or not ctx.definitions.warehouse.keeps_history(schema.dotted_name):
            continue  # a keyless table's history keeps no versions (its events have no key to version)
        history = [row for row in _delta_rows(ctx, warehouse.history_path(ctx, name), warehouse.NAME)
                   if row["_cdc_is_current"]]
        report.differences += compare_rows(f"{schema.qualified} (history)", schema, source, history)


def _search(ctx: ViewContext, conn: psycopg.Connection, schemas: dict[str, TableSchema], report: Report) -> None:
    products = schemas[search.PRODUCTS]
    categories = {r["id"]: r["name"] for r in source_rows(conn, schemas[search.CATEGORIES])}
    source = [dict(r, category_name=categories.get(r["category_id"])) for r in source_rows(conn, products)]
    view = _delta_rows(ctx, search.path(ctx, "documents"), search.NAME)
    report.compared += len(source)
    report.differences += compare_rows("search documents", products, source, view, {"category_name": "text"})


def _cache(ctx: ViewContext, conn: psycopg.Connection, schemas: dict[str, TableSchema], report: Report) -> None:
    orders_schema, items_schema = schemas[cache.ORDERS], schemas[cache.ITEMS]
    items: dict[str, list[dict[str, Any]]] = {}
    for item in source_rows(conn, items_schema):
        items.setdefault(str(item["order_id"]), []).append(item)
    view = {r["entity_key"]: json.loads(r["value"], parse_float=Decimal)
            for r in _delta_rows(ctx, cache.path(ctx, "entries"), cache.NAME)}
    types = {c.name: c.type_name for c in orders_schema.columns}
    item_types = {c.name: c.type_name for c in items_schema.columns}

    def same(a: Any, b: Any, type_name: str) -> bool:
        left, right = normalize(a, type_name), normalize(b, type_name)
        if isinstance(left, datetime) and isinstance(right, str):
            right = normalize(datetime.fromisoformat(right.replace("Z", "+00:00")), type_name)
        if isinstance(left, Decimal) or type_name in ("int2", "int4", "int8"):
            return left == (Decimal(str(right)) if right is not None else None) if left is not None else right is None
        return bool(left == right)

    for order in source_rows(conn, orders_schema):
        key = str(order["id"])
        report.compared += 1
        cached = view.pop(key, None)
        if cached is None:
            report.differences.append(f"cache order {key}: missing from the cache")
            continue
        for name, type_name in types.items():
            if not same(order[name], cached.get(name), type_name):
                report.differences.append(f"cache order {key}: {name}: source {order[name]!r} != cached {cached.get(name)!r}")
        expected = sorted(items.get(key, []), key=lambda r: r["line_no"])
        got = cached.get("items", [])
        if len(expected) != len(got):
            report.differences.append(f"cache order {key}: {len(expected)} items in the source, {len(got)} cached")
            continue
        for want, have in zip(expected, got, strict=True):
            for name, type_name in item_types.items():
                if not same(want[name], have.get(name), type_name):
                    report.differences.append(
                        f"cache order {key} line {want['line_no']}: {name}: source {want[name]!r} != cached {have.get(name)!r}")
    for key in sorted(view):
        report.differences.append(f"cache order {key}: cached but not in the source")


_CHECKS = {warehouse.NAME: _warehouse, search.NAME: _search, cache.NAME: _cache}


def verify(ctx: ViewContext, view: str, database_url: str, watermark: LogWatermark) -> Report:
    """Compare ``view`` with the source at ``database_url`` in one REPEATABLE READ snapshot."""
    import psycopg

    if view not in _CHECKS:
        raise UnknownViewError(view, list(_CHECKS))
    schemas = ctx.schemas(watermark)
    report = Report(view)
    with psycopg.connect(database_url, autocommit=False) as conn:
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        _CHECKS[view](ctx, conn, schemas, report)
        conn.rollback()
    return report


def shown(report: Report) -> list[str]:
    """The notes and differences to print (the first few, then a count of the rest)."""
    lines = [f"note: {note}" for note in report.notes] + report.differences[:_SHOWN]
    if len(report.differences) > _SHOWN:
        lines.append(f"... and {len(report.differences) - _SHOWN} more differences")
    return lines
