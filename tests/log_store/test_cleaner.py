"""The compaction algorithm on its own (no files)."""

from __future__ import annotations

import random

import orjson
import pytest

from event_format import fold_after
from log_store.batch_decoding import decode_records
from log_store.batch_encoding import encode_records
from log_store.cleaner import Cleaner, OffsetMap, build_offset_map
from log_store.errors import FoldError
from log_store.record import Record
from log_store.record_batch import parse_header

DAY = 86_400_000


def _r(offset: int, key: str | None, value: bytes | None, headers: tuple = ()) -> Record:
    return Record("t", 0, offset, None if key is None else key.encode(), value, offset, headers)


def _row(**after: object) -> bytes:
    return orjson.dumps({"after": after, "op": "u"})


def _clean(
    records: list[Record], now: int = 10 * DAY, append_time: int = 10 * DAY, retention: int = DAY, fold=fold_after
) -> tuple[list[Record], Cleaner]:
    cleaner = Cleaner(build_offset_map(records), now_ms=now, delete_retention_ms=retention, fold=fold)
    raw = encode_records(0, records[-1].offset, records, append_time, attributes=0)
    out = cleaner.clean_batch(parse_header(raw, 0), raw, records)
    if out is None:
        return [], cleaner
    return decode_records(out, 0, parse_header(out, 0), "t", 0), cleaner


def test_latest_per_key_with_original_offsets() -> None:
    records = [_r(0, "a", b"1"), _r(1, "b", b"1"), _r(2, "a", b"2"), _r(3, None, b"x"), _r(4, "b", b"2"), _r(5, "c", b"1")]
    kept, cleaner = _clean(records)
    assert [(r.offset, r.key, r.value) for r in kept] == [(2, b"a", b"2"), (3, None, b"x"), (4, b"b", b"2"), (5, b"c", b"1")]
    assert (cleaner.stats.records_read, cleaner.stats.records_kept) == (6, 4)


def test_tombstones_kept_for_the_delete_retention_then_dropped() -> None:
    records = [_r(0, "a", b"1"), _r(1, "a", b'{"op":"d"}'), _r(2, "a", None), _r(3, "b", b"1")]
    young, _ = _clean(records, now=10 * DAY, append_time=10 * DAY - 5)
    assert [(r.offset, r.value) for r in young] == [(2, None), (3, b"1")]
    old, cleaner = _clean(records, now=10 * DAY, append_time=8 * DAY)
    assert [(r.offset, r.key) for r in old] == [(3, b"b")]
    assert cleaner.stats.tombstones_removed == 1


def test_unchanged_batch_is_returned_as_is() -> None:
    records = [_r(0, "a", b"1"), _r(1, "b", b"2")]
    raw = encode_records(0, 1, records, 0, attributes=0)
    cleaner = Cleaner(build_offset_map(records), now_ms=0, delete_retention_ms=DAY, fold=fold_after)
    assert cleaner.clean_batch(parse_header(raw, 0), raw, records) is raw


def test_partial_latest_is_folded_through_a_chain() -> None:
    unchanged_big = (("unchanged", b'["big"]'),)
    unchanged_both = (("unchanged", b'["big","note"]'), ("trace", b"x"))
    records = [
        _r(0, "a", _row(id=1, big="B0", note="n0", v=0)),
        _r(1, "a", _row(id=1, note="n1", v=1), unchanged_big),
        _r(2, "z", _row(id=9, big="Z", note="z", v=9)),
        _r(3, "a", _row(id=1, v=2), unchanged_both),
    ]
    kept, cleaner = _clean(records)
    by_key = {r.key: r for r in kept}
    assert orjson.loads(by_key[b"a"].value or b"")["after"] == {"id": 1, "big": "B0", "note": "n1", "v": 2}
    assert by_key[b"a"].offset == 3 and by_key[b"a"].headers == (("trace", b"x"),)
    assert cleaner.stats.folded == 1


def test_partial_without_a_previous_value_is_kept_as_written() -> None:
    header = (("unchanged", b'["big"]'),)
    records = [_r(0, "a", None), _r(1, "a", _row(id=1, v=1), header), _r(2, "b", _row(id=2), header)]
    kept, _ = _clean(records)
    assert [(r.offset, r.value, r.headers) for r in kept] == [(1, _row(id=1, v=1), header), (2, _row(id=2), header)]


def test_refused_fold_keeps_the_record() -> None:
    def refuse(previous: bytes, partial: bytes, unchanged: list[str]) -> bytes:
        raise FoldError("no")

    header = (("unchanged", b'["big"]'),)
    records = [_r(0, "a", _row(id=1, big="B")), _r(1, "a", _row(id=1), header)]
    kept, cleaner = _clean(records, fold=refuse)
    assert [(r.offset, r.headers) for r in kept] == [(1, header)]
    assert cleaner.stats.fold_failures == 1


def test_a_full_row_after_a_partial_ends_the_fold() -> None:
    header = (("unchanged", b'["big"]'),)
    records = [_r(0, "a", _row(id=1, big="B")), _r(1, "a", _row(id=1), header), _r(2, "a", _row(id=1, big="C"))]
    kept, _ = _clean(records)
    assert [(r.offset, r.value) for r in kept] == [(2, _row(id=1, big="C"))]


@pytest.mark.parametrize("seed", range(30))
def test_map_based_cleaning_equals_the_record_walk(seed: int) -> None:
    """Batches the C-level path takes (keyed, no folds) clean exactly as the record-by-record walk,
    statistics included; so do the offset maps built from records and from columns."""
    rng = random.Random(seed)
    records = [_r(i, f"k{rng.randint(0, 9)}", None if rng.random() < 0.2 else b"%d" % i) for i in range(rng.randint(1, 40))]
    offset_map = build_offset_map(records)
    by_columns = OffsetMap()
    by_columns.add_columns([r.offset for r in records], [r.key for r in records], [r.headers for r in records])
    assert by_columns.latest == offset_map.latest
    raw = encode_records(0, records[-1].offset, records, 5 * DAY, attributes=0)
    header = parse_header(raw, 0)
    for now in (5 * DAY, 10 * DAY):  # tombstones young, then expired
        fast = Cleaner(offset_map, now_ms=now, delete_retention_ms=DAY, fold=fold_after)
        walk = Cleaner(offset_map, now_ms=now, delete_retention_ms=DAY, fold=fold_after)
        out = fast.clean_batch(header, raw, records)
        expected = walk._clean_records(header, raw, records, now - 5 * DAY >= DAY)
        assert out == expected
        assert fast.stats == walk.stats
