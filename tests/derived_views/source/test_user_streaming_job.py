"""A user's own Structured Streaming job on the ``cdclog`` source (``rows=events``), over a log captured
from PostgreSQL: stopped and restarted from its checkpoint across new changes, it sees every record once,
each source transaction within one micro-batch."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
import pytest

from tests.derived_views.pipeline import capture, execute, settings_for

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

pytestmark = [pytest.mark.spark, pytest.mark.pg, pytest.mark.slow]

TOPICS = ["cdc.public.categories", "cdc.public.products"]


def _start(spark: SparkSession, log_dir: Path, target: Path, checkpoint: Path) -> StreamingQuery:
    """The user's job: every change event appended to a Delta table with the micro-batch that carried it."""
    import derived_views

    derived_views.register(spark)

    def append(batch: DataFrame, batch_id: int) -> None:
        from pyspark.sql import functions as F

        batch.withColumn("batch_id", F.lit(batch_id)).write.format("delta").mode("append").save(str(target))

    return (
        spark.readStream.format("cdclog")
        .option("path", str(log_dir))
        .option("topics", ",".join(TOPICS))
        .option("rows", "events")
        .load()
        .writeStream.foreachBatch(append)
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="1 second")
        .start()
    )


def _written(target: Path) -> list[dict[str, Any]]:
    """The job's rows, read with ``deltalake`` (no Spark job competing with the stream's)."""
    from deltalake import DeltaTable

    if not (target / "_delta_log" / f"{0:020}.json").exists():  # no micro-batch written yet
        return []
    return list(DeltaTable(str(target)).to_pyarrow_table().to_pylist())


def _wait_for_watermark(query: StreamingQuery, log_dir: Path, target: Path) -> list[dict[str, Any]]:
    """The job's rows once they hold every record up to the log's latest watermark (polled; the query
    must stay alive)."""
    from derived_views.source.log_source import read_watermark

    watermark = read_watermark(str(log_dir), TOPICS)
    assert watermark is not None
    expected = {(t, int(p), o) for t, parts in watermark.offsets.items() for p, end in parts.items() for o in range(end)}
    deadline = time.monotonic() + 180
    while True:
        assert query.exception() is None, query.exception()
        written = _written(target)
        missing = expected - {(row["topic"], row["partition"], row["offset"]) for row in written}
        if not missing:
            return written
        assert time.monotonic() < deadline, f"the job did not read {len(missing)} records within 180 s"
        time.sleep(1)


def _check(written: list[dict[str, Any]], log_dir: Path, url: str) -> None:
    """No gap, no duplicate, whole transactions per micro-batch, and the keys the source holds."""
    from derived_views.source.log_source import read_watermark

    watermark = read_watermark(str(log_dir), TOPICS)
    assert watermark is not None
    expected = sorted((t, int(p), o) for t, parts in watermark.offsets.items() for p, end in parts.items() for o in range(end))
    got = sorted((row["topic"], row["partition"], row["offset"]) for row in written)
    assert expected and got == expected  # every record once (the embedded log has no gap before compaction)
    batches_of_transaction: dict[int, set[int]] = {}
    for row in written:
        assert row["error"] is None, row
        batches_of_transaction.setdefault(row["lsn"], set()).add(row["batch_id"])
    assert all(len(batches) == 1 for batches in batches_of_transaction.values()), batches_of_transaction
    latest: dict[int, dict[str, Any]] = {}
    for row in sorted(written, key=lambda r: (r["lsn"], r["sequence"])):
        if row["topic"] == "cdc.public.products":
            latest[int(row["key"].removeprefix('{"id":').removesuffix("}"))] = row
    with psycopg.connect(url) as conn:
        ids = sorted(r[0] for r in conn.execute("SELECT id FROM products"))
    assert sorted(key for key, row in latest.items() if row["op"] != "d") == ids


def test_a_users_streaming_job_restarted_from_its_checkpoint_sees_every_record_once(
    spark: SparkSession, reference_db: str, tmp_path: Path
) -> None:
    execute(
        reference_db,
        "INSERT INTO categories (name) VALUES ('Lighting'), ('Garden')",
        "INSERT INTO products (category_id, name, price) SELECT 1 + g % 2, 'P' || g, g FROM generate_series(1, 30) g",
    )
    data_dir = tmp_path / "data"
    settings = settings_for(reference_db, data_dir)
    log_dir, target, checkpoint = data_dir / "log", tmp_path / "events", tmp_path / "checkpoint"
    capture(settings)

    query = _start(spark, log_dir, target, checkpoint)
    try:
        _wait_for_watermark(query, log_dir, target)
        # changes captured while the job runs
        execute(
            reference_db,
            "UPDATE products SET price = price + 1 WHERE id <= 10",
            "DELETE FROM products WHERE id BETWEEN 11 AND 14",
        )
        capture(settings)
        _wait_for_watermark(query, log_dir, target)
    finally:
        query.stop()
    _check(_written(target), log_dir, reference_db)
    batches_before = {row["batch_id"] for row in _written(target)}

    # changes captured while it is stopped, then more while the restarted job runs
    execute(
        reference_db,
        "BEGIN",
        "UPDATE products SET name = 'renamed' WHERE id % 3 = 0",
        "INSERT INTO products (category_id, name, price) VALUES (2, 'new', 5)",
        "COMMIT",
    )
    capture(settings)
    query = _start(spark, log_dir, target, checkpoint)
    try:
        _wait_for_watermark(query, log_dir, target)
        execute(reference_db, "DELETE FROM products WHERE id = 1", "UPDATE categories SET name = 'Home' WHERE id = 2")
        capture(settings)
        written = _wait_for_watermark(query, log_dir, target)
    finally:
        query.stop()
    assert {row["batch_id"] for row in written} > batches_before  # the restart went on from the checkpoint
    _check(written, log_dir, reference_db)
