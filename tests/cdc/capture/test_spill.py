"""cdc.capture.spill: the buffer that spills a large transaction to disk."""

from __future__ import annotations

from cdc.capture.spill import SpillBuffer


def test_spill_buffer_keeps_order_across_the_limit() -> None:
    buffer = SpillBuffer(memory_limit=10)
    items = [bytes([i]) * 5 for i in range(20)]
    for item in items:
        buffer.append(item)
    assert buffer.spilled and list(buffer) == items and list(buffer) == items
    buffer.close()


def test_spill_buffer_keeps_each_items_lsn_across_the_limit() -> None:
    buffer = SpillBuffer(memory_limit=40)
    items = [(0x1000 + i, bytes([i]) * 3) for i in range(6)]
    buffer.append(*items[0][::-1])
    buffer.extend([item for _, item in items[1:3]], [lsn for lsn, _ in items[1:3]])
    assert not buffer.spilled and list(buffer.positioned()) == items[:3]
    buffer.extend([item for _, item in items[3:]], [lsn for lsn, _ in items[3:]])
    assert buffer.spilled and list(buffer.positioned()) == items and list(buffer) == [item for _, item in items]
    buffer.close()


def test_a_spill_file_holds_no_clear_byte_of_what_it_keeps() -> None:
    """A transaction's raw changes hold the clear values of masked columns: on disk they are encrypted."""
    buffer = SpillBuffer(memory_limit=64)
    secret = b"123-45-6789 ssn of someone"
    items = [secret + bytes([i]) for i in range(50)]
    buffer.extend(items[:10], range(1, 11))
    for lsn, item in enumerate(items[10:], 11):
        buffer.append(item, lsn)
    assert buffer.spilled
    assert list(buffer.positioned()) == list(enumerate(items, 1))
    buffer.append(secret)  # appended after reading: the file goes on where it ended
    assert list(buffer) == [*items, secret]
    spill_file = buffer._file
    assert spill_file is not None
    spill_file.flush()
    spill_file.seek(0)
    on_disk = spill_file.read()
    assert len(on_disk) >= sum(map(len, items)) and b"123-45" not in on_disk and b"ssn" not in on_disk
    buffer.close()
