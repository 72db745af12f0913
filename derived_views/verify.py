"""Compare a view with the source tables read in one consistent snapshot, and list the differences.

The source is read with psycopg in a single ``REPEATABLE READ`` read-only transaction, so every table
comes from the same snapshot; the view tables are read with ``deltalake``, not with the Spark that wrote
them. Values are compared after bringing both sides to the same Python form (:func:`normalize`):
decimals as :class:`~decimal.Decimal`, instants as UTC-aware datetimes, JSON documents parsed, uuids and
other text-form types as the server's text. The comparison is exact only when the view has synced to a
watermark at or after the snapshot and no transaction committed between them, so ``cdc verify`` syncs
the view first and is meant for a quiet source (or a paused workload).
"""

from __future__ import annotations

import base64
import json
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from derived_views import warehouse
from derived_views.column_names import source_columns
from derived_views.composite import Composite
from derived_views.delta_reads import read_query
from derived_views.errors import MissingTableError, UnknownViewError
from derived_views.log_source import LogWatermark
from derived_views.schema import TableSchema

if TYPE_CHECKING:
    import psycopg

    from derived_views.context import ViewContext

_TEXT_TYPES = {"text", "varchar", "bpchar", "name", "citext"}
_NATIVE = {"int2", "int4", "int8", "oid", "float4", "float8", "bool", "bytea", "date", "timestamp", "timestamptz", "numeric"}
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
            return value.astimezone(UTC)
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
    label: str,
    schema: TableSchema,
    source: list[dict[str, Any]],
    view: list[dict[str, Any]],
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


def _delta_rows(path: str, view: str, names: Iterable[str] = (), where: str = "") -> list[dict[str, Any]]:
    """Every row of the Delta table at ``path`` (those matching the SQL ``where``), the columns stored for
    ``names`` under those names.

    Read with ``deltalake``, not Spark: a second reader of the table's files, the one every view table
    promises to open, and one that answers a small table in milliseconds where a Spark read plans a job."""
    from deltalake import DeltaTable

    if not DeltaTable.is_deltatable(path):
        raise MissingTableError(path, view)
    table = read_query(path, "SELECT * FROM t" + (f" WHERE {where}" if where else ""))
    back = {column: name for name, column in source_columns(names, table.column_names).items()}
    return [{back.get(column, column): value for column, value in row.items()} for row in table.to_pylist()]


def _warehouse(ctx: ViewContext, conn: psycopg.Connection, schemas: dict[str, TableSchema], report: Report) -> None:
    """Each source table against its current-state table and, for a table with a key, against its
    history table's current versions."""
    for name, schema in sorted(schemas.items()):
        if not ctx.definitions.warehouse.keeps(schema.dotted_name):
            continue
        if not _exists(conn, schema):
            report.notes.append(
                f"{schema.qualified} is no longer in the source (dropped or renamed): its warehouse "
                "tables keep the rows it had, and were not compared"
            )
            continue
        source = source_rows(conn, schema)
        view = _delta_rows(warehouse.current_path(ctx, name), warehouse.NAME, schema.names)
        report.compared += len(source)
        report.differences += compare_rows(schema.qualified, schema, source, view)
        if not schema.key_columns or not ctx.definitions.warehouse.keeps_history(schema.dotted_name):
            continue  # a keyless table's history keeps no versions (its events have no key to version)
        history = _delta_rows(warehouse.history_path(ctx, name), warehouse.NAME, schema.names, "_cdc_is_current")
        report.differences += compare_rows(f"{schema.qualified} (history)", schema, source, history)


def _rows_by_key(conn: psycopg.Connection, schema: TableSchema, key: tuple[str, ...]) -> dict[tuple[Any, ...], dict[str, Any]]:
    """Every row of a source table by the normalized values of ``key``."""
    types = {c.name: c.type_name for c in schema.columns}
    return {tuple(repr(normalize(row[c], types[c])) for c in key): row for row in source_rows(conn, schema)}


def _types(schema: TableSchema) -> dict[str, str]:
    return {c.name: c.type_name for c in schema.columns}


def _expected(
    conn: psycopg.Connection, plan: Composite, schemas: dict[str, TableSchema]
) -> dict[tuple[Any, ...], dict[str, Any]]:
    """The composite's rows computed from the source in this snapshot, by root key: the root's kept
    columns, each join's, and for a cache entity each child array (sorted by ``order_by``, then key)."""
    tables = {t.log_name: _rows_by_key(conn, schemas[t.log_name], t.key) for t in plan.tables}
    owners = {None: plan.root} | {link.alias: link.table for link in plan.links}
    children: dict[str, dict[tuple[Any, ...], list[dict[str, Any]]]] = {}
    for child in plan.children:
        types = _types(schemas[child.table.log_name])
        grouped: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
        for row in tables[child.table.log_name].values():
            grouped.setdefault(tuple(repr(normalize(row[c], types[c])) for c in child.on), []).append(row)
        order = (*child.order_by, *child.table.key)

        def sort_key(row: dict[str, Any], ty: dict[str, str] = types, by: tuple[str, ...] = order) -> list[tuple[bool, Any]]:
            return [(row[c] is not None, normalize(row[c], ty[c])) for c in by]

        for rows in grouped.values():
            rows.sort(key=sort_key)
        children[child.alias] = grouped
    expected: dict[tuple[Any, ...], dict[str, Any]] = {}
    for key, row in tables[plan.root.log_name].items():
        found: dict[str | None, dict[str, Any] | None] = {None: row}
        document = {c: row[c] for c in plan.columns}
        for link in plan.links:
            parent, parent_types = found[link.parent], _types(schemas[owners[link.parent].log_name])
            target = (
                None
                if parent is None
                else tables[link.table.log_name].get(tuple(repr(normalize(parent[c], parent_types[c])) for c in link.on))
            )
            found[link.alias] = target
            document.update({name: None if target is None else target[source] for name, source in link.columns})
        for child in plan.children:
            rows = children[child.alias].get(key, [])
            document[child.alias] = [{c: r[c] for c in child.columns} for r in rows]
        expected[key] = document
    return expected


def _passing(
    ctx: ViewContext, plan: Composite, documents: dict[tuple[Any, ...], dict[str, Any]], view_path: str
) -> dict[tuple[Any, ...], dict[str, Any]]:
    """The expected documents for which the index's filter is true, as Spark evaluates it."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType

    if not plan.filter or not documents:
        return documents
    fields = {f.name: f for f in ctx.spark.read.format("delta").load(view_path).schema.fields}
    held = source_columns(plan.output_columns, fields)
    fields = {c: StructField(c, fields[held[c]].dataType) for c in plan.output_columns}
    schema = StructType([StructField("_cdc_row", StringType()), *fields.values()])
    keys = list(documents)

    def cell(value: Any, field: StructField) -> Any:
        if value is not None and isinstance(field.dataType, StringType) and not isinstance(value, str):
            return json.dumps(value) if isinstance(value, (list, dict)) else str(value)
        return value

    rows = [(str(i), *[cell(documents[k][c], fields[c]) for c in plan.output_columns]) for i, k in enumerate(keys)]
    kept = ctx.spark.createDataFrame(rows, schema).filter(F.expr(plan.filter)).select("_cdc_row").collect()
    return {keys[int(r["_cdc_row"])]: documents[keys[int(r["_cdc_row"])]] for r in kept}


def _view_key(text: str, plan: Composite) -> tuple[Any, ...]:
    """A view row's root key (its ``_cdc_key``) in the form :func:`_rows_by_key` uses."""
    values = json.loads(text)
    return tuple(repr(normalize(values.get(c), plan.root.columns[c])) for c in plan.root.key)


def _same(a: Any, b: Any, type_name: str) -> bool:
    """A source value and the view's (JSON-decoded for a cache entry) value are equal."""
    left, right = normalize(a, type_name), normalize(b, type_name)
    if isinstance(left, datetime) and isinstance(right, str):
        right = normalize(datetime.fromisoformat(right.replace("Z", "+00:00")), type_name)
    if isinstance(left, Decimal) or type_name in ("int2", "int4", "int8"):
        return left == (Decimal(str(right)) if right is not None else None) if left is not None else right is None
    if isinstance(left, list) and isinstance(right, list):
        return len(left) == len(right) and all(_same(x, y, type_name.lstrip("_")) for x, y in zip(left, right, strict=True))
    return bool(left == right)


def _compare(
    label: str,
    plan: Composite,
    schemas: dict[str, TableSchema],
    expected: dict[tuple[Any, ...], dict[str, Any]],
    actual: dict[tuple[Any, ...], dict[str, Any]],
    report: Report,
) -> None:
    report.compared += len(expected)
    for key in sorted(expected.keys() - actual.keys()):
        report.differences.append(f"{label}: key {key} is in the source but not in the view")
    for key in sorted(actual.keys() - expected.keys()):
        report.differences.append(f"{label}: key {key} is in the view but not in the source")
    for key in sorted(expected.keys() & actual.keys()):
        want, have = expected[key], actual[key]
        for column in plan.output_columns:
            if not _same(want[column], have.get(column), plan.source_type(column)):
                report.differences.append(
                    f"{label}: key {key} column {column}: source {want[column]!r} != view {have.get(column)!r}"
                )
        for child in plan.children:
            types = _types(schemas[child.table.log_name])
            rows, got = want[child.alias], have.get(child.alias) or []
            if len(rows) != len(got):
                report.differences.append(f"{label}: key {key} {child.alias}: {len(rows)} in the source, {len(got)} in the view")
                continue
            for position, (row, cached) in enumerate(zip(rows, got, strict=True)):
                for column in child.columns:
                    if not _same(row[column], cached.get(column), types[column]):
                        report.differences.append(
                            f"{label}: key {key} {child.alias}[{position}] {column}: source "
                            f"{row[column]!r} != view {cached.get(column)!r}"
                        )


def _search(ctx: ViewContext, conn: psycopg.Connection, schemas: dict[str, TableSchema], report: Report, plan: Composite) -> None:
    """The index's documents against the definition computed from the source (the filter applied by Spark)."""
    from derived_views.composite_sync import path

    documents = path(ctx, plan, "documents")
    expected = _passing(ctx, plan, _expected(conn, plan, schemas), documents)
    actual = {_view_key(row["_cdc_key"], plan): row for row in _delta_rows(documents, plan.view, plan.output_columns)}
    _compare(f"{plan.view} documents", plan, schemas, expected, actual, report)


def _cache(ctx: ViewContext, conn: psycopg.Connection, schemas: dict[str, TableSchema], report: Report, plan: Composite) -> None:
    """The entity's entries against the definition computed from the source."""
    from derived_views.composite_sync import path

    expected = _expected(conn, plan, schemas)
    actual = {
        _view_key(row["_cdc_key"], plan): json.loads(row["value"], parse_float=Decimal)
        for row in _delta_rows(path(ctx, plan, "entries"), plan.view)
    }
    _compare(f"{plan.view} entries", plan, schemas, expected, actual, report)


def verify(ctx: ViewContext, view: str, database_url: str, watermark: LogWatermark) -> Report:
    """Compare ``view`` (``warehouse``, ``search.<index>`` or ``cache.<entity>``) with the source at
    ``database_url`` in one REPEATABLE READ snapshot."""
    import psycopg

    from derived_views.runner import plans_at

    plans = plans_at(ctx, watermark)
    if view != warehouse.NAME and view not in plans:
        raise UnknownViewError(view, ctx.definitions.view_names(), ctx.definitions.source)
    schemas = ctx.schemas(watermark)
    report = Report(view)
    with psycopg.connect(database_url, autocommit=False) as conn:
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        if view == warehouse.NAME:
            _warehouse(ctx, conn, schemas, report)
        elif plans[view].kind == "search":
            _search(ctx, conn, schemas, report, plans[view])
        else:
            _cache(ctx, conn, schemas, report, plans[view])
        conn.rollback()
    return report


def shown(report: Report) -> list[str]:
    """The notes and differences to print (the first few, then a count of the rest)."""
    lines = [f"note: {note}" for note in report.notes] + report.differences[:_SHOWN]
    if len(report.differences) > _SHOWN:
        lines.append(f"... and {len(report.differences) - _SHOWN} more differences")
    return lines
