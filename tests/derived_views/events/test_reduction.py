"""Pure reductions of change events: decoding, latest per key, folding partial rows, truncates."""

from __future__ import annotations

import json

from derived_views.events.reduction import Event, decode, fold_all, latest_per_key


def ev(key: str | None, op: str, lsn: int, seq: int = 0, after: dict | None = None, unchanged: tuple[str, ...] = ()) -> Event:
    return Event("t", 0, lsn, key, op, lsn, seq, 0, after, None, unchanged)


def test_decode_reads_envelope_header_and_tombstone() -> None:
    value = json.dumps(
        {"before": None, "after": {"id": 1}, "op": "u", "source": {"lsn": 99, "sequence": 3, "ts_ms": 5}, "ts_ms": 6}
    )
    event = decode("t", 1, 7, '{"id":1}', value, '["description"]')
    assert event is not None
    assert (event.op, event.lsn, event.seq, event.commit_ts_ms, event.unchanged) == ("u", 99, 3, 5, ("description",))
    assert decode("t", 1, 8, '{"id":1}', None, None) is None


def test_decode_marks_unreadable_value_as_poison() -> None:
    event = decode("t", 0, 3, '{"id":1}', "{not json", None)
    assert event is not None and event.op == "?" and event.error and "unreadable" in event.error
    event = decode("t", 0, 4, '{"id":1}', json.dumps({"op": "x", "source": {"lsn": 1}}), None)
    assert event is not None and event.error is not None


def test_latest_per_key_keeps_newest_by_lsn_and_sequence() -> None:
    events = [ev("a", "c", 10, 0, {"v": 1}), ev("b", "c", 10, 1, {"v": 1}), ev("a", "u", 20, 0, {"v": 2}), ev("b", "d", 20, 1)]
    out = {e.key: e for e in latest_per_key(events)}
    assert out["a"].after == {"v": 2} and out["b"].op == "d"


def test_partial_row_folds_onto_previous_event_in_batch() -> None:
    events = [
        ev("a", "c", 10, 0, {"id": 1, "doc": "long", "n": 1}),
        ev("a", "u", 20, 0, {"id": 1, "n": 2}, ("doc",)),
        ev("a", "u", 30, 0, {"id": 1, "n": 3}, ("doc",)),
    ]
    (only,) = latest_per_key(events)
    assert only.after == {"id": 1, "doc": "long", "n": 3} and only.unchanged == ()
    history = fold_all(events)
    assert [e.after["doc"] for e in history if e.after] == ["long", "long", "long"]


def test_partial_row_without_base_keeps_unchanged_for_the_merge() -> None:
    (only,) = latest_per_key([ev("a", "u", 20, 0, {"id": 1, "n": 2}, ("doc",)), ev("a", "u", 30, 0, {"id": 1, "n": 3}, ("doc",))])
    assert only.unchanged == ("doc",) and "doc" not in (only.after or {})


def test_partial_row_after_delete_is_not_folded_onto_deleted_values() -> None:
    out = fold_all([ev("a", "c", 10, 0, {"doc": "x"}), ev("a", "d", 20), ev("a", "u", 30, 0, {"n": 1}, ("doc",))])
    assert out[-1].unchanged == ("doc",)


def test_truncate_drops_earlier_events_and_is_kept_as_marker() -> None:
    out = latest_per_key([ev("a", "c", 10), ev("t0", "t", 20), ev("b", "c", 30)])
    assert [(e.op, e.key) for e in out] == [("t", "t0"), ("c", "b")]


def test_keyless_events_are_all_kept_and_poison_passes_through() -> None:
    poison = Event("t", 0, 9, "x", "?", 0, 0, 0, error="bad")
    out = latest_per_key([ev(None, "c", 10), ev(None, "c", 20), poison])
    assert [e.op for e in out] == ["c", "c", "?"]


def _raw(rows: list[tuple[str | None, str | None, str | None]], deleted: dict[int, tuple[int, int]] | None = None) -> object:
    """Raw log rows ``(key, value, unchanged)`` of one partition as an Arrow table, offsets 0..;
    ``deleted`` gives the tombstones' positions by row index."""
    import pyarrow as pa

    n = len(rows)
    deleted = deleted or {}
    return pa.table(
        {
            "topic": pa.array(["t"] * n),
            "partition": pa.array([0] * n, pa.int32()),
            "offset": pa.array(range(n), pa.int64()),
            "key": pa.array([r[0] for r in rows], pa.string()),
            "value": pa.array([r[1] for r in rows], pa.string()),
            "timestamp_ms": pa.array([7] * n, pa.int64()),
            "unchanged": pa.array([r[2] for r in rows], pa.string()),
            "deleted_lsn": pa.array([deleted[i][0] if i in deleted else None for i in range(n)], pa.int64()),
            "deleted_seq": pa.array([deleted[i][1] if i in deleted else None for i in range(n)], pa.int64()),
        }
    )


def _env(op: str, lsn: int, seq: int, after: dict | None, before: dict | None = None) -> str:
    return json.dumps({"before": before, "after": after, "op": op, "source": {"lsn": lsn, "sequence": seq, "ts_ms": 7}})


def test_vectorised_reduction_equals_the_per_event_one() -> None:
    from derived_views.events.arrow_reduction import reduce_vectorised
    from derived_views.events.reduction import decode_all, reduce_events_python

    rows = [
        ('{"id":1}', _env("c", 10, 0, {"id": 1, "n": 1}), None),
        ('{"id":2}', _env("c", 10, 1, {"id": 2, "n": 1}), None),
        (None, _env("c", 11, 0, {"n": 5}), None),  # keyless: every event kept
        ('{"id":1}', _env("u", 20, 0, {"id": 1, "n": 2}), None),
        ('{"id":2}', _env("d", 20, 1, None, {"id": 2}), None),
        ('{"id":2}', None, None),  # tombstone
        ('{"id":3}', _env("u", 30, 5, {"id": 3, "n": 9}), None),
        ('{"id":3}', _env("u", 30, 4, {"id": 3, "n": 8}), None),  # older position later in the log
        (None, _env("c", 31, 0, {"n": 6}), None),
    ]
    table = _raw(rows)
    for mode in ("latest", "all"):
        fast = reduce_vectorised(table, mode)
        slow = reduce_events_python(list(decode_all(table.to_pydict())), mode)
        assert fast is not None
        assert fast.schema == slow.schema
        assert sorted(fast.to_pylist(), key=lambda r: r["offset"]) == sorted(slow.to_pylist(), key=lambda r: r["offset"])
    latest = {r["offset"]: r for r in reduce_vectorised(table, "latest").to_pylist()}
    assert sorted(latest) == [2, 3, 4, 6, 8] and latest[6]["seq"] == 5


def test_vectorised_reduction_leaves_folds_truncates_and_poison_to_the_per_event_path() -> None:
    from derived_views.events.arrow_reduction import reduce_table, reduce_vectorised

    partial = [
        ('{"id":1}', _env("c", 10, 0, {"id": 1, "doc": "long"}), None),
        ('{"id":1}', _env("u", 20, 0, {"id": 1}), '["doc"]'),
    ]
    assert reduce_vectorised(_raw(partial), "latest") is None
    folded = reduce_table(_raw(partial).to_batches(), "latest").to_pylist()
    assert len(folded) == 1 and json.loads(folded[0]["value"])["after"] == {"id": 1, "doc": "long"}
    assert folded[0]["unchanged"] == []
    truncate = [('{"id":1}', _env("c", 10, 0, {"id": 1}), None), ('{"__truncate__":1}', _env("t", 20, 0, None), None)]
    assert reduce_vectorised(_raw(truncate), "latest") is None
    poison = [('{"id":1}', "{not json", None), ('{"id":2}', _env("c", 10, 0, {"id": 2}), None)]
    assert reduce_vectorised(_raw(poison), "all") is None
    out = reduce_table(_raw(poison).to_batches(), "all").to_pylist()
    assert out[0]["op"] == "?" and out[0]["value"] == "{not json" and out[1]["op"] == "c"


def test_positioned_tombstone_is_a_delete_of_its_key() -> None:
    event = decode("t", 1, 8, '{"id":1}', None, None, 40, 2, 9)
    assert event is not None and (event.op, event.lsn, event.seq, event.commit_ts_ms) == ("d", 40, 2, 9)
    assert json.loads(event.raw or "")["op"] == "d"
    assert decode("t", 1, 8, None, None, None, 40, 2, 9) is None


def test_compacted_delete_survives_as_its_tombstone_in_both_reductions() -> None:
    """After compaction only the tombstone of a deleted key is left: both paths must delete the key."""
    from derived_views.events.arrow_reduction import reduce_vectorised
    from derived_views.events.reduction import decode_all, reduce_events_python

    rows = [
        ('{"id":2}', None, None),  # compacted: the delete is gone
        ('{"id":1}', _env("c", 10, 0, {"id": 1, "n": 1}), None),
        ('{"id":3}', _env("d", 30, 0, None, {"id": 3}), None),  # uncompacted: delete + its tombstone
        ('{"id":3}', None, None),
        ('{"id":4}', None, None),  # re-inserted after its delete
        ('{"id":4}', _env("c", 40, 0, {"id": 4, "n": 4}), None),
    ]
    table = _raw(rows, {0: (20, 1), 3: (30, 0), 4: (35, 0)})
    for mode in ("latest", "all"):
        fast = reduce_vectorised(table, mode)
        slow = reduce_events_python(list(decode_all(table.to_pydict())), mode)
        assert fast is not None
        assert fast.to_pylist() == sorted(slow.to_pylist(), key=lambda r: r["offset"])
    latest = {(r["key"], r["op"], r["lsn"], r["seq"]) for r in reduce_vectorised(table, "latest").to_pylist()}
    assert latest == {('{"id":2}', "d", 20, 1), ('{"id":1}', "c", 10, 0), ('{"id":3}', "d", 30, 0), ('{"id":4}', "c", 40, 0)}
    history = [(r["key"], r["op"]) for r in reduce_vectorised(table, "all").to_pylist()]
    assert history == [('{"id":2}', "d"), ('{"id":1}', "c"), ('{"id":3}', "d"), ('{"id":4}', "d"), ('{"id":4}', "c")]


def test_typed_reduction_types_after_and_before_in_the_same_parse() -> None:
    """Given the view's columns, the vectorised path types the envelopes it parses (``before`` only
    where there is no ``after``) and carries no text; the reduction itself is unchanged."""
    import datetime
    from decimal import Decimal

    from derived_views.events.arrow_reduction import reduce_table
    from derived_views.events.typed_rows import row_type

    row = row_type(
        [("id", "bigint"), ("price", "decimal(12,2)"), ("day", "date"), ("at", "timestamp"), ("tags", "array<string>")]
    )
    rows = [
        (
            '{"id":1}',
            _env(
                "c",
                10,
                0,
                {"id": 1, "price": "1.5", "day": "2026-02-28", "at": "2026-02-28T01:02:03.000004Z", "tags": ["a", None]},
            ),
            None,
        ),
        ('{"id":1}', _env("u", 20, 0, {"id": 1, "price": "2.00"}, {"id": 1, "price": "1.50"}), None),
        ('{"id":2}', _env("d", 21, 0, None, {"id": 2}), None),
    ]
    typed = reduce_table(_raw(rows).to_batches(), "all", row)
    untyped = reduce_table(_raw(rows).to_batches(), "all")
    assert typed.select(untyped.column_names).drop_columns(["value"]) == untyped.drop_columns(["value"])
    out = typed.to_pylist()
    assert [r["parsed"] for r in out] == [True, True, True] and all(r["value"] is None for r in out)
    assert out[0]["after"] == {
        "id": 1,
        "price": Decimal("1.50"),
        "day": datetime.date(2026, 2, 28),
        "at": datetime.datetime(2026, 2, 28, 1, 2, 3, 4, tzinfo=datetime.UTC),
        "tags": ["a", None],
    }
    assert out[1]["before"] is None and out[1]["after"]["price"] == Decimal("2.00")
    assert out[2]["after"] is None and out[2]["before"]["id"] == 2
    latest = reduce_table(_raw(rows).to_batches(), "latest", row).to_pylist()
    assert [(r["offset"], r["parsed"]) for r in latest] == [(1, True), (2, True)]


def test_a_value_arrow_cannot_type_leaves_the_partition_to_spark() -> None:
    """``NaN`` in a float column, ``infinity`` in a date column, a decimal with more digits than its
    scale, a multi-dimensional array: the partition's rows keep their text (``parsed`` false)."""
    from derived_views.events.arrow_reduction import reduce_table
    from derived_views.events.typed_rows import row_type

    row = row_type([("id", "bigint"), ("x", "double"), ("day", "date"), ("price", "decimal(12,2)"), ("tags", "array<int>")])
    good = ('{"id":1}', _env("c", 10, 0, {"id": 1, "x": 1.5}), None)
    for odd in ({"x": "NaN"}, {"day": "infinity"}, {"price": "1.005"}, {"tags": [[1], [2]]}):
        bad = ('{"id":2}', _env("c", 11, 0, {"id": 2, **odd}), None)
        out = reduce_table(_raw([good, bad]).to_batches(), "all", row).to_pylist()
        assert [(r["parsed"], r["after"]) for r in out] == [(False, None), (False, None)], odd
        assert json.loads(out[1]["value"])["after"] == {"id": 2, **odd}


def test_columns_arrow_cannot_parse_exactly_leave_the_table_to_spark() -> None:
    from derived_views.events.typed_rows import arrow_type, row_type

    assert row_type([("id", "bigint"), ("blob", "binary")]) is None  # the log carries base64
    assert row_type([("id", "bigint"), ("days", "array<date>")]) is None
    assert str(arrow_type("array<decimal(38,10)>")) == "list<item: decimal128(38, 10)>"
    assert str(arrow_type("timestamp")) == "timestamp[us, tz=UTC]" and str(arrow_type("timestamp_ntz")) == "timestamp[us]"
