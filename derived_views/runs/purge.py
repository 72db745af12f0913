"""``cdc views purge``: a table's capture rule applied to every version its views keep, and every
earlier version of their tables dropped, so that no value the rule now leaves out stays in a view file.

When a table's rule changes (a column the publication's column list or the capture rules no longer
publish, a column newly masked, a row filter that now leaves rows out), capture reads the table again
under the new rule, and the views' current rows follow. What the views still hold of the old values:
the earlier Delta versions of every table over the source table, and the history's versions written
before the read. :func:`purge` removes both, for each named source table:

- **rows tables** (the warehouse's current table, a search index's or cache entity's own copy of the
  table, and the warehouse's history): a column the publication does not publish is set to NULL in every
  row; a row the publication's row filter leaves out is removed (the filter is evaluated by PostgreSQL,
  on the values of the columns it names, one query for every distinct combination the table holds);
- **the history** besides: a masked column is set to NULL in every version valid from before the table's
  latest read by capture (``read_at``), whose values capture wrote under an earlier rule and which cannot
  be masked here as capture masks them (a hash is of the value's text as PostgreSQL prints it);
  versions from the read on hold the masked values and keep them;
- **dead letters** of the table (in the dead-letter table of every view over it) are removed: each holds
  an event as it was written, under the rule of its time;
- every one of these tables, and each search index's and cache entity's own tables over the source table
  (recomputed from the current rows when capture read it again), then keeps its newest version alone
  (:func:`~derived_views.engine.earlier_versions.drop_earlier_versions`).

Each rewrite is one Delta commit that carries the table's progress, so a purge killed at any point leaves
every table exact as of its position; running it again finishes it. The caller holds the views' locks
and brings them to the log's latest watermark first (:func:`derived_views.runs.runner.purge`).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from derived_views.engine.commit_progress import committing
from derived_views.engine.delta_sql import is_delta_table, table_ref
from derived_views.engine.earlier_versions import drop_earlier_versions
from derived_views.errors import ViewError
from derived_views.events.column_names import quote, source_columns
from derived_views.events.schema import TableSchema
from derived_views.runs.published_rules import WHOLE, PublishedRule, published_rules
from derived_views.views import cache, search, warehouse
from derived_views.views.composite import Composite
from derived_views.views.composite_sync import path as output_path
from derived_views.views.composite_sync import state_path
from derived_views.write.context import ViewContext

if TYPE_CHECKING:
    import psycopg

#: What a view table over a source table holds of it (see the module docstring).
ROWS, HISTORY, DERIVED, DEAD_LETTERS = "rows", "history", "derived", "dead letters"


@dataclass(frozen=True)
class PurgedTable:
    """One view table after a purge: what the rule changed in it, and the only version it keeps."""

    path: str
    changes: tuple[str, ...]
    version: int
    log_files: int
    """Files of its Delta log deleted with the earlier versions."""


def view_tables_over(ctx: ViewContext, schema: TableSchema, plans: Mapping[str, Composite]) -> list[tuple[str, str]]:
    """``(path, kind)`` of every view table that holds rows or values of ``schema``'s table, kinds as in
    :data:`ROWS`; each path once."""
    found: dict[str, str] = {}
    keeps = ctx.definitions.warehouse.keeps(schema.dotted_name)
    if keeps:
        found[warehouse.current_path(ctx, schema.log_name)] = ROWS
        if ctx.definitions.warehouse.keeps_history(schema.dotted_name):
            found[warehouse.history_path(ctx, schema.log_name)] = HISTORY
    found[warehouse.dead_letter_path(ctx)] = DEAD_LETTERS
    for plan in plans.values():
        read = [table for table in plan.tables if table.log_name == schema.log_name]
        if not read:
            continue
        found.setdefault(state_path(ctx, plan, read[0]), ROWS)
        outputs = search.TABLES if plan.kind == search.NAME else cache.TABLES
        for name in outputs:
            found[output_path(ctx, plan, name)] = DERIVED
        found[output_path(ctx, plan, "_dead_letter")] = DEAD_LETTERS
    return list(found.items())


def purge(
    ctx: ViewContext,
    schemas: list[TableSchema],
    plans: Mapping[str, Composite],
    database_url: str,
    publication: str,
    read_at: Mapping[str, int],
) -> list[PurgedTable]:
    """Apply each of ``schemas``' rule (read from ``publication`` at ``database_url``) to every version of
    the view tables over it, then drop their earlier versions (see the module docstring). ``read_at``:
    the LSN of each table's latest read by capture, by log name."""
    import psycopg

    found: dict[str, tuple[str, list[str]]] = {}
    try:
        conn = psycopg.connect(database_url, autocommit=True, connect_timeout=10)
    except psycopg.OperationalError as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ViewError(
            f"nothing was purged: cannot reach the source to read its rules: {reason}; check CDC_DATABASE_URL"
        ) from None
    with conn:
        rules = published_rules(conn, publication)
        for schema in schemas:
            rule = rules.get((schema.schema, schema.table), WHOLE)
            for path, kind in view_tables_over(ctx, schema, plans):
                if is_delta_table(ctx.spark, path):
                    changes = found.setdefault(path, (kind, []))[1]
                    changes.extend(_apply_rule(ctx, conn, schema, rule, path, kind, read_at.get(schema.log_name)))
    # each table's earlier versions go last, once the rule of every named table is applied to it
    return [_drop(ctx, path, kind, changes) for path, (kind, changes) in found.items()]


def _drop(ctx: ViewContext, path: str, kind: str, changes: list[str]) -> PurgedTable:
    """Drop the earlier versions of the table at ``path``, its commits carrying its progress."""
    progress = ctx.progress(path) if kind != DEAD_LETTERS else None
    dropped = drop_earlier_versions(ctx.spark, path, progress if progress and progress.position else None)
    return PurgedTable(path, tuple(changes), dropped.version, dropped.log_files)


def _apply_rule(
    ctx: ViewContext,
    conn: psycopg.Connection,
    schema: TableSchema,
    rule: PublishedRule,
    path: str,
    kind: str,
    read_at: int | None,
) -> tuple[str, ...]:
    """Rewrite the table at ``path`` (of ``kind``) as ``rule`` asks; a line per change made."""
    if kind == DERIVED:
        return ()
    progress = ctx.progress(path) if kind != DEAD_LETTERS else None
    with committing(ctx.spark, progress if progress and progress.position else None):
        if kind == DEAD_LETTERS:
            removed = _count(ctx, f"DELETE FROM {table_ref(path)} WHERE topic = {_literal(schema.topic)}", "num_affected_rows")
            return (f"{removed} dead letters of {schema.dotted_name} removed",) if removed else ()
        held = _held_columns(path)
        # a column the publication no longer publishes is not in the table's newest schema: named by the rule
        columns = source_columns([*schema.names, *sorted(rule.unpublished), *sorted(rule.masks)], held)
        changes = []
        nulled = [columns[name] for name in sorted(rule.unpublished) if name in columns]
        masked = [columns[name] for name in sorted(rule.masks) if name in columns] if kind == HISTORY else []
        if nulled or masked:
            changes.extend(_null_columns(ctx, path, nulled, masked, read_at))
        if rule.row_filter is not None:
            changes.extend(_remove_filtered_rows(ctx, conn, schema, rule.row_filter, path, columns))
    return tuple(changes)


def _held_columns(path: str) -> list[str]:
    from deltalake import DeltaTable

    return [field.name for field in DeltaTable(path.removeprefix("file://")).schema().fields]


def _count(ctx: ViewContext, statement: str, metric: str) -> int:
    """Run a Delta DML ``statement``; the count its result reports under ``metric``."""
    rows = ctx.spark.sql(statement).collect()
    return int(rows[0][metric]) if rows and metric in rows[0].asDict() else 0


def _literal(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _null_columns(ctx: ViewContext, path: str, nulled: list[str], masked: list[str], read_at: int | None) -> list[str]:
    """Set ``nulled`` to NULL in every row, and ``masked`` in every version valid from before ``read_at``
    (every closed version when the table's latest read is not known)."""
    before = f"_cdc_valid_from_lsn < {int(read_at)}" if read_at is not None else "NOT _cdc_is_current"
    assignments = [f"{quote(c)} = NULL" for c in nulled]
    assignments += [f"{quote(c)} = CASE WHEN {before} THEN NULL ELSE {quote(c)} END" for c in masked]
    holding = [f"{quote(c)} IS NOT NULL" for c in nulled] + [f"({before} AND {quote(c)} IS NOT NULL)" for c in masked]
    statement = f"UPDATE {table_ref(path)} SET {', '.join(assignments)} WHERE {' OR '.join(holding)}"
    rows = _count(ctx, statement, "num_affected_rows")
    if not rows:
        return []
    lines = []
    if nulled:
        lines.append(f"{', '.join(nulled)} (not published) set to NULL")
    if masked:
        lines.append(f"{', '.join(masked)} (masked) set to NULL in the versions before the latest read")
    return [f"{rows} rows rewritten: {'; '.join(lines)}"]


#: A string literal or a quoted identifier of a row filter as PostgreSQL prints it, or a bare word.
_TOKEN = re.compile(r"'(?:[^']|'')*'|\"((?:[^\"]|\"\")+)\"|([A-Za-z_][A-Za-z0-9_$]*)")


def filter_columns(row_filter: str, names: list[str]) -> list[str]:
    """The columns of ``names`` that ``row_filter`` may name (every identifier it holds that is one: a
    word PostgreSQL folds to lower case, or a quoted name)."""
    named: set[str] = set()
    for match in _TOKEN.finditer(row_filter):
        if match[1] is not None:
            named.add(match[1].replace('""', '"'))
        elif match[2] is not None:
            named.add(match[2].lower())
    return [name for name in names if name in named]


def _tuple(columns: list[tuple[str, str]], alias: str = "") -> str:
    """The Spark SQL JSON text of a row's ``(source name, stored name)`` columns."""
    prefix = f"{alias}." if alias else ""
    fields = ", ".join(f"{_literal(name)}, {prefix}{quote(stored)}" for name, stored in columns)
    return f"to_json(named_struct({fields}))" if columns else "'{}'"


def _remove_filtered_rows(
    ctx: ViewContext, conn: psycopg.Connection, schema: TableSchema, row_filter: str, path: str, columns: Mapping[str, str]
) -> list[str]:
    """Remove the rows of the table at ``path`` that ``row_filter`` (PostgreSQL's text of it) leaves out,
    judged by PostgreSQL on each distinct combination of the values of the columns it names."""
    from psycopg import sql

    named = [(name, columns[name]) for name in filter_columns(row_filter, schema.names) if name in columns]
    combinations = [row[0] for row in ctx.spark.sql(f"SELECT DISTINCT {_tuple(named)} AS t FROM {table_ref(path)}").collect()]
    if not combinations:
        return []
    query = sql.SQL(
        "SELECT r._cdc_purge_json FROM unnest(%s::text[]) AS r(_cdc_purge_json), "
        "LATERAL jsonb_populate_record(NULL::{table}, r._cdc_purge_json::jsonb) AS {alias} WHERE {row_filter}"
    ).format(
        table=sql.Identifier(schema.schema, schema.table), alias=sql.Identifier(schema.table), row_filter=sql.SQL(row_filter)
    )
    try:
        kept = {row[0] for row in conn.execute(query, (combinations,)).fetchall()}
    except Exception as exc:  # noqa: BLE001 - psycopg's error kinds: the message names what PostgreSQL refused
        raise ViewError(
            f"cannot evaluate the row filter of {schema.qualified} ({row_filter}) on the rows of {path}: "
            f"{str(exc).strip().splitlines()[0]}"
        ) from None
    left_out = [combination for combination in combinations if combination not in kept]
    if not left_out:
        return []
    name = f"_cdc_purge_{uuid.uuid4().hex}"
    ctx.spark.createDataFrame([(c,) for c in left_out], "_cdc_purge_json string").createOrReplaceTempView(name)
    try:
        statement = (
            f"MERGE INTO {table_ref(path)} AS t USING {name} AS s ON {_tuple(named, 't')} = s._cdc_purge_json "
            "WHEN MATCHED THEN DELETE"
        )
        removed = _count(ctx, statement, "num_affected_rows")
    finally:
        ctx.spark.catalog.dropTempView(name)
    return [f"{removed} rows the row filter leaves out removed"] if removed else []
