"""Compare a view with the source tables read in one consistent snapshot, and list the differences.

The source is read with psycopg in a single ``REPEATABLE READ`` read-only transaction, so every table
comes from the same snapshot, in the session settings capture reads with (``TimeZone=UTC``,
``DateStyle=ISO``). Every value PostgreSQL holds is read: a date or timestamp no Python ``date`` or
``datetime`` holds (``infinity``, ``-infinity``, a BC date, a year past 9999), in a column or an array,
is read as the server's text (:func:`read_every_value`) and compared in that form. The view tables are
read with ``deltalake``, not with the Spark that wrote them. Values are compared after bringing both
sides to the same Python form (:func:`normalize`): decimals as :class:`~decimal.Decimal`, instants as
UTC-aware datetimes, JSON documents parsed, uuids and other text-form types as the server's text. The
comparison is exact only when the view has synced to a watermark at or after the snapshot and no
transaction committed between them, so ``cdc verify`` syncs the view first and is meant for a quiet
source (or a paused workload).
"""

from __future__ import annotations

import base64
import dataclasses
import ipaddress
import json
import math
import re
import struct
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from derived_views.engine.delta_reads import read_query
from derived_views.errors import MissingTableError, UnknownViewError
from derived_views.events.column_names import source_columns
from derived_views.events.schema import TableSchema
from derived_views.source.log_source import LogWatermark
from derived_views.views import warehouse
from derived_views.views.composite import Composite
from derived_views.views.published_rules import WHOLE, PublishedRule, Rules, keyed, published_rules
from derived_views.views.source_relation import relation_sql

if TYPE_CHECKING:
    import psycopg

    from derived_views.write.context import ViewContext

_TEXT_TYPES = {"text", "varchar", "bpchar", "name", "citext"}
_NATIVE = {"int2", "int4", "int8", "oid", "float4", "float8", "bool", "bytea", "date", "timestamp", "timestamptz", "numeric"}
_SHOWN = 20
#: The source session's settings: values in the text form capture reads them in (UTC, ISO dates).
SESSION_OPTIONS = "-c TimeZone=UTC -c DateStyle=ISO"


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
    if isinstance(value, str) and (type_name.startswith("_") or base in _NATIVE):
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
    if isinstance(value, float) or base in _NATIVE:
        return value
    return str(value)


def quote_identifier(name: str) -> str:
    """``name`` as a quoted SQL identifier (any character, ``"`` doubled)."""
    return '"' + name.replace('"', '""') + '"'


def _select_list(schema: TableSchema, masked: Collection[str] = ()) -> str:
    """Columns as psycopg should load them: native types as they are, everything else as text; a
    ``masked`` column as the text its type's output function writes."""
    parts = []
    for column in schema.columns:
        name = quote_identifier(column.name)
        if column.name in masked:
            parts.append(f"CASE WHEN {name} IS NOT NULL THEN format('%s', {name}) END AS {name}")
            continue
        is_array = column.type_name.startswith("_")
        base = column.type_name.lstrip("_")
        # psycopg loads arrays of the built-in string types (a bpchar[] with its padding, which a cast to
        # text[] would cut), but knows no array of citext: that one is cast
        if base in _NATIVE or (base in _TEXT_TYPES and (not is_array or base != "citext")):
            parts.append(name)
        else:
            parts.append(f"{name}::text{'[]' if is_array else ''} AS {name}")
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


def source_rows(
    conn: psycopg.Connection,
    schema: TableSchema,
    row_filter: str | None = None,
    masks: Mapping[str, Callable[[str], str]] | None = None,
) -> list[dict[str, Any]]:
    """Every row of a source table (its own rows, not its children's: :func:`relation_sql`) as a dict of
    its columns (those ``row_filter``, the publication's row filter as the server prints it, passes), each
    masked column's value masked as capture masks it: the mask of the text the type's output function
    writes (:mod:`event_format.masks`)."""
    from psycopg.rows import dict_row

    table = relation_sql(conn, schema.schema, schema.table)
    where = f" WHERE ({row_filter})" if row_filter is not None else ""
    with conn.cursor(row_factory=dict_row) as cursor:
        rows = list(cursor.execute(f"SELECT {_select_list(schema, masks or {})} FROM {table}{where}"))  # noqa: S608 - quoted names
    for column, mask in (masks or {}).items():
        for row in rows:
            if row.get(column) is not None:
                row[column] = mask(row[column])
    return rows


def _published(schema: TableSchema, rule: PublishedRule) -> TableSchema:
    """``schema`` with only the columns ``rule`` publishes."""
    if rule.column_list is None:
        return schema
    return dataclasses.replace(schema, columns=tuple(c for c in schema.columns if rule.publishes(c.name)))


def _leaked_columns(label: str, rule: PublishedRule, view: list[dict[str, Any]], publication: str) -> list[str]:
    """A line for every column of the view that the publication does not publish."""
    present = set().union(*(row.keys() for row in view)) if view else set()
    return [
        f"{label}: column {name} is in the view but publication {publication} does not publish it"
        for name in sorted(rule.unpublished & present)
    ]


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
    """Differences between source and view rows of one table, one line each; a key the view holds more than
    once (rows stored under an earlier key of the table, which hold the same values of its key now) is one."""
    types = {c.name: c.type_name for c in schema.columns} | (extra or {})
    by_key_source = {_key(r, schema): r for r in source}
    by_key_view = {_key(r, schema): r for r in view}
    out = []
    if len(by_key_view) < len(view) and schema.key_columns:
        counts = Counter(_key(r, schema) for r in view)
        out += [f"{label}: key {key} is in the view {n} times" for key, n in sorted(counts.items()) if n > 1]
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


def _warehouse(
    ctx: ViewContext, conn: psycopg.Connection, schemas: dict[str, TableSchema], report: Report, rules: Rules, publication: str
) -> None:
    """Each source table, the rows and columns the publication publishes, against its current-state
    table and, for a table with a key, against its history table's current versions."""
    for name, whole in sorted(schemas.items()):
        rule = rules.get((whole.schema, whole.table), WHOLE)
        schema = _published(whole, rule)
        if not ctx.definitions.warehouse.keeps(schema.dotted_name):
            continue
        if not _exists(conn, schema):
            report.notes.append(
                f"{schema.qualified} is no longer in the source (dropped or renamed): its warehouse "
                "tables keep the rows it had, and were not compared"
            )
            continue
        source = source_rows(conn, schema, rule.row_filter, rule.mask_functions)
        view = _delta_rows(warehouse.current_path(ctx, name), warehouse.NAME, whole.names)
        report.compared += len(source)
        report.differences += _leaked_columns(schema.qualified, rule, view, publication)
        report.differences += compare_rows(schema.qualified, schema, source, view)
        if not schema.key_columns or not ctx.definitions.warehouse.keeps_history(schema.dotted_name):
            continue  # a keyless table's history keeps no versions (its events have no key to version)
        history = _delta_rows(warehouse.history_path(ctx, name), warehouse.NAME, whole.names, "_cdc_is_current")
        report.differences += _leaked_columns(f"{schema.qualified} (history)", rule, history, publication)
        report.differences += compare_rows(f"{schema.qualified} (history)", schema, source, history)


def _rows_by_key(
    conn: psycopg.Connection, schema: TableSchema, key: tuple[str, ...], rules: Rules
) -> dict[tuple[Any, ...], dict[str, Any]]:
    """Every published row of a source table by the normalized values of ``key``."""
    types = {c.name: c.type_name for c in schema.columns}
    rule = rules.get((schema.schema, schema.table), WHOLE)
    rows = source_rows(conn, _published(schema, rule), rule.row_filter, rule.mask_functions)
    return {tuple(repr(normalize(row[c], types[c])) for c in key): row for row in rows}


def _types(schema: TableSchema) -> dict[str, str]:
    return {c.name: c.type_name for c in schema.columns}


def _expected(
    conn: psycopg.Connection, plan: Composite, schemas: dict[str, TableSchema], rules: Rules
) -> dict[tuple[Any, ...], dict[str, Any]]:
    """The composite's rows computed from the source in this snapshot, by root key: the root's kept
    columns, each join's, and for a cache entity each child array (sorted by ``order_by``, then key)."""
    tables = {t.log_name: _rows_by_key(conn, schemas[t.log_name], t.key, rules) for t in plan.tables}
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


def _search(
    ctx: ViewContext, conn: psycopg.Connection, schemas: dict[str, TableSchema], report: Report, plan: Composite, rules: Rules
) -> None:
    """The index's documents against the definition computed from the source (the filter applied by Spark)."""
    from derived_views.views.composite_sync import path

    documents = path(ctx, plan, "documents")
    expected = _passing(ctx, plan, _expected(conn, plan, schemas, rules), documents)
    actual = {_view_key(row["_cdc_key"], plan): row for row in _delta_rows(documents, plan.view, plan.output_columns)}
    _compare(f"{plan.view} documents", plan, schemas, expected, actual, report)


def _cache(
    ctx: ViewContext, conn: psycopg.Connection, schemas: dict[str, TableSchema], report: Report, plan: Composite, rules: Rules
) -> None:
    """The entity's entries against the definition computed from the source."""
    from derived_views.views.composite_sync import path

    expected = _expected(conn, plan, schemas, rules)
    actual = {
        _view_key(row["_cdc_key"], plan): json.loads(row["value"], parse_float=Decimal)
        for row in _delta_rows(path(ctx, plan, "entries"), plan.view)
    }
    _compare(f"{plan.view} entries", plan, schemas, expected, actual, report)


def verify(
    ctx: ViewContext,
    view: str,
    database_url: str,
    watermark: LogWatermark,
    publication: str = "cdc_publication",
    mask_key: bytes | None = None,
) -> Report:
    """Compare ``view`` (``warehouse``, ``search.<index>`` or ``cache.<entity>``) with the source at
    ``database_url`` in one REPEATABLE READ snapshot, reading of each table the rows and columns
    ``publication`` publishes (:mod:`derived_views.views.published_rules`), masked columns masked with
    ``mask_key`` (``CDC_MASK_KEY``) as capture masks them."""
    import psycopg

    from derived_views.views.runner import plans_at

    plans = plans_at(ctx, watermark)
    if view != warehouse.NAME and view not in plans:
        raise UnknownViewError(view, ctx.definitions.view_names(), ctx.definitions.source)
    schemas = ctx.schemas(watermark)
    report = Report(view)
    with psycopg.connect(database_url, autocommit=False, options=SESSION_OPTIONS) as conn:
        read_every_value(conn)
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        rules = keyed(published_rules(conn, publication), mask_key)
        if view == warehouse.NAME:
            _warehouse(ctx, conn, schemas, report, rules, publication)
        elif plans[view].kind == "search":
            _search(ctx, conn, schemas, report, plans[view], rules)
        else:
            _cache(ctx, conn, schemas, report, plans[view], rules)
        conn.rollback()
    return report


def shown(report: Report) -> list[str]:
    """The notes and differences to print (the first few, then a count of the rest)."""
    lines = [f"note: {note}" for note in report.notes] + report.differences[:_SHOWN]
    if len(report.differences) > _SHOWN:
        lines.append(f"... and {len(report.differences) - _SHOWN} more differences")
    return lines
