"""Garbage-collector settings for the capture loop.

Capture allocates a few small objects per event (payload bytes, the record tuple, its key and value)
that live only until the log has written their chunk, and it creates no reference cycles on that path.
With the default thresholds the young generation is collected every 700 allocations and every object
a chunk holds is scanned again and again on its way to the oldest generation, which costs about a
quarter of the streaming CPU. :func:`relaxed_gc` moves what exists at start (modules, settings,
caches) out of the collector's view and collects the young generation less often; cycles are still
collected, only later. The previous settings come back when the block ends.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

#: young-generation threshold during capture (default 700)
YOUNG_THRESHOLD = 50_000


_lock = threading.Lock()
_depth = 0
_previous: tuple[int, int, int] = (700, 10, 10)


@contextmanager
def relaxed_gc() -> Iterator[None]:
    """Collect rarely inside the block; restore the previous thresholds and unfreeze afterwards.

    Blocks may nest or overlap in several threads: the first to enter changes the settings, the last
    to leave restores them.
    """
    global _depth, _previous
    with _lock:
        if _depth == 0:
            _previous = gc.get_threshold()  # type: ignore[assignment]
            gc.freeze()
            gc.set_threshold(YOUNG_THRESHOLD, _previous[1], _previous[2])
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                gc.set_threshold(*_previous)
                gc.unfreeze()
