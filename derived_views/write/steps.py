"""Building blocks every view uses: load a table's pending events typed, and keep a state table.

A *state table* is an SCD1 copy of one source table that a view keeps for its own joins (each table a
search index or cache entity reads, :mod:`derived_views.views.composite_sync`); it is written by the same MERGE as the
warehouse's current tables (:func:`derived_views.write.scd1.merge_current`).
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from dataclasses import replace as with_fields
from typing import TYPE_CHECKING, Protocol

from derived_views.engine.commit_progress import committing
from derived_views.engine.delta_sql import is_local, table_ref
from derived_views.engine.evaluation import sized_for
from derived_views.engine.positions import record_position
from derived_views.engine.progress import Progress
from derived_views.errors import ViewError
from derived_views.events.batch_facts import BatchFacts, fact_columns, facts_of
from derived_views.events.metadata_columns import OP
from derived_views.events.schema import TableSchema
from derived_views.source.pending import read_in_driver, typed_batch, typed_events
from derived_views.source.table_step import Fill, TableStep
from derived_views.write.context import ViewContext
from derived_views.write.dead_letter import dead_letter
from derived_views.write.scd1 import merge_current
from derived_views.write.stored_defaults import NeedsTextError, fills_for

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
    checkpoint, see :func:`derived_views.source.pending.typed_batch`), with their facts, and the table's
    step that writes them (its ``progress``, types, truncates and fills known)."""

    frame: DataFrame
    facts: BatchFacts
    step: TableStep

    @property
    def progress(self) -> Progress:
        """The progress the batch's commit records."""
        return self.step.recorded

    @property
    def columns(self) -> list[tuple[str, str]]:
        """``(name, Spark type)`` of the data columns, as the target table stores them (stored names,
        :mod:`derived_views.events.column_names`, as in ``frame``)."""
        return self.step.stored_columns

    @property
    def fills(self) -> tuple[Fill, ...]:
        """The values of added columns that older rows hold, whose position is in the batch's range
        (:mod:`derived_views.write.stored_defaults`)."""
        return self.step.fills

    def release(self) -> None:
        """Free the checkpointed batch."""
        self.frame.unpersist()


#: An idle table on object storage records a newer watermark at most this often, in a commit (see
#: :func:`mark_as_of`); one on local disk records it at every step, in its position file.
IDLE_MARK_MS = 5_000


def is_current(ctx: ViewContext, step: TableStep) -> bool:
    """Whether the table of ``step`` has already applied (its ``applied`` progress) everything of the
    step's topics up to the watermark.

    Such a table is also exact as of the step's newer watermark: the table at the step's ``path``
    records the new one (:func:`mark_as_of`; on object storage only when its recorded one is more than
    :data:`IDLE_MARK_MS` older), so that its as-of LSN keeps moving while its source tables are idle. A
    table that never recorded progress (``applied`` ``None`` or empty) is never current: its first sync
    creates it, even empty.
    """
    progress, watermark = step.applied, step.as_of.watermark
    if progress is None or not progress.position:
        return False
    current = step.pending() == 0
    if (
        current
        and progress.position < watermark.position
        and (is_local(step.path) or watermark.timestamp_ms - progress.watermark_ts_ms >= IDLE_MARK_MS)
    ):
        mark_as_of(ctx, step.path, step.as_of.unchanged(step.topics, progress))
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


def load_pending(ctx: ViewContext, step: TableStep, schema: TableSchema, *, dead_letter_path: str) -> Pending:
    """Typed events of ``step`` (``schema``'s topic, after its ``applied`` progress; all of them when
    ``None``), poison recorded; the step that writes them carries their types, facts and new progress.

    The data columns take the types that hold every value the target table at the step's ``path`` holds
    and the batch brings (:meth:`~derived_views.events.schema.TableSchema.view_columns`; ``applied`` ``None``
    means the target is rebuilt, so only the log decides). A column that a poison event fills with a value
    its type cannot hold (``infinity`` or a BC date in a date or timestamp column, ``NaN`` in a decimal, a
    multi-dimensional array: :attr:`~derived_views.events.batch_facts.BatchFacts.widen`), or that an added
    column's stored default in the range holds (:mod:`derived_views.write.stored_defaults`), is typed as its
    JSON text and the batch parsed again, so the event lands.
    Columns take the stored names the target holds them under, also in a rebuild
    (:meth:`~derived_views.events.schema.TableSchema.stored_columns`).
    """
    progress, target = step.applied, step.path
    held = ctx.types.of(ctx.spark, target)
    existing = held if progress is not None else None
    stored_as = schema.stored_columns(held or {})
    text: set[str] = set()
    while True:
        columns = schema.view_columns(existing, text)
        step = with_fields(step, table=schema.qualified, columns=columns, plan=schema.parse_plan(columns), stored_as=stored_as)
        frame, batch = typed_batch(ctx.spark, step)
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
    applying = with_fields(
        step,
        progress=step.progress_after(since=held_since(progress, batch)),
        truncates=batch.truncates,
        inserts_only=batch.inserts_only,
        keys=batch.keys,
        keyless=batch.keyless,
        whole_rows=not batch.partial,
        fills=fills,
    )
    return Pending(frame, batch, applying)


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
    again (:func:`cdc.capture.column_marks.columns_filled_since`), whose truncate marker and reads replace every
    current row; history versions from before keep the dropped column's values under the name.
    """
    existing = ctx.types.of(ctx.spark, path) if progress is not None else None
    if existing is None:
        return
    renames = schema.stored_renames(existing)
    if renames:
        ctx.types.rename(ctx.spark, path, renames)


def apply_state(ctx: ViewContext, step: TableStep, schema: TableSchema, dead_letter_path: str) -> TableResult | None:
    """Bring the SCD1 state table of ``schema`` at the ``step``'s path to its watermark (one row per key,
    mode ``latest``; holding the table's lock in this process:
    :meth:`~derived_views.write.context.ViewContext.applying`)."""
    with ctx.applying(step.path):
        return apply_table(ctx, with_fields(step, mode="latest"), schema, dead_letter_path, merge_current)


class Merge(Protocol):
    """Applies one batch to one table in one commit: :func:`~derived_views.write.scd1.merge_current` or
    :func:`~derived_views.write.scd2.merge_history`."""

    def __call__(self, spark: SparkSession, step: TableStep, source: DataFrame, *, types: TableTypes) -> None: ...


def apply_table(
    ctx: ViewContext, step: TableStep, schema: TableSchema, dead_letter_path: str, merge: Merge
) -> TableResult | None:
    """Bring the table of ``schema`` at the ``step``'s path to its watermark: its pending events reduced
    by the step's ``mode`` (``latest``: one row per key; ``all``: every version) and applied by ``merge``
    in one commit, or, when it is rebuilt (``replace``, or it has no progress yet), written anew in one
    commit (:func:`rebuild_in_one_pass` when it can). Where the table starts is read here
    (:func:`starting_point`), into the step's ``applied`` and ``replace``."""
    path = step.path
    progress, replace = starting_point(ctx, path, step.replace)
    step = with_fields(step, applied=progress, replace=replace)
    if progress is not None and is_current(ctx, step):
        return None
    with sized_for(ctx.spark, step.pending(), [path]):
        follow_source_columns(ctx, schema, path, progress)
        batch = rebuild_in_one_pass(ctx, step, schema, merge) if replace else None
        if batch is None:
            batch = load_pending(ctx, step, schema, dead_letter_path=dead_letter_path)
            merge(ctx.spark, batch.step, batch.frame, types=ctx.types)
    ctx.set_progress(path, batch.progress)
    batch.release()
    return TableResult(path, batch.facts.rows, batch.facts.poison)


#: The message a one-pass rebuild stops with when its batch holds an event that needs the batch's facts
#: first (see :func:`rebuild_in_one_pass`); it names no failure of the table.
NEEDS_TWO_PASSES = "cdc: this rebuild needs its events checked before it is written"


def rebuild_in_one_pass(ctx: ViewContext, step: TableStep, schema: TableSchema, merge: Merge) -> Pending | None:
    """Rebuild the table at the ``step``'s path from all of ``schema``'s events read, typed and written by one Spark
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

    step = with_fields(step, applied=None, replace=True)
    if read_in_driver(step.pending()):
        return None
    path, mode = step.path, step.mode
    columns = schema.view_columns(None, set())
    stored_as = schema.stored_columns(ctx.types.of(ctx.spark, path) or {})
    step = with_fields(step, table=schema.qualified, columns=columns, plan=schema.parse_plan(columns), stored_as=stored_as)
    events = typed_events(ctx.spark, step)
    needs_facts = F.col("_cdc_error").isNotNull()
    if mode == "all":
        needs_facts = needs_facts | (F.col(OP) == "t")
    observation = Observation(f"cdc-facts-{uuid.uuid4().hex}")
    checked = (
        events.withColumn("_cdc_check", F.when(needs_facts, F.raise_error(F.lit(NEEDS_TWO_PASSES))))
        .observe(observation, *fact_columns(), F.count("_cdc_check").alias("checked"))
        .drop("_cdc_check")
    )
    try:
        fills = fills_for(ctx.spark, schema, None, columns, stored_as)
    except NeedsTextError:
        return None  # the usual way makes the column text first
    # the batch's facts are not known before it is written: no truncate, no append, no whole rows
    step = with_fields(
        step, progress=step.progress_after(), truncates=(), inserts_only=False, keys=None, whole_rows=False, fills=fills
    )
    try:
        merge(ctx.spark, step, checked, types=ctx.types)
    except Exception as exc:  # noqa: BLE001 - only the check's own stop is caught; anything else is raised
        if NEEDS_TWO_PASSES not in str(exc):
            raise
        log.warning(
            "rebuilding %s: its events hold poison%s; checking them first", path, " or a truncate" if mode == "all" else ""
        )
        return None
    return Pending(checked, facts_of(observation.get), step)
