"""A small batch typed wholly in the driver: the rows :func:`derived_views.events.spark_typing.typed` would give,
assembled from Arrow columns, without a Spark job.

When the reduction typed every event of a batch with Arrow (:mod:`derived_views.events.typed_rows`), Spark's
:func:`~derived_views.events.spark_typing.typed` has nothing left to parse: each data column is the ``after`` image's
field, else the ``before`` image's, and the metadata columns are the event's, renamed. Running that
projection as a Spark job only to collect its rows back as Arrow costs a job (and, in a fresh driver,
the compilation of a wide projection) per table and step; building the same rows here costs
milliseconds. The rows are those Spark gives for such events, column for column and type for type
(a test compares the two): no poison (a typed row never is one), no error, no list of columns to widen.

Any other batch goes to Spark as before (:func:`typed_in_driver` is ``None``): one with an event
Arrow did not type (its envelope text is kept for Spark to parse and, if need be, name as poison), or
one whose values come from its key alone (a compacted delete's tombstone, which Spark parses from the key).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from derived_views.events.column_names import quote, stored_names
from derived_views.events.metadata_columns import KEY, LSN, OP, SEQ, TS, TYPED_METADATA, UNCHANGED


def batch_ddl(columns: list[tuple[str, str]], renamed: dict[str, str]) -> str:
    """The Spark DDL of a typed batch of ``columns`` (source names, view types): its data columns under
    their stored names (``renamed``: source -> stored), then :data:`~derived_views.events.metadata_columns.TYPED_METADATA`."""
    return (
        ", ".join(f"{quote(renamed.get(name, name))} {spark_type}" for name, spark_type in columns)
        + (", " if columns else "")
        + ", ".join(f"{name} {spark_type}" for name, spark_type in TYPED_METADATA)
    )


def typed_in_driver(
    events: Any, columns: list[tuple[str, str]], table: str, stored_as: Mapping[str, str] | None = None
) -> tuple[Any, str] | None:
    """The typed rows of ``events`` (reduced rows carrying Arrow-typed ``after`` and ``before`` images of
    ``columns``) as an Arrow table, with its Spark DDL (:func:`batch_ddl`); ``None`` when an event needs
    Spark (see the module)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if "parsed" not in events.column_names or events.num_rows == 0:
        return None
    events = events.combine_chunks()
    parsed, after, before = (events.column(name).chunk(0) for name in ("parsed", "after", "before"))
    if not pc.all(pc.fill_null(parsed, False)).as_py() or events.column("error").null_count != events.num_rows:
        return None
    if pc.max(pc.list_value_length(events.column("unchanged"))).as_py():
        return None  # columns named unchanged: Spark names them as stored
    has_image = pc.or_(after.is_valid(), before.is_valid())
    if not pc.all(pc.or_(has_image, pc.is_null(events.column("key")))).as_py():
        return None  # values that only the key holds: Spark parses them from it
    renamed = (
        stored_names([name for name, _ in columns], table)
        if stored_as is None
        else {n: s for n, s in stored_as.items() if s != n}
    )
    from_after, from_before = after.flatten(), before.flatten()
    data = {
        renamed.get(name, name): pc.if_else(after.is_valid(), from_after[i], from_before[i])
        for i, (name, _) in enumerate(columns)
    }
    n = events.num_rows
    metadata = {
        KEY: events.column("key"),
        LSN: events.column("lsn"),
        SEQ: events.column("seq"),
        TS: pc.multiply(events.column("commit_ts_ms"), 1000).cast(pa.timestamp("us", tz="UTC")),
        OP: events.column("op"),
        UNCHANGED: events.column("unchanged"),
        "_cdc_topic": events.column("topic"),
        "_cdc_partition": events.column("partition"),
        "_cdc_offset": events.column("offset"),
        "_cdc_raw": pc.coalesce(events.column("value"), events.column("key")),
        "_cdc_error": pa.nulls(n, pa.string()),
        "_cdc_widen": pa.nulls(n, pa.list_(pa.string())),
    }
    return pa.table({**data, **{name: metadata[name] for name, _ in TYPED_METADATA}}), batch_ddl(columns, renamed)
