"""The compiled row encoders write byte for byte what the dict + orjson path writes, for every type."""

from __future__ import annotations

import struct
from pathlib import Path

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdc.capture.errors import MissingValueError
from cdc.capture.events import EventBuilder, TxContext
from cdc.capture.key_changes import KeyChangeValues, LogRows
from cdc.capture.pgoutput import UNCHANGED
from cdc.capture.tables import TableShape
from log_store import LogStore, ProducerRecord

#: (name, type OID, sample text forms as the server writes them with TimeZone=UTC, DateStyle=ISO)
_COLUMNS: list[tuple[str, int, list[str | None]]] = [
    ("i8", 20, ["0", "-9223372036854775808", "9223372036854775807", None]),
    ("i2", 21, ["-32768", "7"]),
    ("o", 26, ["4294967295"]),
    ("n", 1700, ["19.90", "NaN", "-0.01", "12345678901234567890.0123456789", "Infinity"]),
    ("b", 16, ["t", "f"]),
    ("f8", 701, ["1.5", "1e+20", "1.5e-07", "NaN", "-Infinity", "-0"]),
    ("t", 25, ["plain", "", 'tab\there\nnew "quoted" back\\slash \x01 é ✓ 🎉', "\u2028"]),
    ("u", 2950, ["a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"]),
    ("j", 3802, ['{"a": [1, 2.50]}', '"s"']),
    ("ba", 17, ["\\xdeadbeef", "\\x"]),
    ("d", 1082, ["2026-11-21", "infinity", "0044-03-15 BC"]),
    ("ts", 1114, ["2026-11-21 13:45:00.5", "infinity", "0044-03-15 12:00:00 BC", "-infinity"]),
    (
        "tz",
        1184,
        [
            "2026-11-21 13:45:00.123456+00",
            "2026-11-21 13:45:00+05:30",
            "infinity",
            "0044-03-15 12:00:00+00 BC",
            "1999-12-31 23:59:59.999999+14",
            "2026-01-01 00:00:00+00",
        ],
    ),
    ("tt", 1266, ["13:45:00+02"]),
    ("ai", 1007, ["{1,2,NULL}", "{{1,2},{3,4}}", "[2:3]={7,8}", "{}"]),
    ("at", 1009, ['{"a b","c,d","e\\"f",NULL}']),
    ("iv", 1186, ["1 year 2 mons"]),
]


def _shape(keys: list[str]) -> TableShape:
    return TableShape.build(7, "public", "all", "cdc.public.all", [(n, oid, -1) for n, oid, _ in _COLUMNS], keys)


def _tuple(values: list[str | None]) -> bytes:
    out = struct.pack("!h", len(values))
    for value in values:
        if value is None:
            out += b"n"
        else:
            data = value.encode()
            out += b"t" + struct.pack("!i", len(data)) + data
    return out


def _reference(shape: TableShape, values: list[str | None], tx: TxContext, now_ms: int) -> tuple[bytes | None, bytes]:
    """What the dict + orjson path writes for an insert of ``values``."""
    after = {
        c.name: None if v is None else convert(v) for c, convert, v in zip(shape.columns, shape.converters, values, strict=True)
    }
    keys = sorted(c.name for c in shape.columns if c.key)
    key = orjson.dumps({k: after[k] for k in keys}, option=orjson.OPT_SORT_KEYS) if keys else None
    value = orjson.dumps(
        {
            "before": None,
            "after": after,
            "op": "c",
            "source": {
                "connector": "postgresql",
                "name": "cdc",
                "db": "db",
                "schema": "public",
                "table": "all",
                "lsn": tx.lsn,
                "txId": tx.xid,
                "ts_ms": tx.ts_ms,
                "snapshot": "false",
                "sequence": tx.sequence,
            },
            "ts_ms": now_ms,
        }
    )
    return key, value


def _check(values: list[str | None], keys: list[str]) -> None:
    shape = _shape(keys)
    builder = EventBuilder(prefix="cdc", database="db", partitions=3)
    tx = TxContext(100, 5, 1000)
    expected = _reference(shape, values, TxContext(100, 5, 1000, sequence=tx.sequence), 42)
    payload = b"I" + struct.pack("!I", 7) + b"N" + _tuple(values)
    record = builder.insert_payload(shape, payload, 6, tx, 42)
    assert record is not None
    assert (record.key, record.value) == expected
    (general,) = builder.insert(shape, tuple(values), tx)
    reference = orjson.loads(expected[1])
    assert orjson.loads(general.value or b"")["after"] == reference["after"] and general.key == expected[0]


@pytest.mark.parametrize("row", range(6))
def test_insert_fast_path_equals_the_dict_path(row: int) -> None:
    values = [samples[row % len(samples)] for _, _, samples in _COLUMNS]
    _check(values, ["i8", "t", "tz"])
    _check(values, [])


@settings(max_examples=200, deadline=None)
@given(st.text(), st.integers(-(2**63), 2**63 - 1), st.booleans())
def test_any_text_and_integer_encode_alike(text: str, number: int, flag: bool) -> None:
    values: list[str | None] = [samples[0] for _, _, samples in _COLUMNS]
    values[0] = str(number)
    values[4] = "t" if flag else "f"
    values[6] = text
    _check(values, ["t", "i8"])


@pytest.mark.parametrize("old_kind", ["O", "K"])
def test_delete_equals_the_dict_path(old_kind: str) -> None:
    """A delete's envelope (the full old row, or only its key columns) and its tombstone."""
    values = [samples[1 % len(samples)] for _, _, samples in _COLUMNS]
    shape = _shape(["i8", "t"])
    tx = TxContext(100, 5, 1000, sequence=3)
    delete, tombstone = EventBuilder(prefix="cdc", database="db", partitions=3).delete(shape, old_kind, tuple(values), tx)
    before = {
        c.name: None if v is None else convert(v) for c, convert, v in zip(shape.columns, shape.converters, values, strict=True)
    }
    if old_kind == "K":
        before = {c.name: before[c.name] for c in shape.columns if c.key}
    value = orjson.loads(delete.value or b"")
    expected = {
        "before": before,
        "after": None,
        "op": "d",
        "source": {
            "connector": "postgresql",
            "name": "cdc",
            "db": "db",
            "schema": "public",
            "table": "all",
            "lsn": 100,
            "txId": 5,
            "ts_ms": 1000,
            "snapshot": "false",
            "sequence": 3,
        },
        "ts_ms": value["ts_ms"],
    }
    assert delete.value == orjson.dumps(expected)
    assert delete.key == tombstone.key == orjson.dumps({"i8": before["i8"], "t": before["t"]}, option=orjson.OPT_SORT_KEYS)
    assert tombstone.value is None and tombstone.headers == (("lsn", b"100"), ("sequence", b"3"))


def test_update_without_key_change_names_unchanged_columns() -> None:
    shape = TableShape.build(1, "public", "t", "cdc.public.t", [("id", 20, -1), ("big", 25, -1)], ["id"])
    builder = EventBuilder(prefix="cdc", database="db", partitions=3)
    (record,) = builder.update(shape, None, None, ("1", UNCHANGED), TxContext(1, 2, 3))
    assert orjson.loads(record.value or b"")["after"] == {"id": 1} and record.headers == (("unchanged", b'["big"]'),)


def test_key_change_without_a_recoverable_row_fails_loudly(tmp_path: Path) -> None:
    shape = TableShape.build(1, "public", "t", "cdc.public.t", [("id", 20, -1), ("big", 25, -1)], ["id"])
    builder = EventBuilder(prefix="cdc", database="db", partitions=3)
    with pytest.raises(MissingValueError, match=r"changed the key \{\"id\":1\} and left big unchanged"):
        builder.update(shape, "K", ("1", None), ("2", UNCHANGED), TxContext(1, 2, 3))
    with LogStore.open(tmp_path / "log", writer=True) as log:
        log.ensure_topic(shape.topic, 3, compacted=True)
        # the log holds only a partial row of key 1: nothing to fold it onto
        partial = builder.update(shape, None, None, ("1", UNCHANGED), TxContext(1, 2, 3))
        log.append_group(partial, "0000000000000001")
        builder.previous_values = KeyChangeValues({(shape.topic, b'{"id":1}')}, LogRows(log))
        with pytest.raises(MissingValueError, match="cannot be rebuilt from the log"):
            builder.update(shape, "K", ("1", None), ("2", UNCHANGED), TxContext(1, 2, 3))
        # once a full row precedes it, the value is folded from the log
        full = builder.insert(shape, ("1", "large"), TxContext(0, 2, 3))
        log.append_group(full + partial, "0000000000000002")
        values = KeyChangeValues({(shape.topic, b'{"id":1}')}, LogRows(log))
        builder.previous_values = values
        records = list(values.watch(builder.update(shape, "K", ("1", None), ("2", UNCHANGED), TxContext(3, 2, 3))))
        assert [orjson.loads(r.value)["op"] if r.value else None for r in records] == ["d", None, "c"]
        assert orjson.loads(records[-1].value or b"")["after"] == {"id": 2, "big": "large"} and records[-1].headers == ()
        assert values.rows[(shape.topic, b'{"id":1}')] is None  # deleted by the key change
        assert isinstance(records[0], ProducerRecord)
