"""Compare a view with the source tables read in one consistent snapshot, and list the differences.

The source is read with psycopg in a single ``REPEATABLE READ`` read-only transaction, so every table
comes from the same snapshot, in the session settings capture reads with; every value PostgreSQL holds
is read, and both sides' values are brought to one comparable form (:mod:`derived_views.views.verify_values`).
The view tables are read with ``deltalake``, not with the Spark that wrote them. A warehouse table is
compared in memory that does not grow with its size (:mod:`derived_views.views.verify_tables`). The
comparison is exact only when the view has synced to a watermark at or after the snapshot and no
transaction committed between them, so ``cdc verify`` syncs the view first and is meant for a quiet
source (or a paused workload).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
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
from derived_views.views.verify_tables import Layout, Report, ViewTable, compare_table, source_batches, view_table
from derived_views.views.verify_values import SESSION_OPTIONS, normalize, read_every_value

if TYPE_CHECKING:
    import psycopg

    from derived_views.write.context import ViewContext

_SHOWN = 20


def source_rows(
    conn: psycopg.Connection,
    schema: TableSchema,
    row_filter: str | None = None,
    masks: Mapping[str, Callable[[str], str]] | None = None,
) -> list[dict[str, Any]]:
    """Every row of a source table as a dict of its columns (those ``row_filter``, the publication's row
    filter as the server prints it, passes), each masked column's value masked as capture masks it: the
    mask of the text the type's output function writes (:mod:`event_format.masks`)."""
    names = [c.name for c in schema.columns]
    return [dict(zip(names, row, strict=True)) for batch in source_batches(conn, schema, row_filter, masks) for row in batch]


def _published(schema: TableSchema, rule: PublishedRule) -> TableSchema:
    """``schema`` with only the columns ``rule`` publishes."""
    if rule.column_list is None:
        return schema
    return dataclasses.replace(schema, columns=tuple(c for c in schema.columns if rule.publishes(c.name)))


def _leaked_columns(label: str, rule: PublishedRule, view: ViewTable, publication: str) -> list[str]:
    """A line for every column the publication does not publish that holds a value in the view's rows
    compared (a column a narrowed column list left out stays in the view tables, NULL in every row
    written since: docs/views.md)."""
    return [
        f"{label}: column {name} is in the view but publication {publication} does not publish it"
        for name in view.holding_values(sorted(rule.unpublished & view.columns))
    ]


def _regclass(schema: TableSchema) -> str:
    return '"' + schema.schema.replace('"', '""') + '"."' + schema.table.replace('"', '""') + '"'


def _exists(conn: psycopg.Connection, schema: TableSchema) -> bool:
    """Whether the source still has the table ``schema`` describes."""
    row = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (_regclass(schema),)).fetchone()
    return bool(row and row[0])


def _estimated_rows(conn: psycopg.Connection, schema: TableSchema) -> float:
    """The planner's estimate of the source table's rows (0 when never analyzed)."""
    query = "SELECT greatest(reltuples, 0) FROM pg_class WHERE oid = to_regclass(%s)"
    row = conn.execute(query, (_regclass(schema),)).fetchone()
    return float(row[0]) if row and row[0] is not None else 0.0


def _delta_rows(path: str, view: str, names: Iterable[str] = (), where: str = "") -> list[dict[str, Any]]:
    """Every row of the Delta table at ``path`` (those matching the SQL ``where``), the columns stored for
    ``names`` under those names, read with ``deltalake``."""
    from deltalake import DeltaTable

    if not DeltaTable.is_deltatable(path):
        raise MissingTableError(path, view)
    table = read_query(path, "SELECT * FROM t" + (f" WHERE {where}" if where else ""))
    back = {column: name for name, column in source_columns(names, table.column_names).items()}
    return [{back.get(column, column): value for column, value in row.items()} for row in table.to_pylist()]


def _compare_table(
    conn: psycopg.Connection,
    label: str,
    path: str,
    whole: TableSchema,
    rule: PublishedRule,
    publication: str,
    report: Report,
    where: str = "",
) -> int:
    """One view table against the source table's published rows and columns; returns the rows compared."""
    schema = _published(whole, rule)
    layout = Layout.of(schema)
    view = view_table(path, warehouse.NAME, layout, whole.names, where)
    expected = max(float(view.rows), _estimated_rows(conn, schema))
    first = len(report.differences)

    def source() -> Iterable[list[tuple[Any, ...]]]:
        return source_batches(conn, schema, rule.row_filter, rule.mask_functions)

    compared = compare_table(label, layout, source, view.batches, expected, report)
    report.differences[first:first] = _leaked_columns(label, rule, view, publication)  # listed first
    return compared


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
        current = warehouse.current_path(ctx, name)
        report.compared += _compare_table(conn, schema.qualified, current, whole, rule, publication, report)
        if not schema.key_columns or not ctx.definitions.warehouse.keeps_history(schema.dotted_name):
            continue  # a keyless table's history keeps no versions (its events have no key to version)
        history = warehouse.history_path(ctx, name)
        label = f"{schema.qualified} (history)"
        _compare_table(conn, label, history, whole, rule, publication, report, "_cdc_is_current")


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
        report.add([f"{label}: key {key} is in the source but not in the view"])
    for key in sorted(actual.keys() - expected.keys()):
        report.add([f"{label}: key {key} is in the view but not in the source"])
    for key in sorted(expected.keys() & actual.keys()):
        want, have = expected[key], actual[key]
        for column in plan.output_columns:
            if not _same(want[column], have.get(column), plan.source_type(column)):
                report.add([f"{label}: key {key} column {column}: source {want[column]!r} != view {have.get(column)!r}"])
        for child in plan.children:
            types = _types(schemas[child.table.log_name])
            rows, got = want[child.alias], have.get(child.alias) or []
            if len(rows) != len(got):
                report.add([f"{label}: key {key} {child.alias}: {len(rows)} in the source, {len(got)} in the view"])
                continue
            for position, (row, cached) in enumerate(zip(rows, got, strict=True)):
                for column in child.columns:
                    if not _same(row[column], cached.get(column), types[column]):
                        report.add(
                            [
                                f"{label}: key {key} {child.alias}[{position}] {column}: source "
                                f"{row[column]!r} != view {cached.get(column)!r}"
                            ]
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
    if report.count > _SHOWN:
        lines.append(f"... and {report.count - _SHOWN} more differences")
    return lines
