"""Key splits: a log partition reduced by several tasks yields exactly the rows of one task reading it whole."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from derived_views.source.key_splits import MAX_SPLITS, splits_per_partition
from derived_views.source.log_partitions import LogPartition, plan_partitions, reduced_partition
from derived_views.source.log_source import read_watermark
from tests.derived_views.log_builder import LogBuilder, product

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

TOPIC = "cdc.public.products"


@pytest.mark.parametrize(
    ("partitions", "slots", "splits"),
    [(1, 2, 2), (3, 2, 1), (2, 2, 1), (3, 4, 2), (3, 8, 3), (2, 8, MAX_SPLITS), (1, 1, 1), (0, 2, 1)],
)
def test_partitions_are_split_only_when_they_would_leave_task_slots_idle(partitions: int, slots: int, splits: int) -> None:
    assert splits_per_partition(partitions, slots) == splits


@pytest.fixture(params=["vectorised", "per-event"])
def busy_log(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[LogBuilder, str]:
    """One partition of inserts, updates and deletes with their tombstones, written again after them;
    ``per-event`` adds what the vectorised reduction leaves to the per-event one: a partial row and a
    truncate marker in the middle (a record of no one key, which every split must see)."""
    log = LogBuilder(tmp_path / "log", partitions=1)
    with log.transaction() as tx:
        for pid in range(1, 41):
            tx.insert("public.products", product(pid, f"p{pid}"))
    with log.transaction() as tx:
        for pid in range(1, 41, 3):
            tx.update("public.products", product(pid, f"u{pid}"))
        for pid in range(5, 41, 7):
            tx.delete("public.products", {"id": pid})
        if request.param == "per-event":
            tx.update("public.products", product(2, "partial"), unchanged=("description",))
            tx.truncate("public.products")
    with log.transaction() as tx:
        for pid in range(30, 61):
            tx.insert("public.products", product(pid, f"again{pid}"))
        tx.delete("public.products", {"id": 33})
    log.close()
    return log, request.param


def _reduced(partition: LogPartition, mode: str, row: Any | None) -> list[dict[str, Any]]:
    return [r for batch in reduced_partition(partition, mode, row) for r in batch.to_pylist()]


@pytest.mark.parametrize("mode", ["latest", "all"])
@pytest.mark.parametrize("typed", [False, True])
def test_the_splits_of_a_partition_yield_its_reduction_once(busy_log: tuple[LogBuilder, str], mode: str, typed: bool) -> None:
    from derived_views.events.typed_rows import row_type

    log, kind = busy_log
    row = row_type([("id", "bigint"), ("name", "string"), ("description", "string")]) if typed else None
    watermark = read_watermark(str(log.root), [TOPIC])
    assert watermark is not None
    (whole,) = plan_partitions(str(log.root), {}, watermark.offsets)
    expected = sorted(_reduced(whole, mode, row), key=lambda r: r["offset"])
    shared = [r["op"] for r in expected if r["key"] is None or r["op"] == "t"]
    assert shared == (["t"] if kind == "per-event" else [])
    assert any(r.get("parsed") for r in expected) == (typed and kind == "vectorised")
    for splits in (2, 3):
        parts = plan_partitions(str(log.root), {}, watermark.offsets, splits)
        assert [(p.split, p.splits) for p in parts] == [(s, splits) for s in range(splits)]
        yielded = [_reduced(part, mode, row) for part in parts]
        assert all(any(r["key"] and r["op"] != "t" for r in rows) for rows in yielded), "a split yielded no key"
        assert sorted((r for rows in yielded for r in rows), key=lambda r: r["offset"]) == expected


@pytest.mark.spark
def test_a_reduced_read_of_one_partition_on_two_cores_runs_two_tasks(spark: SparkSession, tmp_path: Path) -> None:
    from derived_views.source.key_splits import task_slots
    from derived_views.source.pending import read_log

    log = LogBuilder(tmp_path / "log", partitions=1)
    with log.transaction() as tx:
        for pid in range(1, 31):
            tx.insert("public.products", product(pid))
    with log.transaction() as tx:
        for pid in range(1, 31, 2):
            tx.update("public.products", product(pid, "changed"))
    log.close()
    watermark = read_watermark(str(log.root), [TOPIC])
    assert watermark is not None and task_slots(spark) == 2
    assert read_log(spark, str(log.root), [TOPIC], {}, watermark.offsets).rdd.getNumPartitions() == 1
    reduced = read_log(spark, str(log.root), [TOPIC], {}, watermark.offsets, reduce="latest")
    assert reduced.rdd.getNumPartitions() == 2
    rows = sorted((r["key"], r["op"]) for r in reduced.select("key", "op").collect())
    assert len(rows) == 30 and len({key for key, _ in rows}) == 30
    assert sum(op == "u" for _, op in rows) == 15


def test_a_keyless_record_is_read_by_every_split_and_yielded_by_the_first() -> None:
    import pyarrow as pa

    from derived_views.source.key_splits import records_of_split, yielded_by_split

    keys = [None, '{"__truncate__":0}', *(f'{{"id":{i}}}' for i in range(50))]
    rows = pa.table({"key": pa.array(keys, pa.string()), "offset": pa.array(range(len(keys)), pa.int64())})
    read = [records_of_split(rows, split, 3) for split in range(3)]
    assert all(r.column("key").to_pylist()[:2] == keys[:2] for r in read)
    assert sorted(o for r in read for o in r.column("offset").to_pylist()[2:]) == list(range(2, len(keys)))
    assert [yielded_by_split(r, split).num_rows for split, r in enumerate(read)] == [
        read[0].num_rows,
        read[1].num_rows - 2,
        read[2].num_rows - 2,
    ]
