"""Building blocks every view uses: load a table's pending events typed, and keep a state table.

A *state table* is an SCD1 copy of one source table that a view keeps for its own joins (each table a
search index or cache entity reads, :mod:`derived_views.views.composite_sync`); it is written by the same MERGE as the
warehouse's current tables (:func:`derived_views.write.scd1.merge_current`).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from derived_views.engine.delta_sql import is_local, table_ref
from derived_views.engine.evaluation import sized_for
from derived_views.engine.positions import record_position
from derived_views.engine.progress import Progress, committing
from derived_views.errors import ViewError
from derived_views.events.batch_facts import BatchFacts, fact_columns, facts_of
from derived_views.events.metadata_columns import OP
from derived_views.events.schema import TableSchema
from derived_views.source.as_of import LogAsOf, pending_events
from derived_views.source.pending import read_in_driver, typed_batch, typed_events
from derived_views.write.context import ViewContext
from derived_views.write.dead_letter import dead_letter
from derived_views.write.scd1 import merge_current
from derived_views.write.stored_defaults import Fill, NeedsTextError, fills_for

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from derived_views.write.table_evolution import TableTypes

log = logging.getLogger("cdc.views")


@dataclass(frozen=True)
class TableResult:
    """What one sync step did to one Delta table (``error``: why it applied nothing, see
    :mod:`derived_views.write.failures`)."""

    path: str
    events: int
    poison: int
    error: str | None = None


@dataclass
class Pending:
    """The typed events a table has not applied yet (a deterministic frame: local rows or a local
    checkpoint, see :func:`derived_views.source.pending.typed_batch`), with their facts."""

    frame: DataFrame
    facts: BatchFacts
    progress: Progress
    columns: list[tuple[str, str]]
    """``(name, Spark type)`` of the data columns, as the target table stores them (stored names,
    :mod:`derived_views.events.column_names`, as in ``frame``)."""
    fills: tuple[Fill, ...] = ()
    """The values of added columns that older rows hold, whose position is in the batch's range
    (:mod:`derived_views.write.stored_defaults`)."""

    def release(self) -> None:
        """Free the checkpointed batch."""
        self.frame.unpersist()


#: An idle table on object storage records a newer watermark at most this often, in a commit (see
#: :func:`mark_as_of`); one on local disk records it at every step, in its position file.
IDLE_MARK_MS = 5_000


def is_current(
    progress: Progress, as_of: LogAsOf, topics: list[str], ctx: ViewContext | None = None, path: str | None = None
) -> bool:
    """Whether a table with ``progress`` has already applied everything of ``topics`` up to the range.

    Such a table is also exact as of the range's newer watermark. When ``ctx`` and ``path`` are given,
    the table records the new one (:func:`mark_as_of`; on object storage only when its recorded one is
    more than :data:`IDLE_MARK_MS` older), so that its as-of LSN keeps moving while its source tables
    are idle. A table that never recorded progress is never current: its first sync creates it, even empty.
    """
    if not progress.position:
        return False
    current = pending_events(as_of.watermark, topics, progress) == 0
    if (
        current
        and ctx is not None
        and path is not None
        and progress.position < as_of.watermark.position
        and (is_local(path) or as_of.watermark.timestamp_ms - progress.watermark_ts_ms >= IDLE_MARK_MS)
    ):
        mark_as_of(ctx, path, as_of.unchanged(topics, progress))
    return current


def mark_as_of(ctx: ViewContext, path: str, progress: Progress) -> None:
    """Record ``progress`` on the table at ``path`` without changing its data: in its position file
    (:mod:`derived_views.engine.positions`, no Delta commit), or, on object storage, in a commit that
    changes no data."""
    recorded = record_position(path, progress, ctx.progress(path))
    if recorded is None:
        with committing(ctx.spark, progress):
            ctx.spark.sql(f"ALTER TABLE {table_ref(path)} SET TBLPROPERTIES ('cdc.asOfPosition' = '{progress.position}')")
        recorded = progress
    ctx.set_progress(path, recorded)


def starting_point(ctx: ViewContext, path: str, replace: bool) -> tuple[Progress | None, bool]:
    """``(progress, replace)`` for a table: a table that never recorded progress is built like a rebuild.

    Its first batch then overwrites it in one commit (no MERGE against an empty table); ``None``
    progress means "read the topics from offset 0".
    """
    if replace:
        return None, True
    progress = ctx.progress(path)
    if not progress.position:
        return None, True
    return progress, False


def load_pending(
    ctx: ViewContext,
    as_of: LogAsOf,
    schema: TableSchema,
    progress: Progress | None,
    mode: str,
    *,
    dead_letter_path: str,
    target: str,
) -> Pending:
    """Typed events of ``schema``'s topic after ``progress`` (all of them when ``None``), poison recorded.

    The data columns take the types that hold every value the target table at ``target`` holds and the
    batch brings (:meth:`~derived_views.events.schema.TableSchema.view_columns`; ``progress`` ``None`` means
    the target is rebuilt, so only the log decides). A column that a poison event fills with a value
    its type cannot hold (``infinity`` or a BC date in a date or timestamp column, ``NaN`` in a decimal, a
    multi-dimensional array: :attr:`~derived_views.events.batch_facts.BatchFacts.widen`), or that an added
    column's stored default in the range holds (:mod:`derived_views.write.stored_defaults`), is typed as its
    JSON text and the batch parsed again, so the event lands.
    Columns take the stored names the target holds them under, also in a rebuild
    (:meth:`~derived_views.events.schema.TableSchema.stored_columns`).
    """
    held = ctx.types.of(ctx.spark, target)
    existing = held if progress is not None else None
    stored_as = schema.stored_columns(held or {})
    text: set[str] = set()
    while True:
        columns = schema.view_columns(existing, text)
        frame, batch = typed_batch(
            ctx.spark,
            as_of,
            [schema.topic],
            progress,
            mode,
            columns,
            schema.qualified,
            schema.parse_plan(columns),
            stored_as=stored_as,
        )
        widen = set(batch.widen)
        try:
            fills = fills_for(ctx.spark, schema, progress.lsn if progress is not None else None, columns, stored_as)
        except NeedsTextError as exc:
            if not set(exc.columns) - text:
                raise ViewError(f"{schema.qualified}: column {exc} does not hold an added column's stored default") from exc
            widen |= set(exc.columns)
            fills = ()
        if not widen - text:
            break
        text |= widen
        frame.unpersist()
    if batch.poison:
        dead_letter(ctx.spark, dead_letter_path, frame, target, ctx.types)
    return Pending(
        frame,
        batch,
        as_of.progress([schema.topic], progress, since=held_since(progress, batch)),
        [(stored_as[name], spark_type) for name, spark_type in columns],
        fills,
    )


def held_since(progress: Progress | None, facts: BatchFacts) -> int | None:
    """The commit LSN of the newest event a table holds once the batch with ``facts`` is applied to it as
    ``progress`` left it (``None``: rebuilt from the batch); ``None`` when neither tells."""
    held = [lsn for lsn in (progress.since_lsn if progress is not None else None, facts.newest_lsn) if lsn is not None]
    return max(held) if held else None


def follow_source_columns(ctx: ViewContext, schema: TableSchema, path: str, progress: Progress | None) -> None:
    """Rename the columns of the table at ``path`` (a copy of ``schema``'s table: current state or
    history) that were renamed in the source, keeping their values under the new name, in one commit
    without progress before the table's next batch (values unchanged, so the table stays exact as of its
    watermark; after a crash the next run finds it renamed).

    A column dropped and added again under the same name is another column: capture reads the table
    again (:func:`cdc.capture.catalog.columns_filled_since`), whose truncate marker and reads replace every
    current row; history versions from before keep the dropped column's values under the name.
    """
    existing = ctx.types.of(ctx.spark, path) if progress is not None else None
    if existing is None:
        return
    renames = schema.stored_renames(existing)
    if renames:
        ctx.types.rename(ctx.spark, path, renames)


def apply_state(
    ctx: ViewContext, as_of: LogAsOf, schema: TableSchema, path: str, dead_letter_path: str, *, replace: bool
) -> TableResult | None:
    """Bring the SCD1 state table of ``schema`` at ``path`` to the range's watermark (holding the table's
    lock in this process: :meth:`~derived_views.write.context.ViewContext.applying`)."""
    with ctx.applying(path):
        return apply_table(ctx, as_of, schema, path, dead_letter_path, "latest", merge_current, replace=replace)


class Merge(Protocol):
    """Applies one batch to one table in one commit: :func:`~derived_views.write.scd1.merge_current` or
    :func:`~derived_views.write.scd2.merge_history`."""

    def __call__(
        self,
        spark: SparkSession,
        path: str,
        source: DataFrame,
        columns: list[tuple[str, str]],
        progress: Progress,
        truncates: tuple[int, ...] = (),
        *,
        replace: bool = False,
        inserts_only: bool = False,
        keys: Sequence[str] | None = None,
        whole_rows: bool = False,
        types: TableTypes,
        fills: tuple[Fill, ...] = (),
    ) -> None: ...


def apply_table(
    ctx: ViewContext,
    as_of: LogAsOf,
    schema: TableSchema,
    path: str,
    dead_letter_path: str,
    mode: str,
    merge: Merge,
    *,
    replace: bool,
) -> TableResult | None:
    """Bring the table of ``schema`` at ``path`` to the range's watermark: its pending events reduced by
    ``mode`` (``latest``: one row per key; ``all``: every version) and applied by ``merge`` in one
    commit, or, when it is rebuilt (``replace``, or it has no progress yet), written anew in one commit
    (:func:`rebuild_in_one_pass` when it can)."""
    progress, replace = starting_point(ctx, path, replace)
    if progress is not None and is_current(progress, as_of, [schema.topic], ctx, path):
        return None
    with sized_for(ctx.spark, pending_events(as_of.watermark, [schema.topic], progress), [path]):
        follow_source_columns(ctx, schema, path, progress)
        batch = rebuild_in_one_pass(ctx, as_of, schema, path, mode, merge) if replace else None
        if batch is None:
            batch = load_pending(ctx, as_of, schema, progress, mode, dead_letter_path=dead_letter_path, target=path)
            merge(
                ctx.spark,
                path,
                batch.frame,
                batch.columns,
                batch.progress,
                batch.facts.truncates,
                replace=replace,
                inserts_only=batch.facts.inserts_only,
                keys=batch.facts.keys,
                whole_rows=not batch.facts.partial,
                types=ctx.types,
                fills=batch.fills,
            )
    ctx.set_progress(path, batch.progress)
    batch.release()
    return TableResult(path, batch.facts.rows, batch.facts.poison)


#: The message a one-pass rebuild stops with when its batch holds an event that needs the batch's facts
#: first (see :func:`rebuild_in_one_pass`); it names no failure of the table.
NEEDS_TWO_PASSES = "cdc: this rebuild needs its events checked before it is written"


def rebuild_in_one_pass(
    ctx: ViewContext, as_of: LogAsOf, schema: TableSchema, path: str, mode: str, merge: Merge
) -> Pending | None:
    """Rebuild the table at ``path`` from all of ``schema``'s events read, typed and written by one Spark
    job (no checkpoint of the batch, no second read); ``None`` when it wrote nothing and the caller
    applies the batch the usual way (:func:`load_pending`, then ``merge``).

    The usual way checkpoints the typed batch so that its facts are known before anything is written:
    its poison events go to the dead-letter table first, and a history table (``all``) closes versions
    at its truncates. A batch with neither needs no fact, so here it goes straight into ``merge``'s
    overwrite, with its facts observed by the same job, and the job fails (:data:`NEEDS_TWO_PASSES`)
    on the first row that needs them: a poison event, or (``all``) a truncate. The check is one of the
    observed metrics, so Spark evaluates it on every row the job reads, before any filter. A failed
    job commits nothing, so the table is either rebuilt from a batch without such rows, or untouched.
    Small batches (read in the driver, :func:`~derived_views.source.pending.read_in_driver`) cost little
    either way and always go the usual way.
    """
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    if read_in_driver(pending_events(as_of.watermark, [schema.topic], None)):
        return None
    columns = schema.view_columns(None, set())
    stored_as = schema.stored_columns(ctx.types.of(ctx.spark, path) or {})
    events = typed_events(
        ctx.spark, as_of, [schema.topic], None, mode, columns, schema.qualified, schema.parse_plan(columns), stored_as=stored_as
    )
    needs_facts = F.col("_cdc_error").isNotNull()
    if mode == "all":
        needs_facts = needs_facts | (F.col(OP) == "t")
    observation = Observation(f"cdc-facts-{uuid.uuid4().hex}")
    checked = (
        events.withColumn("_cdc_check", F.when(needs_facts, F.raise_error(F.lit(NEEDS_TWO_PASSES))))
        .observe(observation, *fact_columns(), F.count("_cdc_check").alias("checked"))
        .drop("_cdc_check")
    )
    progress = as_of.progress([schema.topic], None)
    stored_columns = [(stored_as[name], spark_type) for name, spark_type in columns]
    try:
        fills = fills_for(ctx.spark, schema, None, columns, stored_as)
    except NeedsTextError:
        return None  # the usual way makes the column text first
    try:
        merge(ctx.spark, path, checked, stored_columns, progress, (), replace=True, types=ctx.types, fills=fills)
    except Exception as exc:  # noqa: BLE001 - only the check's own stop is caught; anything else is raised
        if NEEDS_TWO_PASSES not in str(exc):
            raise
        log.warning(
            "rebuilding %s: its events hold poison%s; checking them first", path, " or a truncate" if mode == "all" else ""
        )
        return None
    return Pending(checked, facts_of(observation.get), progress, stored_columns, fills)
