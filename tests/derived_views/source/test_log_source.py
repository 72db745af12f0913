"""The ``cdclog`` data source: partition planning, batch reads up to a watermark, streaming micro-batches."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from derived_views.source.log_partitions import plan_partitions
from derived_views.source.log_source import read_watermark
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
    from derived_views.source.log_source import register

    register(spark)
    with log.transaction() as tx:
        for i in range(1, 6):
            tx.insert("public.categories", {"id": i, "name": f"c{i}"})
    options = {"path": str(log.root), "topics": "cdc.public.categories"}
    batch = spark.read.format("cdclog").options(**options).load()
    assert batch.rdd.getNumPartitions() == 2
    assert sorted(r["offset"] for r in batch.collect() if r["partition"] == 0) == list(
        range(sum(1 for r in batch.collect() if r["partition"] == 0))
    )
    target, checkpoint = str(tmp_path / "stream"), str(tmp_path / "checkpoint")

    def drain() -> int:
        query = (
            spark.readStream.format("cdclog")
            .options(**options)
            .load()
            .writeStream.format("delta")
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start(target)
        )
        query.awaitTermination()
        return spark.read.format("delta").load(target).count()

    assert drain() == 5
    with log.transaction() as tx:
        tx.update("public.categories", {"id": 1, "name": "renamed"})
    assert drain() == 6
    assert drain() == 6


def test_a_tombstone_position_header_that_is_no_64_bit_number_leaves_it_unpositioned() -> None:
    from derived_views.source.log_partitions import _header_int

    assert _header_int(b"123") == 123 and _header_int(b"-5") == -5
    assert _header_int(b"99999999999999999999") is None and _header_int(b"0x20") is None and _header_int(None) is None


@pytest.mark.spark
def test_a_session_registers_the_source_in_a_thread_a_sibling_session_used_last(spark: SparkSession) -> None:
    """Spark resolves a name to register through the calling thread's active session: a thread whose
    last call went through a session holding ``cdclog`` (``createDataFrame`` makes it the active one)
    still registers it in a new session, which then reads with it."""
    from concurrent.futures import ThreadPoolExecutor

    from derived_views.engine.spark_session import new_session
    from derived_views.source.log_source import register

    register(spark)
    sibling = new_session(spark)

    def in_a_thread() -> str:
        spark.createDataFrame([(1,)], "n int").collect()  # the thread's active session: the first one
        register(sibling)
        register(sibling)  # once per session
        return sibling.read.format("cdclog").options(path="/nowhere", topics="cdc.public.none").load().schema.simpleString()

    with ThreadPoolExecutor(max_workers=1) as thread:
        assert thread.submit(in_a_thread).result().startswith("struct<")
