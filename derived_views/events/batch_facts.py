"""What one action learns about a typed batch: its size, poison count, truncates and append check.

:class:`BatchFacts` is computed either in the driver from the batch's Arrow rows (:func:`arrow_facts`) or
by the same Spark job that checkpoints a large batch (:func:`checkpointed`), so a batch is never
evaluated twice to learn about it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from derived_views.events.metadata_columns import KEY, LSN, OP, UNCHANGED

if TYPE_CHECKING:
    from pyspark.sql import Column as SparkColumn
    from pyspark.sql import DataFrame


#: Most keys an insert-only batch may have for the append check (rule 7 of :mod:`derived_views.write.apply`);
#: a larger batch is merged.
APPEND_CHECK_KEYS = 20_000


@dataclass(frozen=True)
class BatchFacts:
    """What one action learns about a typed batch: its size, poison count and truncate LSNs."""

    rows: int
    poison: int
    truncates: tuple[int, ...]
    not_inserts: int = 0
    partial: int = 0
    keys: tuple[str, ...] | None = None
    """The keys of an insert-only batch held in the driver (at most :data:`APPEND_CHECK_KEYS`), else ``None``."""
    widen: tuple[str, ...] = ()
    """Columns that a poison event fills with a value their type cannot hold (infinity in a date, NaN in a
    decimal, a multi-dimensional array...): typed as ``string``, they hold it."""
    newest_lsn: int | None = None
    """The commit LSN of the batch's newest event (``None``: no event carries one). The reductions keep
    each key's newest event and a truncate after the events it drops, so this is the newest of the range."""
    keyed: int | None = None
    """Events that carry a key (``None``: not counted)."""

    @property
    def keyless(self) -> bool:
        """No event carries a key: the batch of a table without a primary key or replica identity index,
        whose rows never match a table row (rule 9 of :mod:`derived_views.write.apply`)."""
        return self.rows > 0 and self.keyed == 0

    @property
    def inserts_only(self) -> bool:
        """Every event is an insert (``c``): appended instead of merged when no key meets the table (rule 7)."""
        return self.rows > 0 and self.not_inserts == 0


def fact_columns() -> list[SparkColumn]:
    """The aggregates :class:`BatchFacts` is made of, over a frame of :func:`typed`'s columns."""
    from pyspark.sql import functions as F

    return [
        F.count(F.lit(1)).alias("rows"),
        F.count(F.col("_cdc_error")).alias("poison"),
        F.collect_set(F.when(F.col(OP) == "t", F.col(LSN))).alias("truncates"),
        F.count(F.when((F.col(OP) != "c") | F.col("_cdc_error").isNotNull() | F.col(KEY).isNull(), 1)).alias("other"),
        F.count(F.when(F.size(F.col(UNCHANGED)) > 0, 1)).alias("partial"),
        F.max(F.col(LSN)).alias("newest_lsn"),
        F.count(F.col(KEY)).alias("keyed"),
    ]


def facts_of(row: Any) -> BatchFacts:
    newest = row["newest_lsn"]
    return BatchFacts(
        int(row["rows"]),
        int(row["poison"]),
        tuple(sorted(row["truncates"] or [])),
        int(row["other"]),
        int(row["partial"]),
        newest_lsn=None if newest is None else int(newest),
        keyed=int(row["keyed"]),
    )


def checkpointed(frame: DataFrame) -> tuple[DataFrame, BatchFacts]:
    """``frame`` checkpointed locally, and its :class:`BatchFacts` observed by the same Spark job."""
    import uuid

    from pyspark.sql import Observation

    observation = Observation(f"cdc-facts-{uuid.uuid4().hex}")
    saved = frame.observe(observation, *fact_columns()).localCheckpoint()
    return saved, facts_of(observation.get)


def arrow_facts(rows: Any) -> BatchFacts:
    """The :class:`BatchFacts` of typed rows held in the driver (an Arrow table of :func:`typed`'s columns)."""
    import pyarrow.compute as pc

    op = rows.column(OP)
    error = rows.column("_cdc_error")
    truncates = pc.unique(rows.column(LSN).filter(pc.fill_null(pc.equal(op, "t"), False))).to_pylist()
    other = pc.or_(pc.or_(pc.fill_null(pc.not_equal(op, "c"), True), pc.is_valid(error)), pc.is_null(rows.column(KEY)))
    partial = pc.greater(pc.list_value_length(rows.column(UNCHANGED)), 0)
    not_inserts = int(pc.sum(pc.cast(other, "int64")).as_py() or 0)
    keys = None
    if not_inserts == 0 and 0 < rows.num_rows <= APPEND_CHECK_KEYS:
        keys = tuple(rows.column(KEY).to_pylist())
    widen = sorted({name for names in rows.column("_cdc_widen").to_pylist() if names for name in names})
    return BatchFacts(
        rows.num_rows,
        rows.num_rows - error.null_count,
        tuple(sorted(lsn for lsn in truncates if lsn is not None)),
        not_inserts,
        int(pc.sum(pc.cast(pc.fill_null(partial, False), "int64")).as_py() or 0),
        keys,
        tuple(widen),
        pc.max(rows.column(LSN)).as_py() if rows.num_rows else None,
        rows.num_rows - rows.column(KEY).null_count,
    )
