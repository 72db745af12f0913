"""Record batches: encoding round trips and the CRC that covers every byte."""

from __future__ import annotations

import pytest

from log_store.record import ProducerRecord, Record
from log_store.record_batch import (
    HEADER_SIZE,
    PIECE_RECORDS,
    BatchHeader,
    Columns,
    crc_matches,
    decode_records,
    encode_records,
    header_problem,
    parse_header,
)


def _records() -> list[ProducerRecord]:
    return [
        ProducerRecord("t", b"k1", b"v1", 10),
        ProducerRecord("t", None, b"keyless", 11),
        ProducerRecord("t", b"k2", None, 12),  # tombstone
        ProducerRecord("t", b"", b"", 13, (("unchanged", b'["a"]'), ("h\u00e9", b"\x00\xff"))),
    ]


def test_round_trip_keeps_nulls_empties_and_headers() -> None:
    batch = Columns(_records()).encode(100, 0, 4, append_time_ms=5)
    header = parse_header(batch, 0)
    assert header_problem(header) is None
    assert (header.base_offset, header.record_count, header.last_offset_delta) == (100, 4, 3)
    assert (header.append_time_ms, header.max_timestamp_ms, header.length) == (5, 13, len(batch))
    assert crc_matches(batch, 0, header)
    records = decode_records(batch, 0, header, "t", 2)
    assert [(r.offset, r.key, r.value, r.timestamp_ms, r.headers) for r in records] == [
        (100, b"k1", b"v1", 10, ()),
        (101, None, b"keyless", 11, ()),
        (102, b"k2", None, 12, ()),
        (103, b"", b"", 13, (("unchanged", b'["a"]'), ("h\u00e9", b"\x00\xff"))),
    ]
    assert {r.partition for r in records} == {2}


def test_decode_filters_offset_range() -> None:
    batch = Columns(_records()).encode(100, 0, 4, append_time_ms=5)
    header = parse_header(batch, 0)
    assert [r.offset for r in decode_records(batch, 0, header, "t", 0, 101, 103)] == [101, 102]


def test_encode_slice_of_columns() -> None:
    batch = Columns(_records()).encode(7, 1, 3, append_time_ms=0)
    header = parse_header(batch, 0)
    assert [(r.offset, r.value) for r in decode_records(batch, 0, header, "t", 0)] == [
        (7, b"keyless"), (8, None)]


def test_compacted_batch_keeps_offsets_and_span() -> None:
    kept = [Record("t", 0, 52, b"k", b"v", 1, ()), Record("t", 0, 57, b"j", None, 2, ())]
    batch = encode_records(50, 9, kept, append_time_ms=3)
    header = parse_header(batch, 0)
    assert (header.record_count, header.last_offset_delta, header.next_offset) == (2, 9, 60)
    assert header_problem(header) is None
    assert [r.offset for r in decode_records(batch, 0, header, "t", 0)] == [52, 57]


def test_every_flipped_byte_is_detected() -> None:
    batch = Columns(_records()).encode(100, 0, 4, append_time_ms=5)
    for position in range(len(batch)):
        damaged = bytearray(batch)
        damaged[position] ^= 0x01
        header = BatchHeader._make(parse_header(bytes(damaged), 0))
        fits = header.length == len(batch)
        assert not (fits and crc_matches(bytes(damaged), 0, header)), position


@pytest.mark.parametrize(("field", "value", "problem"), [
    ("magic", 9, "magic"), ("length", 10, "shorter"), ("record_count", 9, "cannot fit")])
def test_header_problems(field: str, value: int, problem: str) -> None:
    header = parse_header(Columns(_records()).encode(0, 0, 4, 0), 0)._replace(**{field: value})
    assert problem in (header_problem(header) or "")
    assert HEADER_SIZE == 42


def test_batch_in_several_pieces_has_one_crc_over_all() -> None:
    records = _records() * (PIECE_RECORDS // 2 + 3)  # more than two pieces, nulls and headers included
    columns = Columns(records)
    pieces, length = columns.encode_pieces(0, 0, len(records), 7)
    assert len(pieces) == 1 + -(-len(records) // PIECE_RECORDS)
    batch = b"".join(pieces)
    assert length == len(batch) == HEADER_SIZE + columns.payload_bytes
    header = parse_header(batch, 0)
    assert header.length == length and crc_matches(batch, 0, header)
    decoded = decode_records(batch, 0, header, "t", 0)
    assert [(r.key, r.value, r.headers) for r in decoded] == [(r.key, r.value, r.headers)
                                                             for r in records]


def test_columns_from_fields_equal_columns_of_records() -> None:
    records = _records()
    assert (Columns.from_fields(list(zip(*records))).encode(3, 0, 4, 1)
            == Columns(records).encode(3, 0, 4, 1))
