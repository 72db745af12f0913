"""Warehouse view: per source table a current-state (SCD1) and a history (SCD2) Delta table.

Paths below ``CDC_DATA_DIR``, where ``<schema>.<table>`` stands for the table's directory name
(:func:`log_store.topic_names.dir_name` of its log name): ``<schema>.<table>`` when both names are
plain (ASCII letters, digits, ``_``, ``-``), else both escaped and joined by ``..``, shortened with a
hash past 231 characters. It is one path component, different for every table, never ``.`` or ``..``
and without ``/``, so no table name reaches outside ``warehouse/current`` or ``warehouse/history``.

- ``warehouse/current/<schema>.<table>``: one row per key with the source's columns (names and
  faithful types from :mod:`derived_views.events.schema`) plus ``_cdc_key`` (the key as canonical JSON),
  ``_cdc_lsn``/``_cdc_seq`` (position of the event the row comes from), ``_cdc_commit_ts`` and
  ``_cdc_op``. A keyless table is append-only (its rows never match, so every insert is appended).
  Its history keeps the same rows as versions, each current until a truncate ends it.
- ``warehouse/history/<schema>.<table>``: one row per version with the source's columns plus
  ``_cdc_valid_from_lsn/_seq/_ts``, ``_cdc_valid_to_lsn/_seq/_ts`` (NULL while current; a truncate
  closes with sequence -1), ``_cdc_is_current`` and ``_cdc_op`` (``d`` rows mark deletions),
  partitioned by ``_cdc_is_current`` (:data:`derived_views.write.scd2.HISTORY_PARTITIONS`).
- ``warehouse/_dead_letter``: poison events with their error.

MERGE clauses and guarantees are those of :func:`derived_views.write.scd1.merge_current` and
:func:`derived_views.write.scd2.merge_history`. Schema evolution, each change in a commit of its own before
the batch that needs it (no progress moves with it, so a crash in between repeats it or finds it done):

- a new column in the schema topic is added to both tables (``ALTER TABLE ADD COLUMNS``);
- a column whose type changed is converted to a type that holds every version's values
  (:mod:`derived_views.events.column_types`, :mod:`derived_views.write.table_evolution`), and each event is parsed
  with the types in force at its position (:meth:`derived_views.events.schema.TableSchema.parse_plan`);
- a renamed column is renamed in the tables (:func:`derived_views.write.steps.follow_source_columns`); a column
  dropped and added again under the same name makes capture read the table again;
- a dropped column stays in the tables and is no longer filled (rows written afterwards hold NULL there).

A table whose batch fails is reported and the other tables are applied (:mod:`derived_views.write.failures`).
Each table's as-of watermark is the ``userMetadata`` progress of its newest commit (:mod:`derived_views.engine.commit_progress`),
moved on without a commit while it has nothing to apply (:mod:`derived_views.engine.positions`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace as with_fields
from functools import partial
from typing import TYPE_CHECKING

from derived_views.source.as_of import LogAsOf
from derived_views.source.table_step import TableStep
from derived_views.views import kinds
from derived_views.write.context import ViewContext
from derived_views.write.failures import summary
from derived_views.write.scd2 import merge_history
from derived_views.write.steps import TableResult, apply_state, apply_table
from log_store.topic_names import dir_name

if TYPE_CHECKING:
    from derived_views.events.schema import TableSchema
    from derived_views.source.watermark import LogWatermark

NAME = kinds.WAREHOUSE
log = logging.getLogger("cdc.views")


def current_path(ctx: ViewContext, name: str) -> str:
    """Path of the current-state table of the table whose log name is ``name`` (``schema.table`` when plain)."""
    return ctx.path(NAME, "current", dir_name(name))


def history_path(ctx: ViewContext, name: str) -> str:
    """Path of the history table of the table whose log name is ``name`` (``schema.table`` when plain)."""
    return ctx.path(NAME, "history", dir_name(name))


def dead_letter_path(ctx: ViewContext) -> str:
    """Path of the warehouse's dead-letter table."""
    return ctx.path(NAME, "_dead_letter")


def topics(ctx: ViewContext, watermark: LogWatermark) -> list[str]:
    """The topics this view reads: those of the source tables it keeps (every captured one by default)."""
    return sorted(
        schema.topic for schema in ctx.schemas(watermark).values() if ctx.definitions.warehouse.keeps(schema.dotted_name)
    )


def _has_pending(ctx: ViewContext, step: TableStep) -> bool:
    """Whether the table of ``step`` (a current-state table) has events to apply in the range (no progress
    yet counts)."""
    try:
        progress = ctx.progress(step.path)
    except Exception:  # noqa: BLE001 - a table that cannot be read fails in its own step, alone (see sync)
        return True
    return not progress.position or with_fields(step, applied=progress).pending() > 0


def _built_anew(ctx: ViewContext, step: TableStep) -> bool:
    """Whether the step writes its table anew (a rebuild, or a table with no progress yet), which may
    take one pass (:func:`~derived_views.write.steps.rebuild_in_one_pass`)."""
    if step.replace:
        return True
    try:
        return not ctx.progress(step.path).position
    except Exception:  # noqa: BLE001 - a table that cannot be read fails in its own step, alone (see sync)
        return False


#: Source tables applied at once in a step, each its current and history table side by side (so up to
#: twice as many MERGEs at once). Most of a small MERGE's time is the driver planning it and Delta
#: committing it, single-threaded, so tables overlap well even on two cores. A table written anew goes
#: alone (see :func:`_apply_table_pair`).
TABLES_SIDE_BY_SIDE = 4


def _applied(apply: Callable[[], TableResult | None], path: str) -> TableResult | None:
    """``apply()``'s result, or the failure of the table at ``path`` as a result (the others go on)."""
    try:
        return apply()
    except Exception as exc:  # noqa: BLE001 - one table's failure must not stop the others
        log.error("warehouse table %s failed: %s", path, summary(exc))
        return TableResult(path, 0, 0, summary(exc))


def _apply_table_pair(
    ctx: ViewContext, schema: TableSchema, current_step: TableStep, history_step: TableStep, keeps_history: bool, alone: bool
) -> list[TableResult]:
    """The results of bringing one source table's current and (when kept) history table to the step's
    watermark, each in a session of its own (their MERGEs carry their progress in a session setting, so
    they must not share one). A table that fails is reported and the other applied.

    A step applies the two side by side; ``alone`` (a table written anew), one after the other: a
    one-pass write stops its own Spark job on purpose when the batch needs checking first
    (:func:`~derived_views.write.steps.rebuild_in_one_pass`), and a job stopped while another job of the
    application runs beside it was seen to take down a Python worker that job was reading with."""
    with ctx.lane() as lane:
        current = partial(apply_state, lane.beside(), current_step, schema, dead_letter_path(lane))
        history = partial(apply_table, lane, history_step, schema, dead_letter_path(lane), merge_history)
        if alone:
            applied = _applied(current, current_step.path)
            kept = _applied(history, history_step.path) if keeps_history else None
            return [result for result in (applied, kept) if result is not None]
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="warehouse-current") as beside:
            beside_current = beside.submit(_applied, current, current_step.path)
            kept = _applied(history, history_step.path) if keeps_history else None
            applied = beside_current.result()
    return [result for result in (applied, kept) if result is not None]


def sync(ctx: ViewContext, as_of: LogAsOf, *, replace: bool = False, only: list[str] | None = None) -> list[TableResult]:
    """Bring every warehouse table to the range's watermark (or rebuild them when ``replace``); ``only``: log
    names of the tables to bring (``schema.table`` for plain names).

    A table whose batch fails is reported in its :class:`TableResult` (``error``) and the others go on
    (:mod:`derived_views.write.failures`): it commits nothing, so it stays exact as of its last watermark.

    Up to :data:`TABLES_SIDE_BY_SIDE` source tables are applied at once. Tables with events in the range
    start first (in name order), then the idle ones, whose step only records the newer watermark
    (:func:`~derived_views.write.steps.is_current`; in a small file beside the table, no Delta commit):
    that never delays a change becoming visible. Each table records its own progress, so the order
    changes nothing else. A table written anew (every table of a rebuild, a table's first build) is
    applied alone, its current and history one after the other, before the others start.
    """
    results: list[TableResult] = []
    kept = ctx.definitions.warehouse
    chosen = [
        (
            schema,
            TableStep(as_of, [schema.topic], current_path(ctx, name), "latest", replace=replace),
            TableStep(as_of, [schema.topic], history_path(ctx, name), "all", replace=replace),
        )
        for name, schema in sorted(ctx.schemas(as_of.watermark).items())
        if (not only or name in only) and kept.keeps(schema.dotted_name)
    ]
    ordered = sorted(chosen, key=lambda item: not _has_pending(ctx, item[1]))
    anew = [_built_anew(ctx, current) or _built_anew(ctx, history) for _, current, history in ordered]
    for (schema, current, history), alone in zip(ordered, anew, strict=True):
        if alone:
            results.extend(_apply_table_pair(ctx, schema, current, history, kept.keeps_history(schema.dotted_name), True))
    with ThreadPoolExecutor(max_workers=TABLES_SIDE_BY_SIDE, thread_name_prefix="warehouse") as pool:
        pairs = [
            pool.submit(_apply_table_pair, ctx, schema, current, history, kept.keeps_history(schema.dotted_name), False)
            for (schema, current, history), alone in zip(ordered, anew, strict=True)
            if not alone
        ]
        for pair in pairs:
            results.extend(pair.result())
    return results
