"""cdc.capture.events: the events capture builds from changes and snapshot rows."""

from __future__ import annotations

import orjson

from cdc.capture.events import EventBuilder, TxContext
from cdc.capture.pgoutput import UNCHANGED
from tests.cdc.wire import sample_shape


def test_unchanged_toast_column_is_omitted_and_named() -> None:
    builder = EventBuilder(prefix="cdc", database="db", partitions=3)
    tx = TxContext(100, 5, 1000)
    (record,) = builder.update(sample_shape(), None, None, ("1", UNCHANGED, "2"), tx)
    value = orjson.loads(record.value or b"")
    assert value["after"] == {"id": 1, "n": 2} and "big" not in value["after"]
    assert record.headers == (("unchanged", b'["big"]'),)
    assert record.key == b'{"id":1}'
    (filled,) = builder.update(sample_shape(), "O", ("1", "large", "1"), ("1", UNCHANGED, "2"), tx)
    assert orjson.loads(filled.value or b"")["after"]["big"] == "large" and filled.headers == ()
    assert value["source"]["sequence"] == 0 and orjson.loads(filled.value or b"")["source"]["sequence"] == 1


def test_delete_tombstone_truncate_and_key_change() -> None:
    builder = EventBuilder(prefix="cdc", database="db", partitions=3)
    tx = TxContext(100, 5, 1000)
    delete, tombstone = builder.delete(sample_shape(), "K", ("1", None, None), tx)
    assert orjson.loads(delete.value or b"")["before"] == {"id": 1} and tombstone.value is None
    assert tombstone.key == delete.key == b'{"id":1}'
    source = orjson.loads(delete.value or b"")["source"]
    assert tombstone.headers == (("lsn", b"%d" % source["lsn"]), ("sequence", b"%d" % source["sequence"]))
    records = builder.update(sample_shape(), "K", ("1", None, None), ("2", "x", "3"), tx)
    assert [orjson.loads(r.value)["op"] if r.value else None for r in records] == ["d", None, "c"]
    truncates = builder.truncate(sample_shape(), tx)
    assert len(truncates) == 3 and all(orjson.loads(r.value or b"")["op"] == "t" for r in truncates)
    from log_store import partition_for_key

    placed = sorted(getattr(r, "partition", None) if r.key is None else partition_for_key(r.key, 3) for r in truncates)
    assert placed == [0, 1, 2]


def test_snapshot_reads_in_partition_order_keep_each_rows_sequence() -> None:
    import pyarrow as pa

    from cdc.capture.arrow_fragments import literal
    from log_store import partition_for_key

    keys = [b'{"id":%d}' % i for i in range(40)]
    after = [literal(b'{"id":'), pa.array([b"%d" % i for i in range(40)], pa.large_binary()), literal(b"}")]
    tx = TxContext(100, 5, 1000, snapshot="true", sequence=7)
    builder = EventBuilder(prefix="cdc", database="db", partitions=3)
    block = builder.read_encoder(sample_shape(), tx)(10, 40, pa.array(keys, pa.large_binary()), after)
    got = [(key, orjson.loads(value)) for key, value in zip(block.keys.to_pylist(), block.values.to_pylist())]
    placed = [partition_for_key(key, 3) for key, _ in got]
    assert placed == sorted(placed) and len(set(placed)) == 3  # grouped by partition, in that order
    # row i keeps the sequence it has when the rows are encoded in read order: 7 + 10 (rows before) + i
    assert sorted((value["after"]["id"], value["source"]["sequence"]) for _, value in got) == [(i, 17 + i) for i in range(40)]
    assert all(key == b'{"id":%d}' % value["after"]["id"] for key, value in got)
    for partition in range(3):  # and read order within each partition
        ids = [value["after"]["id"] for (_, value), p in zip(got, placed) if p == partition]
        assert ids == sorted(ids)
    assert tx.sequence == 7, "the caller advances the transaction's sequence"
