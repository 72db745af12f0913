"""Building blocks every view uses: load a table's pending events typed, and keep a state table.

A *state table* is an SCD1 copy of one source table that a view keeps for its own joins (the search
view's categories, the cache view's orders and items); it is written by the same MERGE as the
warehouse's current tables (:func:`derived_views.apply.merge_current`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from derived_views.apply import BatchFacts, Range, dead_letter, facts, merge_current, pending, reduce_events, typed
from derived_views.context import ViewContext
from derived_views.progress import Progress
from derived_views.schema import TableSchema

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


@dataclass(frozen=True)
class TableResult:
    """What one sync step did to one Delta table."""

    path: str
    events: int
    poison: int


@dataclass
class Pending:
    """The typed, locally checkpointed events a table has not applied yet, with their facts."""

    frame: DataFrame
    facts: BatchFacts
    progress: Progress

    def release(self) -> None:
        """Free the checkpointed batch."""
        self.frame.unpersist()


def is_current(progress: Progress, rng: Range, topics: list[str]) -> bool:
    """Whether a table with ``progress`` has already applied everything of ``topics`` up to the range."""
    return all(
        progress.next_offset(topic, p) >= end
        for topic in topics
        for p, end in rng.watermark.offsets.get(topic, {}).items()
    )


def columns_of(schema: TableSchema) -> list[tuple[str, str]]:
    """``(name, spark type)`` of every source column."""
    return [(c.name, c.spark_type) for c in schema.columns]


def load_pending(
    ctx: ViewContext,
    rng: Range,
    schema: TableSchema,
    progress: Progress | None,
    mode: str,
    *,
    dead_letter_path: str,
    target: str,
) -> Pending:
    """Typed events of ``schema``'s topic after ``progress`` (all of them when ``None``), poison recorded."""
    raw = pending(ctx.spark, rng, [schema.topic], progress)
    frame = typed(reduce_events(raw, mode), columns_of(schema), schema.qualified).localCheckpoint()
    batch = facts(frame)
    if batch.poison:
        dead_letter(ctx.spark, dead_letter_path, frame, target)
    return Pending(frame, batch, rng.progress([schema.topic], progress))


def apply_state(
    ctx: ViewContext, rng: Range, schema: TableSchema, path: str, dead_letter_path: str, *, replace: bool
) -> TableResult | None:
    """Bring the SCD1 state table of ``schema`` at ``path`` to the range's watermark."""
    progress = None if replace else ctx.progress(path)
    if progress is not None and is_current(progress, rng, [schema.topic]):
        return None
    batch = load_pending(ctx, rng, schema, progress, "latest", dead_letter_path=dead_letter_path, target=path)
    merge_current(ctx.spark, path, batch.frame, columns_of(schema), batch.progress, batch.facts.truncates,
                  replace=replace)
    ctx.set_progress(path, batch.progress)
    batch.release()
    return TableResult(path, batch.facts.rows, batch.facts.poison)
