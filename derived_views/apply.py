"""Shared apply machinery: read a log range, reduce it per key, decode typed rows, MERGE into Delta.

A table's pending range is read and reduced per log partition (:mod:`derived_views.events`): in the
driver when it is small (:data:`DRIVER_READ_LIMIT`), else by the Spark tasks that read it through the
``cdclog`` source (read and reduce in one Python worker per log partition). Each envelope is parsed
once: into typed columns by Arrow in the reduction when it can (:mod:`derived_views.typed_rows`), else
by Spark (:func:`typed`). A small batch is parsed in one Spark job whose
rows come back to the driver as Arrow, where its :class:`BatchFacts` are computed, and it is applied
from those rows (a local relation); a large one is checkpointed locally by one job that also observes
its facts (:func:`typed_batch`). Either way the source of a MERGE is deterministic.

Every view table is written through :func:`merge_current` (one row per key, SCD type 1) or
:func:`merge_history` (one row per version, SCD type 2). Both follow the same rules:

1. **Exactly the pending events.** A table reads ``[its progress, watermark)`` of the topics it
   consumes (:func:`pending`), so an event is applied to a table at most once; re-applying the same
   or an older batch is a no-op, so a deleted row can never come back from an older event.
2. **One Delta commit per table and batch**, carrying the new progress (offsets + watermark LSN and
   time, see :mod:`derived_views.progress`) as its ``userMetadata``: data and position move together.
   (A MERGE takes it from the session setting, under :func:`~derived_views.progress.committing`; an
   append or overwrite from its write option, so it runs beside other tables' commits.)
3. **LSN guard.** A source row replaces a table row only if its ``(lsn, sequence)`` is newer.
4. **Partial rows.** Columns an update left out (``unchanged`` header) are folded from the key's
   earlier event in the batch (:mod:`derived_views.events`), else kept from the table row.
5. **Truncate** empties the rows older than the truncate's LSN in the same MERGE.
6. **Poison events** (an unreadable envelope, or values that do not fit the column types) are written
   to the view's dead-letter Delta table first (idempotently, keyed by topic/partition/offset) and
   left out of the MERGE; the rest of the batch applies whole.
7. **Insert-only batches append when none of their keys is in the table.** When every pending
   event is an insert (``c``), its keys (up to :data:`APPEND_CHECK_KEYS`) are looked up in the table
   (history: among its current versions); when none is there, the rows (history: the versions, ordered per key) are
   appended in one commit instead of merged, which gives the MERGE's result. The check is needed: a
   reduced batch can hide a delete before a re-insert of the same key, a view behind compaction can
   read a re-insert whose delete and tombstone compaction removed, a delete routed to the
   dead-letter table leaves its row in place, and some removals never reach the log at all (a
   ``TRUNCATE`` of one partition of a table published through its root, which PostgreSQL does not
   replicate). The batch alone cannot rule these out, so the table is always asked; a batch held in
   the driver hands its keys over directly (:attr:`BatchFacts.keys`).
8. **Whole-row batches read no table rows.** A batch without partial rows takes every column from the
   source: the current table's MERGE reads only the target's key and position, and the history table
   fills nothing from its current versions.

:func:`merge_current` MERGE, target ``t`` on ``t._cdc_key = s._cdc_key``, clauses in this order:

- ``WHEN MATCHED AND s is newer AND s._cdc_op = 'd' THEN DELETE``
- ``WHEN MATCHED AND s is newer THEN UPDATE SET`` every column (an unchanged column keeps ``t``'s value;
  a batch without partial rows sets every column from ``s``, so only ``t``'s key and position are read)
- ``WHEN NOT MATCHED AND s._cdc_op <> 'd' THEN INSERT``
- ``WHEN NOT MATCHED BY SOURCE AND t._cdc_lsn < truncate_lsn THEN DELETE`` (only when the batch
  holds a truncate)

:func:`merge_history` uses the staged-union form: each key that has events gets a *close* row
(merge key = its key) and every event an *insert* row (merge key NULL); target ``t`` on
``t._cdc_key = s._merge_key AND t._cdc_is_current``:

- ``WHEN MATCHED AND s is newer than t's valid-from THEN UPDATE`` valid-to := s's first position,
  ``_cdc_is_current := false``
- ``WHEN NOT MATCHED AND s._merge_key IS NULL THEN INSERT`` the version row
- ``WHEN NOT MATCHED BY SOURCE AND t._cdc_is_current AND t valid-from < truncate THEN UPDATE``
  valid-to := the truncate, ``_cdc_is_current := false`` (only when the batch holds a truncate)

A rebuild (``replace=True``) computes the same rows from an empty table and overwrites the table in one
Delta commit (with ``overwriteSchema``), so readers see the old table until the new one is complete
(a large rebuild of one row per key reads, types and writes in one Spark job:
:func:`derived_views.steps.rebuild_in_one_pass`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from dataclasses import replace as with_fields
from typing import TYPE_CHECKING, Any

from derived_views.column_names import stored_names
from derived_views.column_types import convert, supertype
from derived_views.delta_sql import create_if_missing, is_delta_table, merge_into, table_ref
from derived_views.events import EVENT_DDL, reduce_table
from derived_views.log_source import LogWatermark, Offsets, offsets_json, plan_partitions, read_partition
from derived_views.progress import Progress, committing, with_progress
from derived_views.schema import quote, sql_string
from derived_views.table_keys import holds_any

if TYPE_CHECKING:
    from pyspark.sql import Column as SparkColumn
    from pyspark.sql import DataFrame, SparkSession

KEY, LSN, SEQ, TS, OP, UNCHANGED = "_cdc_key", "_cdc_lsn", "_cdc_seq", "_cdc_commit_ts", "_cdc_op", "_cdc_unchanged"
CURRENT_META_DDL = f"{KEY} string, {LSN} bigint, {SEQ} bigint, {TS} timestamp, {OP} string"
HISTORY_META_DDL = (
    f"{KEY} string, _cdc_valid_from_lsn bigint, _cdc_valid_from_seq bigint, _cdc_valid_from_ts timestamp, "
    "_cdc_valid_to_lsn bigint, _cdc_valid_to_seq bigint, _cdc_valid_to_ts timestamp, "
    f"_cdc_is_current boolean, {OP} string"
)
DEAD_LETTER_DDL = (
    "target string, topic string, partition int, offset bigint, key string, value string, error string, "
    "lsn bigint, recorded_at timestamp"
)


@dataclass(frozen=True)
class Range:
    """What one sync step reads: the log location, and the watermark every table moves to."""

    log_path: str
    watermark: LogWatermark

    def progress(self, topics: list[str], previous: Progress | None = None) -> Progress:
        """The progress a table consuming ``topics`` has once this range is applied (computed with the
        same definition as ``previous``)."""
        offsets = {t: dict(parts) for t, parts in (previous.offsets if previous else {}).items()}
        for topic in topics:
            offsets[topic] = dict(self.watermark.offsets.get(topic, {}))
        return Progress(offsets, self.watermark.position, self.watermark.timestamp_ms,
                        previous.definition if previous else "")


def read_log(
    spark: SparkSession, log_path: str, topics: list[str], start: Offsets, end: Offsets, reduce: str | None = None,
    columns: list[tuple[str, str]] | None = None,
) -> DataFrame:
    """Log rows of ``topics`` in ``[start, end)`` through the ``cdclog`` source: raw, or reduced per
    partition (``reduce`` = ``latest``/``all``, rows of :data:`EVENT_DDL`) by the tasks that read them,
    typed by Arrow as ``columns`` in the same parse when given (:mod:`derived_views.typed_rows`)."""
    import json

    from derived_views.log_source import register

    register(spark)
    reader = (
        spark.read.format("cdclog")
        .option("path", log_path)
        .option("topics", ",".join(topics))
        .option("startingOffsets", offsets_json(start))
        .option("endingOffsets", offsets_json({t: end.get(t, {}) for t in topics}))
    )
    if reduce is not None:
        reader = reader.option("reduce", reduce)
    if columns is not None:
        reader = reader.option("columns", json.dumps(columns))
    return reader.load()


#: A pending range of at most this many log offsets is read and reduced in the driver process and
#: handed to Spark as one Arrow table; larger ranges are read by Spark tasks through the ``cdclog``
#: source. Both give the same events (same reduction per log partition); the driver path saves the
#: source's planning round trips and Python workers, which dominate small batches.
DRIVER_READ_LIMIT = 100_000


def read_in_driver(offsets: int) -> bool:
    """Whether a pending range of ``offsets`` log offsets is read in the driver (:data:`DRIVER_READ_LIMIT`)."""
    return offsets <= DRIVER_READ_LIMIT


def _start(progress: Progress | None, topics: list[str]) -> Offsets:
    """Where a table with ``progress`` resumes reading ``topics`` (the log's start when it has none)."""
    return {t: dict((progress or Progress()).offsets.get(t, {})) for t in topics}


def pending_table(
    rng: Range, topics: list[str], progress: Progress | None, mode: str, row: Any | None = None
) -> Any | None:
    """The reduced events (an Arrow table of :data:`EVENT_DDL`, typed as ``row`` when given) of
    ``topics`` a table with ``progress`` has not applied, read in the driver; ``None`` when the range
    holds more than :data:`DRIVER_READ_LIMIT` offsets (then Spark tasks read it, see :func:`typed_batch`)."""
    import pyarrow as pa

    end = {t: rng.watermark.offsets.get(t, {}) for t in topics}
    parts = plan_partitions(rng.log_path, _start(progress, topics), end)
    if not read_in_driver(sum(part.end - part.start for part in parts)):
        return None
    tables = [reduce_table(read_partition(part), mode, row) for part in parts]
    return pa.concat_tables(tables) if tables else reduce_table([], mode, row)


def arrow_typed(columns: list[tuple[str, str]], plan: Plan | None) -> bool:
    """Whether events parsed with ``plan`` can be typed as ``columns`` by Arrow (:mod:`derived_views.typed_rows`):
    every event has the view's column types (one schema version), and Arrow parses each of them exactly."""
    from derived_views.typed_rows import row_type

    return (plan is None or (len(plan) == 1 and plan[0][1] == columns)) and row_type(columns) is not None


def typed_batch(
    spark: SparkSession, rng: Range, topics: list[str], progress: Progress | None, mode: str,
    columns: list[tuple[str, str]], table: str, plan: Plan | None = None,
) -> tuple[DataFrame, BatchFacts]:
    """The pending events typed (:func:`typed`), as a deterministic frame, with their :class:`BatchFacts`.

    A range small enough for the driver (:func:`pending_table`) is parsed by Spark in one job whose
    rows come back as Arrow: the facts are then computed in the driver and the frame is a local
    relation built from those rows. A larger range is read and parsed by Spark tasks and checkpointed
    locally, its facts observed by the same job (:func:`checkpointed`).
    """
    from derived_views.typed_rows import row_type, typed_ddl

    typed_columns = columns if arrow_typed(columns, plan) else None
    events = pending_table(rng, topics, progress, mode, row_type(typed_columns) if typed_columns else None)
    if events is None:
        frame, facts = checkpointed(typed_events(spark, rng, topics, progress, mode, columns, table, plan))
        if facts.poison:
            facts = with_fields(facts, widen=_widened(frame))
        return frame, facts
    ddl = EVENT_DDL if typed_columns is None else f"{EVENT_DDL}, {typed_ddl(typed_columns)}"
    parsed = typed(spark.createDataFrame(events, schema=ddl), columns, table, plan)
    rows = parsed.toArrow()
    return spark.createDataFrame(rows, schema=parsed.schema), arrow_facts(rows)


def typed_events(
    spark: SparkSession, rng: Range, topics: list[str], progress: Progress | None, mode: str,
    columns: list[tuple[str, str]], table: str, plan: Plan | None = None,
) -> DataFrame:
    """The pending events of ``topics`` read, reduced and typed by Spark tasks (:func:`typed`): each
    envelope parsed once, by Arrow in the task that reduces it when it can (:func:`arrow_typed`)."""
    typed_columns = columns if arrow_typed(columns, plan) else None
    raw = read_log(spark, rng.log_path, topics, _start(progress, topics), rng.watermark.offsets, reduce=mode,
                   columns=typed_columns)
    return typed(raw, columns, table, plan)


#: How events are parsed: ``((from LSN, from sequence), (name, Spark type) of each column)`` in position
#: order, see :meth:`derived_views.schema.TableSchema.parse_plan`.
Plan = list[tuple[tuple[int, int], list[tuple[str, str]]]]


def _before(position: tuple[int, int]) -> SparkColumn:
    """Whether an event's ``(lsn, seq)`` is before ``position``."""
    from pyspark.sql import functions as F

    lsn, seq = position
    return (F.col("lsn") < F.lit(lsn)) | ((F.col("lsn") == F.lit(lsn)) & (F.col("seq") < F.lit(seq)))


def _by_version(plan: Plan, parse: Callable[[list[tuple[str, str]]], SparkColumn]) -> SparkColumn:
    """``parse(types)`` with the types of the version in force at each event's position."""
    from pyspark.sql import functions as F

    if len(plan) == 1:
        return parse(plan[0][1])
    result = F.when(_before(plan[1][0]), parse(plan[0][1]))
    for (_, types), (upto, _) in zip(plan[1:-1], plan[2:], strict=True):
        result = result.when(_before(upto), parse(types))
    return result.otherwise(parse(plan[-1][1]))


def _json_path(*names: str) -> str:
    return "$" + "".join("['" + name.replace("'", "") + "']" for name in names)


def typed(events: DataFrame, columns: list[tuple[str, str]], table: str, plan: Plan | None = None) -> DataFrame:
    """Typed rows: the data columns parsed from the event (after, else before, else key) plus metadata.

    Events typed by Arrow in the reduction (``parsed`` true, :mod:`derived_views.typed_rows`) bring
    their ``after`` and ``before`` rows; any other envelope (``value``) is parsed once by Spark into
    them, with the column types in force at the event's LSN (``plan``, default: ``columns`` throughout), then cast to
    ``columns`` (the view's types, which hold every version's values) under their stored names
    (:mod:`derived_views.column_names`, as are the names ``_cdc_unchanged`` lists). ``_cdc_error`` is set on poison
    events: an unreadable envelope, or values that do not fit; it names each column, its type and the
    value that does not fit. ``_cdc_widen`` lists the array columns of a poison event that hold a
    multi-dimensional array, which a string column holds (:data:`BatchFacts.widen`).
    """
    from pyspark.sql import functions as F

    plan = plan or [((0, 0), columns)]
    ddl = ", ".join(f"{quote(n)} {t}" for n, t in columns)
    options = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": "_cdc_corrupt"}
    view_envelope = f"struct<after: struct<{_struct_ddl(columns)}>, before: struct<{_struct_ddl(columns)}>, _cdc_corrupt: string>"
    view_key = f"struct<{_struct_ddl(columns)}, _cdc_corrupt: string>"

    def envelope(types: list[tuple[str, str]]) -> SparkColumn:
        parsed = F.from_json(F.col("value"), f"after struct<{_struct_ddl(types)}>, before struct<{_struct_ddl(types)}>, "
                             "_cdc_corrupt string", options)
        return parsed if types == columns else parsed.cast(view_envelope)

    def keyed(types: list[tuple[str, str]]) -> SparkColumn:
        parsed = F.from_json(F.col("key"), ", ".join(f"{quote(n)} {t}" for n, t in types) + ", _cdc_corrupt string",
                             options)
        return parsed if types == columns else parsed.cast(view_key)

    env = _by_version(plan, envelope)
    if "parsed" in events.columns:  # typed by Arrow where it could (see derived_views.typed_rows)
        env = F.when(F.col("parsed"), F.struct(F.col("after").alias("after"), F.col("before").alias("before"),
                                                 F.lit(None).cast("string").alias("_cdc_corrupt"))).otherwise(env)
    # the two JSON parses (not compiled by Spark) get projections of their own, so that the one
    # picking the columns, which refers to them many times, is compiled
    has_after = F.col("_cdc_env.after").isNotNull()
    has_before = F.col("_cdc_env.before").isNotNull()
    parsed = events.select("*", env.alias("_cdc_env")).select(
        "*", F.when(~has_after & ~has_before & F.col("key").isNotNull(), _by_version(plan, keyed)).alias("_cdc_keyed")
    )
    corrupt = (F.col("op") != "t") & (F.col("_cdc_env._cdc_corrupt").isNotNull() | F.col("_cdc_keyed._cdc_corrupt").isNotNull())
    misfits = []
    widen = []
    for index, (name, view_type) in enumerate(columns):
        def single(types: list[tuple[str, str]], index: int = index) -> SparkColumn:
            one = _struct_ddl([types[index]])
            return F.from_json(F.col("value"), f"after struct<{one}>, before struct<{one}>, _cdc_corrupt string",
                               options).getField("_cdc_corrupt").isNotNull()

        text = F.coalesce(F.get_json_object(F.col("value"), _json_path("after", name)),
                          F.get_json_object(F.col("value"), _json_path("before", name)))
        bad = F.col("value").isNotNull() & _by_version(plan, single)
        misfits.append(F.when(bad, F.concat(F.lit(f"column {quote(name)} ({view_type}) cannot hold "),
                                            F.coalesce(F.substring(text, 1, 200), F.lit("its value")))))
        if view_type.startswith("array<") and not view_type.startswith("array<array<"):
            widen.append(F.when(bad & text.startswith("[["), F.lit(name)))
    detail = F.concat_ws("; ", *misfits) if misfits else F.lit("")
    bad = F.when(corrupt, F.concat(
        F.lit(f"values do not fit the columns of {table}: "),
        F.when(detail != "", detail).otherwise(F.lit(f"the key or the envelope does not fit ({ddl})"))))
    renamed = stored_names([name for name, _ in columns], table)
    return parsed.select(
        *[F.when(has_after, F.col("_cdc_env.after").getField(name))
          .when(has_before, F.col("_cdc_env.before").getField(name))
          .otherwise(F.col("_cdc_keyed").getField(name)).alias(renamed.get(name, name)) for name, _ in columns],
        F.col("key").alias(KEY),
        F.col("lsn").alias(LSN),
        F.col("seq").alias(SEQ),
        F.timestamp_millis(F.col("commit_ts_ms")).alias(TS),
        F.col("op").alias(OP),
        _stored_unchanged(F.col("unchanged"), renamed).alias(UNCHANGED),
        F.col("topic").alias("_cdc_topic"),
        F.col("partition").alias("_cdc_partition"),
        F.col("offset").alias("_cdc_offset"),
        F.coalesce(F.col("value"), F.col("key")).alias("_cdc_raw"),
        F.coalesce(F.col("error"), bad).alias("_cdc_error"),
        F.when(corrupt, F.array_compact(F.array(*widen)) if widen else F.array().cast("array<string>"))
        .alias("_cdc_widen"),
    )


def _stored_unchanged(unchanged: SparkColumn, renamed: dict[str, str]) -> SparkColumn:
    """An event's list of unchanged columns, each under its stored name (``renamed``: source -> stored)."""
    from pyspark.sql import functions as F

    if not renamed:
        return unchanged

    (first, first_stored), *rest = renamed.items()

    def one(name: SparkColumn) -> SparkColumn:
        result = F.when(name == F.lit(first), F.lit(first_stored))
        for source, target in rest:
            result = result.when(name == F.lit(source), F.lit(target))
        return result.otherwise(name)

    return F.transform(unchanged, one)


def _widened(frame: DataFrame) -> tuple[str, ...]:
    """The column names of ``frame``'s ``_cdc_widen`` lists (poison events holding multi-dimensional arrays)."""
    from pyspark.sql import functions as F

    rows = frame.filter(F.size("_cdc_widen") > 0).select(F.explode("_cdc_widen").alias("name")).distinct().collect()
    return tuple(sorted(row["name"] for row in rows))


def _struct_ddl(columns: list[tuple[str, str]]) -> str:
    return ", ".join(f"{quote(n)}: {t}" for n, t in columns)


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
    """Array columns that a poison event fills with a multi-dimensional array: typed as ``string``, they hold it."""

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
    ]


def facts_of(row: Any) -> BatchFacts:
    return BatchFacts(int(row["rows"]), int(row["poison"]), tuple(sorted(row["truncates"] or [])), int(row["other"]),
                      int(row["partial"]))


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
    )


def append(spark: SparkSession, path: str, frame: DataFrame, progress: Progress) -> None:
    """Append ``frame`` to the table at ``path`` (columns matched by name, missing ones NULL) in one commit."""
    from pyspark.sql import functions as F

    target = spark.read.format("delta").load(path).schema
    present = set(frame.columns)
    aligned = frame.select(
        *[F.col(quote(f.name)) if f.name in present else F.lit(None).cast(f.dataType).alias(f.name) for f in target.fields]
    )
    with_progress(aligned.write.format("delta").mode("append"), progress).save(path)


def dead_letter(spark: SparkSession, path: str, frame: DataFrame, target: str) -> None:
    """Record the poison events of ``frame`` in the dead-letter table at ``path`` (idempotent).

    The tables of a view share one dead-letter table and may be applied side by side in separate
    sessions, so its creation and MERGEs are serialized in this process (:data:`_DEAD_LETTER_WRITES`)."""
    with _DEAD_LETTER_WRITES:
        _dead_letter(spark, path, frame, target)


#: Held while a dead-letter table is written (poison events are rare; one lock for all of them).
_DEAD_LETTER_WRITES = threading.Lock()


def _dead_letter(spark: SparkSession, path: str, frame: DataFrame, target: str) -> None:
    from pyspark.sql import functions as F

    ensure_table(spark, path, DEAD_LETTER_DDL)
    poison = frame.filter(F.col("_cdc_error").isNotNull()).select(
        F.lit(target).alias("target"),
        F.col("_cdc_topic").alias("topic"),
        F.col("_cdc_partition").alias("partition"),
        F.col("_cdc_offset").alias("offset"),
        F.col(KEY).alias("key"),
        F.col("_cdc_raw").alias("value"),
        F.col("_cdc_error").alias("error"),
        F.col(LSN).alias("lsn"),
        F.current_timestamp().alias("recorded_at"),
    )
    with committing(spark, None):
        merge_into(
            spark, path, poison,
            "t.target = s.target AND t.topic = s.topic AND t.partition = s.partition AND t.offset = s.offset",
        ).when_not_matched_insert_all().execute()


_KNOWN_TYPES: dict[str, dict[str, str]] = {}


def table_types(spark: SparkSession, path: str) -> dict[str, str] | None:
    """Column name -> Spark type (DDL form) of the Delta table at ``path``; ``None`` when there is none."""
    known = _KNOWN_TYPES.get(path)
    if known is not None:
        return known
    if not is_delta_table(spark, path):
        return None
    types = {f.name: f.dataType.simpleString() for f in spark.read.format("delta").load(path).schema.fields}
    _KNOWN_TYPES[path] = types
    return types


def ensure_table(spark: SparkSession, path: str, ddl: str) -> None:
    """Create the Delta table at ``path`` with ``ddl``, or bring it to ``ddl``: columns it lacks are
    added, and a column whose type differs is converted to the :func:`~derived_views.column_types.supertype`
    of both (:func:`_retype`); a column is never narrowed."""
    from pyspark.sql.types import StructType

    wanted = StructType.fromDDL(ddl)
    wanted_types = {f.name: f.dataType.simpleString() for f in wanted.fields}
    existing = table_types(spark, path)
    if existing is not None and all(existing.get(n) == t for n, t in wanted_types.items()):
        return
    if existing is None:
        with committing(spark, None):
            create_if_missing(spark, path, ddl)
        _KNOWN_TYPES[path] = wanted_types
        return
    changed = {n: supertype(existing[n], t) for n, t in wanted_types.items() if n in existing and existing[n] != t}
    changed = {n: t for n, t in changed.items() if t != existing[n]}
    missing = [f for f in wanted.fields if f.name not in existing]
    forget_table(path)  # read again after a failure part way: a conversion must start from the table's types
    if changed:
        _retype(spark, path, existing, changed)
    if missing:
        added = ", ".join(f"{quote(f.name)} {f.dataType.simpleString()}" for f in missing)
        with committing(spark, None):
            spark.sql(f"ALTER TABLE {table_ref(path)} ADD COLUMNS ({added})")
    _KNOWN_TYPES[path] = {**existing, **changed, **{f.name: f.dataType.simpleString() for f in missing}}


def _retype(spark: SparkSession, path: str, existing: dict[str, str], changed: dict[str, str]) -> None:
    """Rewrite the table at ``path`` with the ``changed`` columns converted to their new (wider) types,
    in one Delta commit that carries no progress (the table stays as of the watermark it recorded).

    Readers see the old table until the commit; a sync killed before it converts again on its next run.
    The conversion is exact (:func:`~derived_views.column_types.convert`): integer, float and decimal
    widenings are casts, and a column that becomes ``string`` holds each value's JSON text.
    """
    from pyspark.sql import functions as F

    frame = spark.read.format("delta").load(path)
    converted = frame.select(*[
        convert(F.col(quote(name)), existing[name], changed[name]).alias(name) if name in changed else F.col(quote(name))
        for name in frame.columns
    ])
    with committing(spark, None):
        converted.write.format("delta").mode("overwrite").option("overwriteSchema", "true").save(path)


def rename_columns(spark: SparkSession, path: str, renames: dict[str, str]) -> None:
    """Rename columns of the table at ``path`` (``{old: new}``) in one commit that carries no progress,
    by rewriting it: a rename in place needs Delta's column mapping, which not every reader supports."""
    from pyspark.sql import functions as F

    frame = spark.read.format("delta").load(path)
    renamed = frame.select(*[F.col(quote(name)).alias(renames.get(name, name)) for name in frame.columns])
    with committing(spark, None):
        renamed.write.format("delta").mode("overwrite").option("overwriteSchema", "true").save(path)
    forget_table(path)


def forget_table(path: str) -> None:
    """Drop cached knowledge of ``path``'s columns (after a rebuild replaced its schema)."""
    _KNOWN_TYPES.pop(path, None)


def forget_tables() -> None:
    """Drop cached knowledge of every table's columns (another process may have changed them)."""
    _KNOWN_TYPES.clear()


def _newer(prefix_lsn: str = LSN, prefix_seq: str = SEQ) -> str:
    return f"(s.{LSN} > t.{prefix_lsn} OR (s.{LSN} = t.{prefix_lsn} AND s.{SEQ} > t.{prefix_seq}))"


def _overwrite(frame: DataFrame, path: str, progress: Progress) -> None:
    with_progress(frame.write.format("delta").mode("overwrite").option("overwriteSchema", "true"), progress).save(path)
    forget_table(path)


def merge_current(
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
) -> None:
    """Apply latest-per-key typed rows to the SCD1 table at ``path`` in one commit (see module docstring).

    ``inserts_only`` appends the rows when none of their keys (``keys`` when known, else collected from
    ``source``) is in the table (rule 7). ``whole_rows`` says no row of ``source`` lacks a column
    (``unchanged`` is empty everywhere): the update then takes every column from the source, so the
    MERGE reads only the target's key and position columns instead of whole rows.
    """
    from pyspark.sql import functions as F

    rows = source.filter(F.col("_cdc_error").isNull() & (F.col(OP) != "t"))
    names = [n for n, _ in columns]
    ddl = ", ".join(f"{quote(n)} {t}" for n, t in columns) + ", " + CURRENT_META_DDL
    if replace:
        kept = rows.filter(F.col(OP) != "d").select(*[quote(n) for n in names], KEY, LSN, SEQ, TS, OP)
        _overwrite(kept, path, progress)
        return
    ensure_table(spark, path, ddl)
    if inserts_only and not _meets_table(spark, path, rows, keys):
        append(spark, path, rows.select(*[quote(n) for n in names], KEY, LSN, SEQ, TS, OP), progress)
        return
    update = {
        quote(n): f"s.{quote(n)}" if whole_rows
        else f"CASE WHEN array_contains(s.{UNCHANGED}, {sql_string(n)}) THEN t.{quote(n)} ELSE s.{quote(n)} END"
        for n in names
    }
    meta = {c: f"s.{c}" for c in (KEY, LSN, SEQ, TS, OP)}
    insert = {**{quote(n): f"s.{quote(n)}" for n in names}, **meta}
    builder = (
        merge_into(spark, path, rows, f"t.{KEY} = s.{KEY}")
        .when_matched_delete(condition=f"{_newer()} AND s.{OP} = 'd'")
        .when_matched_update({**update, **meta}, condition=_newer())
        .when_not_matched_insert(insert, condition=f"s.{OP} <> 'd'")
    )
    if truncates:
        builder = builder.when_not_matched_by_source_delete(condition=f"t.{LSN} < {max(truncates)}")
    with committing(spark, progress):
        builder.execute()


def _close_at(truncates: tuple[int, ...], lsn: SparkColumn, next_lsn: SparkColumn) -> SparkColumn | None:
    """The first truncate after ``lsn`` and before ``next_lsn`` (a version's end by truncation)."""
    from pyspark.sql import functions as F

    result = None
    for truncate in truncates:
        hit = (lsn < F.lit(truncate)) & (next_lsn.isNull() | (next_lsn > F.lit(truncate)))
        result = F.when(hit, F.lit(truncate)) if result is None else result.when(hit, F.lit(truncate))
    return result


def merge_history(
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
) -> None:
    """Apply every typed event as a version row of the SCD2 table at ``path`` (see module docstring).

    ``whole_rows`` says no event of ``source`` lacks a column: nothing is then filled from the table's
    current versions (which are not read). ``inserts_only`` appends the versions instead of merging
    them when no key of the batch (``keys`` when known) is current in the table (rule 7).
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    names = [n for n, _ in columns]
    ddl = ", ".join(f"{quote(n)} {t}" for n, t in columns) + ", " + HISTORY_META_DDL
    events = source.filter(F.col("_cdc_error").isNull() & (F.col(OP) != "t") & F.col(KEY).isNotNull())
    if not replace:
        ensure_table(spark, path, ddl)
        if not whole_rows:
            events = _fill_from_current(spark, path, events, names)
    by_key = Window.partitionBy(KEY).orderBy(LSN, SEQ)
    nxt = events.select(
        "*",
        F.lead(LSN).over(by_key).alias("_next_lsn"),
        F.lead(SEQ).over(by_key).alias("_next_seq"),
        F.lead(TS).over(by_key).alias("_next_ts"),
        F.row_number().over(by_key).alias("_rank"),
    )
    is_delete = F.col(OP) == "d"
    truncated = _close_at(truncates, F.col(LSN), F.col("_next_lsn"))
    to_lsn = F.when(is_delete, F.col(LSN)).otherwise(F.col("_next_lsn"))
    to_seq = F.when(is_delete, F.col(SEQ)).otherwise(F.col("_next_seq"))
    to_ts = F.when(is_delete, F.col(TS)).otherwise(F.col("_next_ts"))
    if truncated is not None:
        to_lsn = F.when(~is_delete & truncated.isNotNull(), truncated).otherwise(to_lsn)
        to_seq = F.when(~is_delete & truncated.isNotNull(), F.lit(-1)).otherwise(to_seq)
        to_ts = F.when(~is_delete & truncated.isNotNull(), F.lit(None).cast("timestamp")).otherwise(to_ts)
    versions = nxt.select(
        *[quote(n) for n in names],
        KEY,
        F.col(LSN).alias("_cdc_valid_from_lsn"),
        F.col(SEQ).alias("_cdc_valid_from_seq"),
        F.col(TS).alias("_cdc_valid_from_ts"),
        to_lsn.cast("bigint").alias("_cdc_valid_to_lsn"),
        to_seq.cast("bigint").alias("_cdc_valid_to_seq"),
        to_ts.alias("_cdc_valid_to_ts"),
        (to_lsn.isNull() & ~is_delete).alias("_cdc_is_current"),
        OP,
        F.col("_rank"),
    )
    if replace:
        _overwrite(versions.drop("_rank"), path, progress)
        return
    if inserts_only and not _meets_table(spark, path, events, keys, current_only=True):
        append(spark, path, versions.drop("_rank"), progress)
        return
    first = versions.filter(F.col("_rank") == 1)
    first_truncate = _close_at(truncates, F.lit(-1), F.col("_cdc_valid_from_lsn"))
    close_lsn = F.col("_cdc_valid_from_lsn")
    close_seq = F.col("_cdc_valid_from_seq")
    close_ts = F.col("_cdc_valid_from_ts")
    if first_truncate is not None:
        close_lsn = F.coalesce(first_truncate, close_lsn)
        close_seq = F.when(first_truncate.isNotNull(), F.lit(-1)).otherwise(close_seq)
        close_ts = F.when(first_truncate.isNotNull(), F.lit(None).cast("timestamp")).otherwise(close_ts)
    close = first.select(
        F.col(KEY).alias("_merge_key"),
        *[F.lit(None).cast(t).alias(n) for n, t in columns],
        KEY,
        close_lsn.cast("bigint").alias("_close_lsn"),
        close_seq.cast("bigint").alias("_close_seq"),
        close_ts.alias("_close_ts"),
    )
    staged = versions.drop("_rank").select(F.lit(None).cast("string").alias("_merge_key"), "*")
    close_full = close.select(
        "_merge_key",
        *[quote(n) for n in names],
        KEY,
        F.col("_close_lsn").alias("_cdc_valid_from_lsn"),
        F.col("_close_seq").alias("_cdc_valid_from_seq"),
        F.col("_close_ts").alias("_cdc_valid_from_ts"),
        F.lit(None).cast("bigint").alias("_cdc_valid_to_lsn"),
        F.lit(None).cast("bigint").alias("_cdc_valid_to_seq"),
        F.lit(None).cast("timestamp").alias("_cdc_valid_to_ts"),
        F.lit(False).alias("_cdc_is_current"),
        F.lit("close").alias(OP),
    )
    merged = staged.unionByName(close_full)
    newer = (
        "(s._cdc_valid_from_lsn > t._cdc_valid_from_lsn OR "
        "(s._cdc_valid_from_lsn = t._cdc_valid_from_lsn AND s._cdc_valid_from_seq > t._cdc_valid_from_seq))"
    )
    insert = {quote(n): f"s.{quote(n)}" for n in names}
    insert.update(
        {
            c: f"s.{c}"
            for c in (
                KEY, "_cdc_valid_from_lsn", "_cdc_valid_from_seq", "_cdc_valid_from_ts", "_cdc_valid_to_lsn",
                "_cdc_valid_to_seq", "_cdc_valid_to_ts", "_cdc_is_current", OP,
            )
        }
    )
    builder = (
        merge_into(spark, path, merged, f"t.{KEY} = s._merge_key AND t._cdc_is_current")
        .when_matched_update(
            {
                "_cdc_valid_to_lsn": "s._cdc_valid_from_lsn",
                "_cdc_valid_to_seq": "s._cdc_valid_from_seq",
                "_cdc_valid_to_ts": "s._cdc_valid_from_ts",
                "_cdc_is_current": "false",
            },
            condition=newer,
        )
        .when_not_matched_insert(insert, condition="s._merge_key IS NULL")
    )
    if truncates:
        first_t = min(truncates)
        builder = builder.when_not_matched_by_source_update(
            {"_cdc_valid_to_lsn": str(first_t), "_cdc_valid_to_seq": "-1", "_cdc_is_current": "false"},
            condition=f"t._cdc_is_current AND t._cdc_valid_from_lsn < {first_t}",
        )
    with committing(spark, progress):
        builder.execute()


#: Most keys an insert-only batch may have for the append check (rule 7); a larger batch is merged.
APPEND_CHECK_KEYS = 20_000


def _meets_table(
    spark: SparkSession, path: str, rows: DataFrame, known: Sequence[str] | None = None, *, current_only: bool = False
) -> bool:
    """Whether any key of ``rows`` may be in the table at ``path`` (``current_only``: among its current
    versions), see rule 7. The keys (``known``, else collected from ``rows``: ``True`` beyond
    :data:`APPEND_CHECK_KEYS`, so the batch is merged) are looked up in the table's key column read in
    the driver (:func:`~derived_views.table_keys.holds_any`), or with an ``IN`` filter on it (one Spark
    job) when the table cannot be read that way."""
    from pyspark.sql import functions as F

    if known is not None:
        keys = list(known)
    else:
        keys = [row[0] for row in rows.select(KEY).limit(APPEND_CHECK_KEYS + 1).collect()]
    if len(keys) > APPEND_CHECK_KEYS:
        return True
    if not keys:
        return False
    held = holds_any(path, keys, current_only=current_only)
    if held is not None:
        return held
    table = spark.read.format("delta").load(path).filter(F.col(KEY).isin(keys))
    if current_only:
        table = table.filter(F.col("_cdc_is_current"))
    return bool(table.select(KEY).limit(1).count())


def _fill_from_current(spark: SparkSession, path: str, events: DataFrame, names: list[str]) -> DataFrame:
    """Take the columns a batch's first partial event lacks from the key's current version in ``path``."""
    from pyspark.sql import functions as F

    current = (
        spark.read.format("delta").load(path)
        .filter(F.col("_cdc_is_current"))
        .select(F.col(KEY).alias("_fill_key"), *[F.col(quote(n)).alias(f"_fill_{i}") for i, n in enumerate(names)])
    )
    partial_rows = events.filter(F.size(UNCHANGED) > 0)
    whole = events.filter(F.size(UNCHANGED) == 0)
    joined = partial_rows.join(current, partial_rows[KEY] == current["_fill_key"], "left")
    filled = joined.select(
        *[
            F.when(F.array_contains(F.col(UNCHANGED), n), F.col(f"_fill_{i}")).otherwise(F.col(quote(n))).alias(n)
            for i, n in enumerate(names)
        ],
        *[c for c in events.columns if c not in names],
    )
    return whole.unionByName(filled)

