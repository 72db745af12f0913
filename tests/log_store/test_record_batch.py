"""Record batches: encoding round trips and the CRC that covers every byte."""

from __future__ import annotations

import random
import struct

import pytest

from log_store.batch_decoding import RecordColumns, decode_record_columns, decode_records
from log_store.batch_encoding import Columns, encode_records
from log_store.record import ProducerRecord, Record
from log_store.record_batch import HEADER_SIZE, MAGIC, RECORD_SIZE, BatchHeader, crc_matches, header_problem, parse_header


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
    assert [(r.offset, r.value) for r in decode_records(batch, 0, header, "t", 0)] == [(7, b"keyless"), (8, None)]


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


@pytest.mark.parametrize(
    ("field", "value", "problem"),
    [("magic", 9, "magic"), ("magic", 0, "magic"), ("length", 10, "shorter"), ("record_count", 9, "cannot fit")],
)
def test_header_problems(field: str, value: int, problem: str) -> None:
    header = parse_header(Columns(_records()).encode(0, 0, 4, 0), 0)._replace(**{field: value})
    assert problem in (header_problem(header) or "")
    assert HEADER_SIZE == 42


def test_batch_pieces_have_one_crc_over_all() -> None:
    records = _records() * 300  # nulls and headers included
    columns = Columns(records)
    pieces, length = columns.encode_pieces(0, 0, len(records), 7)
    batch = b"".join(pieces)
    assert length == len(batch) == HEADER_SIZE + columns.payload_bytes
    header = parse_header(batch, 0)
    assert header.magic == MAGIC
    assert header.length == length and crc_matches(batch, 0, header)
    decoded = decode_records(batch, 0, header, "t", 0)
    assert [(r.offset, r.key, r.value, r.timestamp_ms, r.headers) for r in decoded] == [
        (i, r.key, r.value, r.timestamp_ms, r.headers) for i, r in enumerate(records)
    ]


def test_column_layout_matches_the_spec() -> None:
    """The byte layout the module docstring documents, field by field."""
    records = [ProducerRecord("t", b"ab", None, 5), ProducerRecord("t", None, b"xyz", 6, (("h", b"1"),))]
    batch = Columns(records).encode(10, 0, 2, 1)
    body = batch[HEADER_SIZE:]
    block = b"\x00\x01h\x00\x00\x00\x01" + b"1"
    assert body == (
        struct.pack(">2i", 0, 1)
        + struct.pack(">2q", 5, 6)
        + struct.pack(">2i", 2, -1)
        + struct.pack(">2i", -1, 3)
        + struct.pack(">2i", 0, len(block))
        + b"ab"
        + b"xyz"
        + block
    )
    assert len(body) == 2 * RECORD_SIZE + 2 + 3 + len(block)


@pytest.mark.parametrize("damage", ["deltas", "lengths", "overrun"])
def test_columns_that_do_not_add_up_are_refused(damage: str) -> None:
    """Only a CRC collision or a writer bug can produce these; decoding refuses instead of guessing."""
    records = [ProducerRecord("t", b"ab", b"cd", 5), ProducerRecord("t", b"ef", b"gh", 6)]
    batch = bytearray(Columns(records).encode(10, 0, 2, 1))
    p = HEADER_SIZE
    if damage == "deltas":
        batch[p : p + 8] = struct.pack(">2i", 1, 1)
    elif damage == "lengths":
        batch[p + 24 : p + 28] = struct.pack(">i", -2)  # the first key length
    else:
        batch[p + 24 : p + 28] = struct.pack(">i", 3)
    with pytest.raises(ValueError):
        decode_records(bytes(batch), 0, parse_header(bytes(batch), 0), "t", 0)
    with pytest.raises(ValueError):
        decode_record_columns(bytes(batch), 0, parse_header(bytes(batch), 0))


def test_columns_from_fields_equal_columns_of_records() -> None:
    records = _records()
    assert Columns.from_fields(list(zip(*records))).encode(3, 0, 4, 1) == Columns(records).encode(3, 0, 4, 1)


@pytest.mark.parametrize("seed", range(20))
def test_records_and_record_columns_decode_alike(seed: int) -> None:
    """Any records, any offset window: records and record columns decode to the same records (uniform
    and varying lengths, null keys and values, empty ones, headers)."""
    rng = random.Random(seed)
    uniform = rng.random() < 0.5

    def blob() -> bytes | None:
        if not uniform and rng.random() < 0.2:
            return None
        return rng.randbytes(7 if uniform else rng.randint(0, 12))

    offsets = sorted(rng.sample(range(40), rng.randint(1, 30)))
    records = [
        Record(
            "t", 0, 100 + o, blob(), blob(), rng.randint(-5, 1 << 40), (("h", rng.randbytes(3)),) if rng.random() < 0.3 else ()
        )
        for o in offsets
    ]
    batch = encode_records(100, 39, records, 0, attributes=0)
    for _ in range(10):
        low, high = sorted(rng.sample(range(95, 145), 2))
        expected = [r for r in records if low <= r.offset < high]
        assert decode_records(batch, 0, parse_header(batch, 0), "t", 0, low, high) == expected
        assert as_records(decode_record_columns(batch, 0, parse_header(batch, 0), low, high)) == expected


def as_records(columns: RecordColumns, topic: str = "t", partition: int = 0) -> list[Record]:
    """Expand :class:`RecordColumns` back into records (test oracle)."""
    out, key_at, value_at = [], 0, 0
    keys, values = bytes(columns.keys), bytes(columns.values)
    for i in range(len(columns)):
        key_length, value_length = int(columns.key_lengths[i]), int(columns.value_lengths[i])
        key = None if key_length < 0 else keys[key_at : key_at + key_length]
        value = None if value_length < 0 else values[value_at : value_at + value_length]
        key_at += max(key_length, 0)
        value_at += max(value_length, 0)
        headers = columns.headers[i] if columns.headers is not None else ()
        out.append(Record(topic, partition, int(columns.offsets[i]), key, value, int(columns.timestamps[i]), headers))
    assert key_at == len(keys) and value_at == len(values)
    return out


def test_a_batch_of_another_layout_is_named_not_decoded() -> None:
    batch = bytearray(encode_records(0, 0, [Record("t", 0, 0, b"k", b"v", 1, ())], 1))
    batch[16] = 1  # the magic byte: a row layout no released version wrote
    assert header_problem(parse_header(bytes(batch), 0)) == "unknown batch magic 1 (expected one of (2,))"
