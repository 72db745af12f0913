"""The old key's row a key change needs, read back from the log for many keys in one backward pass."""

from __future__ import annotations

from pathlib import Path

import orjson

from cdc.capture.key_changes import LogRows, _Incomplete
from log_store import LogStore, ProducerRecord


def _value(op: str, after: dict[str, object] | None) -> bytes:
    return orjson.dumps({"before": None, "after": after, "op": op, "source": {"lsn": 1, "sequence": 0}})


def test_rows_of_many_keys_fold_partials_and_see_deletes(tmp_path: Path) -> None:
    topic = "cdc.public.t"
    with LogStore.open(tmp_path, writer=True) as log:
        log.ensure_topic(topic, 2)
        records = [
            ProducerRecord(topic, b'{"id":%d}' % i, _value("r", {"id": i, "doc": f"long {i}", "n": 0}), 1) for i in range(1, 2001)
        ]
        log.append_group(records, "%016X" % 7)
        log.append_group(
            [
                ProducerRecord(topic, b'{"id":1}', _value("u", {"id": 1, "n": 1}), 2, (("unchanged", b'["doc"]'),)),
                ProducerRecord(topic, b'{"id":2}', _value("d", None), 2),
                ProducerRecord(topic, b'{"id":2}', None, 2),
                ProducerRecord(topic, b'{"id":5000}', _value("c", {"id": 5000, "n": 1}), 2, (("unchanged", b'["doc"]'),)),
            ],
            "%016X" % 15,
        )
        wanted = {b'{"id":1}', b'{"id":2}', b'{"id":3}', b'{"id":1999}', b'{"id":4000}', b'{"id":5000}'}
        rows = LogRows(log).rows(topic, wanted)
    assert rows[b'{"id":1}'] == {"id": b"1", "doc": b'"long 1"', "n": b"1"}  # the partial folded onto the read
    assert rows[b'{"id":2}'] is None  # deleted last
    assert rows[b'{"id":3}'] == {"id": b"3", "doc": b'"long 3"', "n": b"0"}
    assert rows[b'{"id":1999}'] == {"id": b"1999", "doc": b'"long 1999"', "n": b"0"}
    assert rows[b'{"id":4000}'] is None  # never written
    assert isinstance(rows[b'{"id":5000}'], _Incomplete)  # a partial row with nothing to fold onto
