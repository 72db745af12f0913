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


def test_a_spill_file_holds_no_clear_byte_of_what_it_keeps() -> None:
    """A transaction's raw changes hold the clear values of masked columns: on disk they are encrypted."""
    buffer = SpillBuffer(memory_limit=64)
    secret = b"123-45-6789 ssn of someone"
    items = [secret + bytes([i]) for i in range(50)]
    buffer.extend(items[:10])
    for item in items[10:]:
        buffer.append(item)
    assert buffer.spilled
    assert list(buffer) == items
    buffer.append(secret)  # appended after reading: the file goes on where it ended
    assert list(buffer) == [*items, secret]
    spill_file = buffer._file
    assert spill_file is not None
    spill_file.flush()
    spill_file.seek(0)
    on_disk = spill_file.read()
    assert len(on_disk) >= sum(map(len, items)) and b"123-45" not in on_disk and b"ssn" not in on_disk
    buffer.close()
