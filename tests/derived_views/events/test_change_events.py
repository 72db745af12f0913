"""The ``cdclog`` source's ``rows=events`` form: each record's envelope parsed into columns (pure)."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pytest

from derived_views.events.change_events import EVENTS_DDL, change_events, events_schema
from derived_views.source.log_partitions import _raw_schema

UPDATE = {
    "before": None,
    "after": {"id": 7, "price": "19.90", "seen": "2026-11-21T12:45:00.123456Z", "tags": ["a"], "ratio": 0.1},
    "op": "u",
    "source": {"lsn": 23456789, "txId": 771, "ts_ms": 1763700000123, "snapshot": "false", "sequence": 2},
    "ts_ms": 1763700000456,
}


def _raw(*records: dict[str, Any]) -> pa.RecordBatch:
    base = {"topic": "cdc.public.products", "partition": 1, "key": '{"id":7}', "timestamp_ms": 5}
    base |= {"unchanged": None, "deleted_lsn": None, "deleted_seq": None}
    return pa.RecordBatch.from_pylist([{**base, "offset": i, **r} for i, r in enumerate(records)], schema=_raw_schema())


def test_an_envelope_becomes_columns_with_its_rows_as_json_text() -> None:
    row = change_events(_raw({"value": json.dumps(UPDATE), "unchanged": '["description"]'})).to_pylist()[0]
    assert row == {
        "topic": "cdc.public.products",
        "partition": 1,
        "offset": 0,
        "key": '{"id":7}',
        "op": "u",
        "lsn": 23456789,
        "sequence": 2,
        "tx_id": 771,
        "commit_ts_ms": 1763700000123,
        "snapshot": "false",
        "before": None,
        "after": '{"id":7,"price":"19.90","seen":"2026-11-21T12:45:00.123456Z","tags":["a"],"ratio":0.1}',
        "unchanged": ["description"],
        "tombstone": False,
        "error": None,
    }
    assert json.loads(row["after"]) == UPDATE["after"]


def test_a_tombstone_is_the_deletion_of_its_key_at_the_position_its_headers_hold() -> None:
    rows = change_events(
        _raw({"value": None, "deleted_lsn": 90, "deleted_seq": 3}, {"value": None, "offset": 1}),
    ).to_pylist()
    assert [(r["offset"], r["op"], r["lsn"], r["sequence"], r["tombstone"], r["key"]) for r in rows] == [
        (0, "d", 90, 3, True, '{"id":7}'),
        (1, "d", None, None, True, '{"id":7}'),
    ]


def test_an_unreadable_value_keeps_its_place_with_an_error() -> None:
    rows = change_events(
        _raw(
            {"value": "not json"},
            {"value": json.dumps({**UPDATE, "op": "x"})},
            {"value": json.dumps(UPDATE), "unchanged": '{"a": 1}'},
            {"value": json.dumps({"op": "c"})},
        )
    ).to_pylist()
    assert [r["offset"] for r in rows] == [0, 1, 2, 3]
    assert all(r["op"] is None and r["lsn"] is None and r["error"].startswith("unreadable change event") for r in rows)
    assert "unknown op 'x'" in rows[1]["error"] and "unchanged header" in rows[2]["error"]


def test_the_schema_matches_the_ddl_spark_is_given() -> None:
    assert [f"{f.name}" for f in events_schema()] == [part.split()[0] for part in EVENTS_DDL.split(", ")]
    assert change_events(_raw()).num_rows == 0


def test_option_rows_is_raw_or_events_and_events_are_never_reduced() -> None:
    from derived_views.source.log_source import _Options

    given = {"path": "/log", "topics": "cdc.public.products"}
    assert _Options(given).rows == "raw" and _Options({**given, "rows": "events"}).rows == "events"
    with pytest.raises(ValueError, match="'rows' is 'raw' or 'events', not 'parsed'"):
        _Options({**given, "rows": "parsed"})
    with pytest.raises(ValueError, match="leave out option 'reduce'"):
        _Options({**given, "rows": "events", "reduce": "latest"})
