"""Cache entities (``[cache.<entity>]`` of the views file): one JSON value per root row, for point lookups.

An entry's value is the root's kept columns, each lookup's columns flattened in under their names, and
each child array under the child's name (the child rows whose ``on`` columns equal the root's key, sorted
by ``order_by`` then the child's key). Decimals keep their scale (``19.90``), instants are UTC with
microseconds (``...T12:45:00.123456Z``).

Paths below ``CDC_DATA_DIR``, for the view ``cache.<entity>``:

- ``cache/<entity>/_state/<table>``: the entity's SCD1 copy of a table it reads that the warehouse does
  not keep; it reads the others from the warehouse's current tables (:mod:`derived_views.views.composite_sync`).
- ``cache/<entity>/entries``: ``entity_key`` (the key column's value as text; for a key of several
  columns the canonical JSON key), ``value`` (JSON), ``_cdc_key``, ``_cdc_lsn`` (the newest source event
  folded into the value) and ``_cdc_children`` (the children the value holds, so that a child that moves
  or goes away is found under its old parent). Lookups filter on ``entity_key``, which Delta's per-file
  statistics prune.
- ``cache/<entity>/_dead_letter``: poison events.

A sync step re-computes the affected entries (:func:`derived_views.views.composite_sync.affected_roots`) from
the state copies as of the watermark and MERGEs them on ``_cdc_key`` in one commit with the new progress
(an entry whose root is gone is deleted); after a truncate of any table it reads, the entries are
recomputed whole, in one overwrite commit.
"""

from __future__ import annotations

import json
from dataclasses import replace as with_fields
from typing import TYPE_CHECKING, Any

from derived_views.engine.delta_reads import read_query, sql_text
from derived_views.engine.evaluation import sized_for
from derived_views.errors import MissingTableError, UnknownEntityError
from derived_views.events.column_names import quote
from derived_views.events.metadata_columns import KEY, LSN
from derived_views.source.as_of import LogAsOf, pending_events
from derived_views.source.table_step import TableStep
from derived_views.views import kinds
from derived_views.views.composite import Composite
from derived_views.views.composite_sync import (
    CHILDREN,
    affected_roots,
    check_definition,
    composed,
    held_since,
    merge_roots,
    overwrite,
    path,
    reshaped,
    source_schemas,
    sync_states,
    tables_read,
)
from derived_views.write.context import ViewContext
from derived_views.write.steps import TableResult, is_current, starting_point

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

NAME = kinds.CACHE
#: The entity's tables below its directory, and what each holds.
TABLES = kinds.CACHE_TABLES
_MICROS = "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX"
_MICROS_NTZ = "yyyy-MM-dd'T'HH:mm:ss.SSSSSS"


def entries(ctx: ViewContext, plan: Composite, roots: DataFrame | None) -> DataFrame:
    """The entries of ``roots`` (``None``: every root) computed from the state copies."""
    from pyspark.sql import functions as F

    rows = composed(ctx, plan, roots)
    fields = [*plan.output_columns, *(child.alias for child in plan.children)]
    key = F.col("_cdc_rootkey0").cast("string") if len(plan.root.key) == 1 else F.col(KEY)
    value = F.to_json(
        F.struct(*[F.col(quote(c)) for c in fields]), {"timestampFormat": _MICROS, "timestampNTZFormat": _MICROS_NTZ}
    )
    children = F.col(CHILDREN) if plan.children else F.array().cast("array<string>")
    return rows.select(key.alias("entity_key"), value.alias("value"), KEY, LSN, children.alias(CHILDREN))


def sync(ctx: ViewContext, as_of: LogAsOf, plan: Composite, *, replace: bool = False) -> list[TableResult]:
    """Bring the entity's state copies, then its entries, to the range's watermark (rebuild them from
    the log when ``replace``)."""
    schemas = source_schemas(ctx, as_of, plan)
    table = path(ctx, plan, "entries")
    if not replace:
        check_definition(plan, table, ctx.progress(table))
    results = sync_states(ctx, as_of, plan, schemas, replace=replace)
    topics = sorted({schema.topic for schema in schemas.values()})
    progress, replace = starting_point(ctx, table, replace)
    if progress is not None and is_current(ctx, TableStep(as_of, topics, table, applied=progress)):
        return results
    new_progress = with_fields(as_of.progress(topics, progress, since=held_since(ctx, plan)), definition=plan.stamp)
    with sized_for(ctx.spark, pending_events(as_of.watermark, topics, progress), tables_read(ctx, plan, TABLES)):
        roots = None
        if progress is not None and not reshaped(plan, progress):
            roots = affected_roots(ctx, as_of, plan, schemas, progress, table)
        if roots is None:
            overwrite(ctx, entries(ctx, plan, None), table, new_progress)
            results.append(TableResult(table, 0, 0))
        else:
            merge_roots(ctx, table, roots, entries(ctx, plan, roots), new_progress)
            results.append(TableResult(table, roots.count(), 0))
            roots.unpersist()
    ctx.set_progress(table, new_progress)
    return results


def entries_table(views_dir: str, entity: str) -> tuple[str, str]:
    """The name (``cache/<entity>/entries``) and path of the table ``cdc cache get`` reads of ``entity``."""
    return f"{NAME}/{entity}/entries", f"{views_dir.rstrip('/')}/{NAME}/{entity}/entries"


def get(
    views_dir: str, entity: str, key: str, entities: list[str] | None = None, version: int | None = None
) -> dict[str, Any] | None:
    """The cached value of ``entity`` ``key`` in the views at ``views_dir``, or ``None`` when there is none.

    Read with ``deltalake``, without Spark, from the entries table's ``version`` (default its newest: a
    version exact as of an LSN is :func:`~derived_views.runs.as_of_reads.select_versions`'); the entity is
    checked against ``entities`` (the defined ones) before anything is read."""
    from deltalake import DeltaTable

    if entities is not None and entity not in entities:
        raise UnknownEntityError(entity, entities)
    entries_path = entries_table(views_dir, entity)[1]
    if not DeltaTable.is_deltatable(entries_path):
        raise MissingTableError(entries_path, f"{NAME}.{entity}")
    sql = f"SELECT value FROM t WHERE entity_key = {sql_text(key)} LIMIT 1"
    rows = read_query(entries_path, sql, version).to_pylist()
    value: dict[str, Any] | None = json.loads(rows[0]["value"]) if rows else None
    return value
