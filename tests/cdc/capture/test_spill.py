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
