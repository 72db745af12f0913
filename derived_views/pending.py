"""What one sync step reads for a table: its pending events, reduced per key and typed, with their facts.

A table's pending range is read and reduced per log partition (:mod:`derived_views.reduction`): in the
driver when it is small (:data:`DRIVER_READ_LIMIT`), else by the Spark tasks that read it through the
``cdclog`` source (read and reduce in one Python worker per log partition). Each envelope is parsed
once: into typed columns by Arrow in the reduction when it can (:mod:`derived_views.typed_rows`), else
by Spark (:func:`typed`). A small batch is typed in the driver, with no Spark job when Arrow typed every
event (:mod:`derived_views.driver_typed`), else by one Spark job whose rows come back to the driver as
Arrow; its :class:`BatchFacts` are computed there, and it is applied from those rows (a local relation);
a large one is checkpointed locally by one job that also observes its facts (:func:`typed_batch`).
Either way the source of a MERGE is deterministic.

The typed rows' metadata columns (:data:`KEY`, :data:`LSN`, :data:`SEQ`, :data:`TS`, :data:`OP`,
:data:`UNCHANGED`) are the ones the MERGEs of :mod:`derived_views.apply` read and write.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from dataclasses import replace as with_fields
from typing import TYPE_CHECKING, Any

from derived_views.column_names import stored_names
from derived_views.column_types import MISREAD_DATE, out_of_range
from derived_views.log_location import LogLocation
from derived_views.log_source import (
    LogWatermark,
    Offsets,
    offsets_json,
    plan_partitions,
    read_partition,
)
from derived_views.progress import Progress
from derived_views.reduction import EVENT_DDL, reduce_table
from derived_views.schema import quote

if TYPE_CHECKING:
    from pyspark.sql import Column as SparkColumn
    from pyspark.sql import DataFrame, SparkSession

KEY, LSN, SEQ, TS, OP, UNCHANGED = "_cdc_key", "_cdc_lsn", "_cdc_seq", "_cdc_commit_ts", "_cdc_op", "_cdc_unchanged"

#: The metadata columns of typed rows, after their data columns, in order, with their Spark types: the
#: one list :func:`typed` and :mod:`derived_views.driver_typed` both build their rows from.
TYPED_METADATA: tuple[tuple[str, str], ...] = (
    (KEY, "string"),
    (LSN, "bigint"),
    (SEQ, "bigint"),
    (TS, "timestamp"),
    (OP, "string"),
    (UNCHANGED, "array<string>"),
    ("_cdc_topic", "string"),
    ("_cdc_partition", "int"),
    ("_cdc_offset", "bigint"),
    ("_cdc_raw", "string"),
    ("_cdc_error", "string"),
    ("_cdc_widen", "array<string>"),
)

#: Most keys an insert-only batch may have for the append check (rule 7 of :mod:`derived_views.apply`);
#: a larger batch is merged.
APPEND_CHECK_KEYS = 20_000


@dataclass(frozen=True)
class LogAsOf:
    """The log as of a watermark: what one sync step reads, and the position every table moves to."""

    log: LogLocation
    watermark: LogWatermark

    def progress(self, topics: list[str], previous: Progress | None = None) -> Progress:
        """The progress a table consuming ``topics`` has once this range is applied (computed with the
        same definition as ``previous``)."""
        offsets = {t: dict(parts) for t, parts in (previous.offsets if previous else {}).items()}
        for topic in topics:
            offsets[topic] = dict(self.watermark.offsets.get(topic, {}))
        return Progress(offsets, self.watermark.position, self.watermark.timestamp_ms, previous.definition if previous else "")


def read_log(
    spark: SparkSession,
    location: LogLocation | str,
    topics: list[str],
    start: Offsets,
    end: Offsets,
    reduce: str | None = None,
    columns: list[tuple[str, str]] | None = None,
) -> DataFrame:
    """Log rows of ``topics`` in ``[start, end)`` read by Spark tasks, one task per log partition: raw
    (:data:`~derived_views.log_source.RAW_DDL`), or reduced per partition (``reduce`` = ``latest``/``all``,
    rows of :data:`EVENT_DDL`) by the tasks that read them (one per key split of each partition when
    Spark has more cores than partitions: :mod:`derived_views.key_splits`), typed by Arrow as ``columns`` in the
    same parse when given (:mod:`derived_views.typed_rows`). The embedded log is read through the ``cdclog``
    source, Kafka through Spark's Kafka source (:func:`derived_views.kafka_read.read_kafka`)."""
    import json

    from derived_views.log_source import register

    location = LogLocation.of(location)
    if location.kafka is not None:
        from derived_views.kafka_read import read_kafka

        return read_kafka(spark, location, topics, start, end, reduce, columns)
    register(spark)
    reader = (
        spark.read.format("cdclog")
        .option("path", location.path)
        .option("topics", ",".join(topics))
        .option("startingOffsets", offsets_json(start))
        .option("endingOffsets", offsets_json({t: end.get(t, {}) for t in topics}))
    )
    if reduce is not None:
        from derived_views.key_splits import task_slots

        reader = reader.option("reduce", reduce).option("parallelism", str(task_slots(spark)))
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


def pending_table(as_of: LogAsOf, topics: list[str], progress: Progress | None, mode: str, row: Any | None = None) -> Any | None:
    """The reduced events (an Arrow table of :data:`EVENT_DDL`, typed as ``row`` when given) of
    ``topics`` a table with ``progress`` has not applied, read in the driver; ``None`` when the range
    holds more than :data:`DRIVER_READ_LIMIT` offsets (then Spark tasks read it, see :func:`typed_batch`)."""
    import pyarrow as pa

    end = {t: as_of.watermark.offsets.get(t, {}) for t in topics}
    parts = plan_partitions(as_of.log, _start(progress, topics), end)
    if not read_in_driver(sum(part.end - part.start for part in parts)):
        return None
    if not parts:
        return reduce_table([], mode, row)
    with as_of.log.open() as log:  # one connection for every partition
        return pa.concat_tables([reduce_table(read_partition(part, log), mode, row) for part in parts])


def arrow_typed(columns: list[tuple[str, str]], plan: Plan | None) -> bool:
    """Whether events parsed with ``plan`` can be typed as ``columns`` by Arrow (:mod:`derived_views.typed_rows`):
    every event has the view's column types (one schema version), and Arrow parses each of them exactly."""
    from derived_views.typed_rows import row_type

    return (plan is None or (len(plan) == 1 and plan[0][1] == columns)) and row_type(columns) is not None


def typed_batch(
    spark: SparkSession,
    as_of: LogAsOf,
    topics: list[str],
    progress: Progress | None,
    mode: str,
    columns: list[tuple[str, str]],
    table: str,
    plan: Plan | None = None,
    *,
    stored_as: Mapping[str, str] | None = None,
) -> tuple[DataFrame, BatchFacts]:
    """The pending events typed (:func:`typed`), as a deterministic frame, with their :class:`BatchFacts`.

    A range small enough for the driver (:func:`pending_table`) is typed there when Arrow typed every
    event (:func:`~derived_views.driver_typed.typed_in_driver`), else parsed by Spark in one job whose
    rows come back as Arrow: the facts are then computed in the driver and the frame is a local
    relation built from those rows. A larger range is read and parsed by Spark tasks and checkpointed
    locally, its facts observed by the same job (:func:`checkpointed`).
    """
    from derived_views.typed_rows import row_type, typed_ddl

    typed_columns = columns if arrow_typed(columns, plan) else None
    events = pending_table(as_of, topics, progress, mode, row_type(typed_columns) if typed_columns else None)
    if events is None:
        frame, facts = checkpointed(typed_events(spark, as_of, topics, progress, mode, columns, table, plan, stored_as=stored_as))
        if facts.poison:
            facts = with_fields(facts, widen=_widened(frame))
        return frame, facts
    if typed_columns is not None:
        from derived_views.driver_typed import typed_in_driver

        assembled = typed_in_driver(events, typed_columns, table, stored_as)
        if assembled is not None:
            rows, ddl = assembled
            return spark.createDataFrame(rows, schema=ddl), arrow_facts(rows)
    ddl = EVENT_DDL if typed_columns is None else f"{EVENT_DDL}, {typed_ddl(typed_columns)}"
    parsed = typed(spark.createDataFrame(events, schema=ddl), columns, table, plan, stored_as=stored_as)
    rows = parsed.toArrow()
    return spark.createDataFrame(rows, schema=parsed.schema), arrow_facts(rows)


def typed_events(
    spark: SparkSession,
    as_of: LogAsOf,
    topics: list[str],
    progress: Progress | None,
    mode: str,
    columns: list[tuple[str, str]],
    table: str,
    plan: Plan | None = None,
    *,
    stored_as: Mapping[str, str] | None = None,
) -> DataFrame:
    """The pending events of ``topics`` read, reduced and typed by Spark tasks (:func:`typed`): each
    envelope parsed once, by Arrow in the task that reduces it when it can (:func:`arrow_typed`)."""
    typed_columns = columns if arrow_typed(columns, plan) else None
    raw = read_log(
        spark, as_of.log, topics, _start(progress, topics), as_of.watermark.offsets, reduce=mode, columns=typed_columns
    )
    return typed(raw, columns, table, plan, stored_as=stored_as)


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


def typed(
    events: DataFrame,
    columns: list[tuple[str, str]],
    table: str,
    plan: Plan | None = None,
    *,
    stored_as: Mapping[str, str] | None = None,
) -> DataFrame:
    """Typed rows: the data columns parsed from the event (after, else before, else key) plus metadata.

    Events typed by Arrow in the reduction (``parsed`` true, :mod:`derived_views.typed_rows`) bring
    their ``after`` and ``before`` rows; any other envelope (``value``) is parsed once by Spark into
    them, with the column types in force at the event's LSN (``plan``, default: ``columns`` throughout), then cast to
    ``columns`` (the view's types, which hold every version's values) under their stored names
    (``stored_as``, by default those of a new table: :mod:`derived_views.column_names`, as are the names
    ``_cdc_unchanged`` lists). ``_cdc_error`` is set on poison
    events: an unreadable envelope, or values that do not fit; it names each column, its type and the
    value that does not fit. ``_cdc_widen`` lists the columns of a poison event that a string column
    holds the value of (:data:`BatchFacts.widen`): a date, timestamp or decimal column (or an array of
    them) holding a value PostgreSQL has and its type cannot hold (:func:`~derived_views.column_types.out_of_range`), and an
    array column holding a multi-dimensional array.
    """
    from pyspark.sql import functions as F

    plan = plan or [((0, 0), columns)]
    parsed = _parsed(events, columns, plan)
    has_after = F.col("_cdc_env.after").isNotNull()
    has_before = F.col("_cdc_env.before").isNotNull()
    corrupt = (F.col("op") != "t") & (
        F.col("_cdc_env._cdc_corrupt").isNotNull() | F.col("_cdc_keyed._cdc_corrupt").isNotNull() | _misread_dates(columns)
    )
    bad, widen = _misfits(columns, plan, table, corrupt)
    renamed = (
        stored_names([name for name, _ in columns], table)
        if stored_as is None
        else {n: s for n, s in stored_as.items() if s != n}
    )
    metadata = {
        KEY: F.col("key"),
        LSN: F.col("lsn"),
        SEQ: F.col("seq"),
        TS: F.timestamp_millis(F.col("commit_ts_ms")),
        OP: F.col("op"),
        UNCHANGED: _stored_unchanged(F.col("unchanged"), renamed),
        "_cdc_topic": F.col("topic"),
        "_cdc_partition": F.col("partition"),
        "_cdc_offset": F.col("offset"),
        "_cdc_raw": F.coalesce(F.col("value"), F.col("key")),
        "_cdc_error": F.coalesce(F.col("error"), bad),
        "_cdc_widen": F.when(corrupt, F.array_compact(F.array(*widen)) if widen else F.array().cast("array<string>")),
    }
    return parsed.select(
        *[
            F.when(has_after, F.col("_cdc_env.after").getField(name))
            .when(has_before, F.col("_cdc_env.before").getField(name))
            .otherwise(F.col("_cdc_keyed").getField(name))
            .alias(renamed.get(name, name))
            for name, _ in columns
        ],
        *[metadata[name].alias(name) for name, _ in TYPED_METADATA],
    )


#: JSON parsing that keeps a row it cannot read, naming it in ``_cdc_corrupt``
_PERMISSIVE = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": "_cdc_corrupt"}


def _parsed(events: DataFrame, columns: list[tuple[str, str]], plan: Plan) -> DataFrame:
    """``events`` with ``_cdc_env`` (the envelope's ``after`` and ``before``, as parsed by Arrow or else
    by Spark with the types in force at each event's LSN, cast to ``columns``) and ``_cdc_keyed`` (the
    key's columns, for an event with neither)."""
    from pyspark.sql import functions as F

    view_envelope = f"struct<after: struct<{_struct_ddl(columns)}>, before: struct<{_struct_ddl(columns)}>, _cdc_corrupt: string>"
    view_key = f"struct<{_struct_ddl(columns)}, _cdc_corrupt: string>"

    def envelope(types: list[tuple[str, str]]) -> SparkColumn:
        parsed = F.from_json(
            F.col("value"),
            f"after struct<{_struct_ddl(types)}>, before struct<{_struct_ddl(types)}>, _cdc_corrupt string",
            _PERMISSIVE,
        )
        return parsed if types == columns else parsed.cast(view_envelope)

    def keyed(types: list[tuple[str, str]]) -> SparkColumn:
        parsed = F.from_json(F.col("key"), ", ".join(f"{quote(n)} {t}" for n, t in types) + ", _cdc_corrupt string", _PERMISSIVE)
        return parsed if types == columns else parsed.cast(view_key)

    env = _by_version(plan, envelope)
    if "parsed" in events.columns:  # typed by Arrow where it could (see derived_views.typed_rows)
        env = F.when(
            F.col("parsed"),
            F.struct(
                F.col("after").alias("after"), F.col("before").alias("before"), F.lit(None).cast("string").alias("_cdc_corrupt")
            ),
        ).otherwise(env)
    # the two JSON parses (not compiled by Spark) get projections of their own, so that the one
    # picking the columns, which refers to them many times, is compiled
    has_after = F.col("_cdc_env.after").isNotNull()
    has_before = F.col("_cdc_env.before").isNotNull()
    return events.select("*", env.alias("_cdc_env")).select(
        "*", F.when(~has_after & ~has_before & F.col("key").isNotNull(), _by_version(plan, keyed)).alias("_cdc_keyed")
    )


def _column_text(name: str) -> SparkColumn:
    """The JSON text of column ``name`` in an event: its ``after``, else its ``before``, else (a
    tombstone) its key."""
    from pyspark.sql import functions as F

    return F.coalesce(
        F.get_json_object(F.col("value"), _json_path("after", name)),
        F.get_json_object(F.col("value"), _json_path("before", name)),
        F.when(F.col("value").isNull(), F.get_json_object(F.col("key"), _json_path(name))),
    )


#: View types whose values Spark's JSON reader may read as another date (see :func:`_misread_dates`).
_DATES = ("date", "array<date>")


def _misread_dates(columns: list[tuple[str, str]]) -> SparkColumn:
    """Whether an event holds a date that Spark's JSON reader takes without failing, as another value
    (:data:`~derived_views.column_types.MISREAD_DATE`). Such a date is a misfit like ``infinity``: its
    column becomes text."""
    from pyspark.sql import functions as F

    checks = [F.coalesce(_column_text(name).rlike(MISREAD_DATE), F.lit(False)) for name, view in columns if view in _DATES]
    result = F.lit(False)
    for check in checks:
        result = result | check
    return result


def _misfits(
    columns: list[tuple[str, str]], plan: Plan, table: str, corrupt: SparkColumn
) -> tuple[SparkColumn, list[SparkColumn]]:
    """The error of a poison event (``corrupt``): each column whose value (in ``after``, ``before``, or
    for a tombstone the key) does not fit its type, with the value; and the names of the columns a
    string column would hold the value of (see :func:`typed`)."""
    from pyspark.sql import functions as F

    misfits = []
    widen = []
    for index, (name, view_type) in enumerate(columns):

        def single(types: list[tuple[str, str]], index: int = index) -> SparkColumn:
            one = _struct_ddl([types[index]])
            return (
                F.from_json(F.col("value"), f"after struct<{one}>, before struct<{one}>, _cdc_corrupt string", _PERMISSIVE)
                .getField("_cdc_corrupt")
                .isNotNull()
            )

        def single_key(types: list[tuple[str, str]], index: int = index) -> SparkColumn:
            name, spark_type = types[index]
            parsed = F.from_json(F.col("key"), f"{quote(name)} {spark_type}, _cdc_corrupt string", _PERMISSIVE)
            return F.get_json_object(F.col("key"), _json_path(name)).isNotNull() & parsed.getField("_cdc_corrupt").isNotNull()

        text = _column_text(name)
        bad = F.when(F.col("value").isNotNull(), _by_version(plan, single)).otherwise(
            F.col("key").isNotNull() & _by_version(plan, single_key)
        )
        if view_type in _DATES:
            bad = bad | F.coalesce(text.rlike(MISREAD_DATE), F.lit(False))
        misfits.append(
            F.when(
                bad,
                F.concat(
                    F.lit(f"column {quote(name)} ({view_type}) cannot hold "),
                    F.coalesce(F.substring(text, 1, 200), F.lit("its value")),
                ),
            )
        )
        pattern = out_of_range(view_type)
        if pattern is not None:
            widen.append(F.when(bad & text.rlike(pattern), F.lit(name)))
        elif view_type.startswith("array<") and not view_type.startswith("array<array<"):
            widen.append(F.when(bad & text.startswith("[["), F.lit(name)))
    detail = F.concat_ws("; ", *misfits) if misfits else F.lit("")
    ddl = ", ".join(f"{quote(n)} {t}" for n, t in columns)
    error = F.when(
        corrupt,
        F.concat(
            F.lit(f"values do not fit the columns of {table}: "),
            F.when(detail != "", detail).otherwise(F.lit(f"the key or the envelope does not fit ({ddl})")),
        ),
    )
    return error, widen


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
    """The column names of ``frame``'s ``_cdc_widen`` lists (poison events whose values a string column holds)."""
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
    """Columns that a poison event fills with a value their type cannot hold (infinity in a date, NaN in a
    decimal, a multi-dimensional array...): typed as ``string``, they hold it."""

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
    return BatchFacts(
        int(row["rows"]), int(row["poison"]), tuple(sorted(row["truncates"] or [])), int(row["other"]), int(row["partial"])
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
    )
