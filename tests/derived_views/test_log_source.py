"""The ``cdclog`` data source: partition planning, batch reads up to a watermark, streaming micro-batches."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from derived_views.log_source import plan_partitions, read_watermark
from tests.derived_views.log_builder import LogBuilder

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def test_one_input_partition_per_non_empty_topic_partition_range() -> None:
    planned = plan_partitions("/log", {"a": {"0": 5}}, {"a": {"0": 5, "1": 3}, "b": {"0": 2}})
    assert [(p.topic, p.partition, p.start, p.end) for p in planned] == [("a", 1, 0, 3), ("b", 0, 0, 2)]
    assert plan_partitions("/log", {"a": {"0": 5}}, {"a": {"0": 5}}) == []


def test_watermark_offsets_are_plain_dicts(log: LogBuilder) -> None:
    with log.transaction() as tx:
        tx.insert("public.categories", {"id": 1, "name": "Home"})
    watermark = read_watermark(str(log.root), ["cdc.public.categories"])
    assert watermark is not None and watermark.lsn == log.lsn
    assert sum(watermark.offsets["cdc.public.categories"].values()) == 1
    assert set(watermark.to_dict()) == {"position", "timestamp_ms", "offsets"}


@pytest.mark.spark
def test_batch_and_streaming_reads_stop_at_the_watermark(spark: SparkSession, log: LogBuilder, tmp_path: Path) -> None:
    from derived_views.log_source import register

    register(spark)
    with log.transaction() as tx:
        for i in range(1, 6):
            tx.insert("public.categories", {"id": i, "name": f"c{i}"})
    options = {"path": str(log.root), "topics": "cdc.public.categories"}
    batch = spark.read.format("cdclog").options(**options).load()
    assert batch.rdd.getNumPartitions() == 2
    assert sorted(r["offset"] for r in batch.collect() if r["partition"] == 0) == list(
        range(sum(1 for r in batch.collect() if r["partition"] == 0)))
    target, checkpoint = str(tmp_path / "stream"), str(tmp_path / "checkpoint")

    def drain() -> int:
        query = (spark.readStream.format("cdclog").options(**options).load().writeStream.format("delta")
                 .option("checkpointLocation", checkpoint).trigger(availableNow=True).start(target))
        query.awaitTermination()
        return spark.read.format("delta").load(target).count()

    assert drain() == 5
    with log.transaction() as tx:
        tx.update("public.categories", {"id": 1, "name": "renamed"})
    assert drain() == 6
    assert drain() == 6


def _pending_after(log: LogBuilder, before: object, mode: str) -> tuple[int, bool]:
    from derived_views.apply import Range, pending_table

    topic = log.topic("public.products")
    now = read_watermark(str(log.root), [topic])
    assert now is not None
    progress = Range(str(log.root), before).progress([topic]) if before is not None else None  # type: ignore[arg-type]
    pending = pending_table(Range(str(log.root), now), [topic], progress, mode)
    assert pending is not None
    events, complete = pending
    return events.num_rows, complete


@pytest.mark.parametrize("mode", ["latest", "all"])
def test_a_range_is_complete_only_when_no_record_was_dropped(log: LogBuilder, mode: str) -> None:
    """Insert-only batches skip the table key lookup only over a complete range (apply rule 7)."""
    from tests.derived_views.log_builder import product

    topic = log.topic("public.products")
    with log.transaction() as tx:
        for pid in (1, 2, 3):
            tx.insert("public.products", product(pid))
    first = read_watermark(str(log.root), [topic])
    assert _pending_after(log, None, mode) == (3, True)
    with log.transaction() as tx:
        tx.insert("public.products", product(4))
        tx.insert("public.products", product(5))
    assert _pending_after(log, first, mode) == (2, True)
    with log.transaction() as tx:
        tx.delete("public.products", {"id": 3})
    with log.transaction() as tx:
        tx.insert("public.products", product(3, "Back again"))
    rows, complete = _pending_after(log, first, mode)
    assert complete is False and rows >= 3  # the delete (and its tombstone) were reduced or kept, not dropped silently
    log.heartbeat()
    log.log.roll()
    log.log.compact()  # the delete and the first insert of key 3 are gone: offsets are missing
    rows, complete = _pending_after(log, first, mode)
    assert complete is False


def test_offsets_removed_by_compaction_make_an_insert_only_range_incomplete(log: LogBuilder) -> None:
    from tests.derived_views.log_builder import product

    topic = log.topic("public.products")
    with log.transaction() as tx:
        tx.insert("public.products", product(1))
    first = read_watermark(str(log.root), [topic])
    with log.transaction() as tx:
        tx.insert("public.products", product(2))
    with log.transaction() as tx:
        tx.delete("public.products", {"id": 2})
    with log.transaction() as tx:
        tx.insert("public.products", product(2, "Back again"))
    log.heartbeat()
    log.log.roll()
    log.log.compact()
    from derived_views.apply import Range, pending_table

    now = read_watermark(str(log.root), [topic])
    assert now is not None and first is not None
    pending = pending_table(Range(str(log.root), now), [topic], Range(str(log.root), first).progress([topic]), "latest")
    assert pending is not None
    events, complete = pending
    assert events.column("op").to_pylist() == ["c"]  # looks like a plain insert of a new key ...
    assert complete is False  # ... but compaction removed its delete
