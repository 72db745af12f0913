"""Compare a view with the source tables read in one consistent snapshot, and list the differences.

The source is read with psycopg in a single ``REPEATABLE READ`` read-only transaction, so every table
comes from the same snapshot, in the session settings capture reads with; every value PostgreSQL holds
is read, and both sides' values are brought to one comparable form (:mod:`derived_views.runs.verify_values`).
The view tables are read with ``deltalake``, not with the Spark that wrote them. A warehouse table is
compared in memory that does not grow with its size (:mod:`derived_views.runs.verify_tables`), and so
are a search index's documents and a cache entity's entries (:mod:`derived_views.runs.verify_composites`). The
comparison is exact only when the view has synced to a watermark at or after the snapshot and no
transaction committed between them, so ``cdc verify`` syncs the view first and is meant for a quiet
source (or a paused workload).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from derived_views.errors import UnknownViewError
from derived_views.events.schema import TableSchema
from derived_views.runs import verify_tables
from derived_views.runs.published_rules import WHOLE, PublishedRule, Rules, keyed, published_rules
from derived_views.runs.verify_composites import compare_composite
from derived_views.runs.verify_reads import ViewTable, copied_batches, read_ahead, source_batches, view_table
from derived_views.runs.verify_tables import Layout, Report, compare_table
from derived_views.runs.verify_values import SESSION_OPTIONS, read_every_value
from derived_views.source.watermark import LogWatermark
from derived_views.views import warehouse
from derived_views.views.composite import Composite

if TYPE_CHECKING:
    import psycopg

    from derived_views.write.context import ViewContext

_SHOWN = 20


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
        return read_ahead(lambda: source_batches(conn, schema, rule.row_filter, rule.mask_functions, as_text=True))

    # a table too large to compare at once is hashed from a COPY of it (when every column has a text
    # that hashes as its value does), read again with a cursor only where buckets differ
    copy = copied_batches(conn, schema, rule.row_filter, rule.mask_functions) if expected > verify_tables.HELD_ROWS else None
    compared = compare_table(label, layout, source, view.batches, expected, report, view.types, copy)
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


def _composite(
    ctx: ViewContext,
    conn: psycopg.Connection,
    schemas: dict[str, TableSchema],
    report: Report,
    plan: Composite,
    rules: Rules,
    table: str,
) -> None:
    """A search index's documents or a cache entity's entries (``table``) against the definition computed
    from the source (:mod:`derived_views.runs.verify_composites`)."""
    from derived_views.views.composite_sync import path

    missing = [t.dotted_name for t in plan.tables if not _exists(conn, schemas[t.log_name])]
    if missing:
        report.notes.append(
            f"{', '.join(missing)} no longer in the source (dropped or renamed): {plan.view} keeps the rows it "
            "had, and was not compared"
        )
        return
    estimated = _estimated_rows(conn, schemas[plan.root.log_name])
    compare_composite(ctx, conn, plan, schemas, rules, report, path(ctx, plan, table), estimated)


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
    ``publication`` publishes (:mod:`derived_views.runs.published_rules`), masked columns masked with
    ``mask_key`` (``CDC_MASK_KEY``) as capture masks them."""
    import psycopg

    from derived_views.runs.runner import plans_at

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
        else:
            _composite(ctx, conn, schemas, report, plans[view], rules, "documents" if plans[view].kind == "search" else "entries")
        conn.rollback()
    return report


def shown(report: Report) -> list[str]:
    """The notes and differences to print (the first few, then a count of the rest)."""
    lines = [f"note: {note}" for note in report.notes] + report.differences[:_SHOWN]
    if report.count > _SHOWN:
        lines.append(f"... and {report.count - _SHOWN} more differences")
    return lines
