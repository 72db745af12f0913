"""Rows as verify reads and compares them, for tests: a source table's rows as dicts, and the differences
verify lists between two tables' rows."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from derived_views.events.schema import TableSchema
from derived_views.runs.verify_reads import source_batches
from derived_views.runs.verify_tables import Layout, Report, compare_table

if TYPE_CHECKING:
    import psycopg


def source_rows(
    conn: psycopg.Connection,
    schema: TableSchema,
    row_filter: str | None = None,
    masks: Mapping[str, Callable[[str], str]] | None = None,
) -> list[dict[str, Any]]:
    """Every row of a source table as verify reads it, as a dict of its columns (those ``row_filter``
    passes, masked columns masked)."""
    names = [c.name for c in schema.columns]
    return [dict(zip(names, row, strict=True)) for batch in source_batches(conn, schema, row_filter, masks) for row in batch]


def compare_rows(label: str, schema: TableSchema, source: list[dict[str, Any]], view: list[dict[str, Any]]) -> list[str]:
    """The differences verify lists between two tables' rows, given as dicts."""
    layout = Layout.of(schema)
    sides = [[tuple(row.get(name) for name in layout.names) for row in rows] for rows in (source, view)]
    report = Report(label)
    compare_table(label, layout, lambda: [sides[0]], lambda: [sides[1]], max(len(source), len(view)), report)
    return report.differences
