"""Cache view: one serialized current value per entity, laid out for point lookups.

Entities (``cdc cache get ENTITY KEY``):

- ``order``: an order with its items, as JSON: the order's columns plus ``items`` (the order's
  ``order_items`` rows sorted by ``line_no``). Rebuilt when the order or any of its items changes.
  Decimals keep their scale (``19.90``), instants are UTC with microseconds (``...T12:45:00.123456Z``).

Paths below ``CDC_DATA_DIR``:

- ``cache/_state/public.orders``, ``cache/_state/public.order_items``: the view's SCD1 copies of the
  source tables (:func:`derived_views.apply.merge_current`).
- ``cache/entries``: ``entity``, ``entity_key`` (the key column's value as text), ``value`` (JSON),
  ``_cdc_lsn`` (the newest source event folded into the value). Lookups filter on
  ``entity``/``entity_key``, which Delta's per-file statistics prune.
- ``cache/_dead_letter``: poison events.

``entries`` MERGE, target ``t`` on ``t.entity = s.entity AND t.entity_key = s.entity_key``, in order:

- ``WHEN MATCHED AND s.value IS NULL THEN DELETE`` (the order is gone)
- ``WHEN MATCHED THEN UPDATE SET value, _cdc_lsn``
- ``WHEN NOT MATCHED AND s.value IS NOT NULL THEN INSERT``
- ``WHEN NOT MATCHED BY SOURCE AND <a truncate was applied> THEN DELETE``

The affected orders come from the entries table's own pending events (order keys, and the
``order_id`` of changed items), so a crash between the state commits and the entries commit is
repaired by the next sync; values are recomputed from the state tables as of the watermark.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from derived_views.apply import LSN, OP, Range, ensure_table
from derived_views.context import ViewContext
from derived_views.delta_reads import read_query, sql_text
from derived_views.errors import MissingTableError, UnknownEntityError
from derived_views.progress import Progress, committing
from derived_views.steps import TableResult, starting_point, apply_state, is_current, load_pending
from log_store.topic_names import dir_name, log_name

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

NAME = "cache"
#: The source tables, by log name (found by their schema and table names, not by a topic name built here).
ORDERS = log_name("public", "orders")
ITEMS = log_name("public", "order_items")
#: The view's tables below its directory, and what each holds.
TABLES = {f"_state/{ORDERS}": "copy of public.orders", f"_state/{ITEMS}": "copy of public.order_items",
          "entries": "order entities (an order with its items)"}
ENTITIES = ("order",)
_MICROS = "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX"
_MICROS_NTZ = "yyyy-MM-dd'T'HH:mm:ss.SSSSSS"
ENTRIES_DDL = "entity string, entity_key string, value string, _cdc_lsn bigint"


def path(ctx: ViewContext, table: str) -> str:
    """Path of one of the view's tables (``entries``, ``_state/<schema.table>``, ``_dead_letter``)."""
    return ctx.path(NAME, table)


def _values(ctx: ViewContext, order_ids: list[str] | None) -> DataFrame:
    """``(entity_key, value, _cdc_lsn)`` of the given orders (all when ``None``) from the state tables."""
    from pyspark.sql import functions as F

    orders = ctx.spark.read.format("delta").load(path(ctx, f"_state/{ORDERS}"))
    items = ctx.spark.read.format("delta").load(path(ctx, f"_state/{ITEMS}"))
    if order_ids is not None:
        orders = orders.filter(F.col("id").isin(order_ids))
        items = items.filter(F.col("order_id").isin(order_ids))
    order_columns = [c for c in orders.columns if not c.startswith("_cdc_")]
    item_columns = [c for c in items.columns if not c.startswith("_cdc_")]
    grouped = items.groupBy(F.col("order_id").alias("_oid")).agg(
        F.array_sort(F.collect_list(F.struct(*[F.col(c) for c in ["line_no"] + [c for c in item_columns if c != "line_no"]]))).alias("items"),
        F.max(LSN).alias("_items_lsn"),
    )
    joined = orders.join(grouped, F.col("id") == F.col("_oid"), "left")
    return joined.select(
        F.col("id").cast("string").alias("entity_key"),
        F.to_json(F.struct(*[F.col(c) for c in order_columns],
                           F.coalesce(F.col("items"), F.array()).alias("items")),
                  {"timestampFormat": _MICROS, "timestampNTZFormat": _MICROS_NTZ}).alias("value"),
        F.greatest(F.col(LSN), F.coalesce(F.col("_items_lsn"), F.col(LSN))).alias(LSN),
    )


def _affected(ctx: ViewContext, rng: Range, progress: Progress | None) -> list[str] | None:
    """Order ids with events after ``progress`` (``None``: all of them, after a truncate)."""
    from pyspark.sql import functions as F

    ids: set[str] = set()
    for table, column in ((ORDERS, "id"), (ITEMS, "order_id")):
        batch = load_pending(ctx, rng, ctx.schema(rng.watermark, table), progress, "latest",
                             dead_letter_path=path(ctx, "_dead_letter"), target=path(ctx, "entries"))
        truncated = bool(batch.facts.truncates)
        ids.update(str(r[column]) for r in batch.frame.filter(F.col(OP) != "t").select(column).collect()
                   if r[column] is not None)
        batch.release()
        if truncated:
            return None
    return sorted(ids)


def _entries(ctx: ViewContext, rng: Range, replace: bool) -> TableResult | None:
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    entries_path = path(ctx, "entries")
    topics = [ctx.schema(rng.watermark, ORDERS).topic, ctx.schema(rng.watermark, ITEMS).topic]
    previous, replace = starting_point(ctx, entries_path, replace)
    if previous is not None and is_current(previous, rng, topics, ctx, entries_path):
        return None
    new_progress = rng.progress(topics, previous)
    affected = None if replace else _affected(ctx, rng, previous)
    values = _values(ctx, affected).select(F.lit("order").alias("entity"), "entity_key", "value", LSN)
    if affected is None:
        values.write.format("delta").mode("overwrite").option("overwriteSchema", "true").option(
            "userMetadata", new_progress.to_json()).save(entries_path)
        ctx.set_progress(entries_path, new_progress)
        return TableResult(entries_path, 0, 0)
    ensure_table(ctx.spark, entries_path, ENTRIES_DDL)
    gone = ctx.spark.createDataFrame([(key,) for key in affected], "entity_key string")
    source = gone.join(values, "entity_key", "left").select(F.lit("order").alias("entity"), "entity_key", "value", LSN)
    builder = (
        DeltaTable.forPath(ctx.spark, entries_path).alias("t")
        .merge(source.alias("s"), "t.entity = s.entity AND t.entity_key = s.entity_key")
        .whenMatchedDelete(condition="s.value IS NULL")
        .whenMatchedUpdate(set={"value": "s.value", LSN: f"s.{LSN}"})
        .whenNotMatchedInsert(condition="s.value IS NOT NULL", values={
            "entity": "s.entity", "entity_key": "s.entity_key", "value": "s.value", LSN: f"s.{LSN}"})
    )
    with committing(ctx.spark, new_progress):
        builder.execute()
    ctx.set_progress(entries_path, new_progress)
    return TableResult(entries_path, len(affected), 0)


def sync(ctx: ViewContext, rng: Range, *, replace: bool = False) -> list[TableResult]:
    """Bring the state tables, then the entries, to the range's watermark (rebuild when ``replace``)."""
    results = []
    for table in (ORDERS, ITEMS):
        result = apply_state(ctx, rng, ctx.schema(rng.watermark, table), path(ctx, f"_state/{dir_name(table)}"),
                             path(ctx, "_dead_letter"), replace=replace)
        if result is not None:
            results.append(result)
    entries = _entries(ctx, rng, replace)
    if entries is not None:
        results.append(entries)
    return results


def get(views_dir: str, entity: str, key: str) -> dict | None:
    """The cached value of ``entity`` ``key`` in the views at ``views_dir``, or ``None`` when there is none.

    Read with ``deltalake``, without Spark; the entity name is checked before anything is read."""
    from deltalake import DeltaTable

    if entity not in ENTITIES:
        raise UnknownEntityError(entity, list(ENTITIES))
    entries_path = f"{views_dir.rstrip('/')}/{NAME}/entries"
    if not DeltaTable.is_deltatable(entries_path):
        raise MissingTableError(entries_path, NAME)
    rows = read_query(entries_path, f"SELECT value FROM t WHERE entity = {sql_text(entity)} "
                               f"AND entity_key = {sql_text(key)} LIMIT 1").to_pylist()
    return json.loads(rows[0]["value"]) if rows else None
