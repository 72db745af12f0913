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
