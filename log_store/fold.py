"""Folding of partial records onto the previous value of their key, as far as the log knows it.

A producer marks a record that leaves some fields out with the header ``("unchanged", b'["a", ...]')``
(:data:`~log_store.record.UNCHANGED_HEADER`). Compaction may drop the previous record of the key, so
before it does it folds: a fold function, ``fold(previous: bytes, partial: bytes, unchanged: list[str])
-> bytes``, completes the partial value from the previous one (itself possibly a fold), the header is
dropped and the newer record's offset is kept. The log does not know what the values hold: the function
comes from :attr:`log_store.config.LogConfig.fold` (the change events' own is
``event_format.fold_after``). Without one, or when it refuses (:class:`FoldError`), the record is kept
as written.
"""

from __future__ import annotations

from collections.abc import Callable

import orjson

from log_store.errors import FoldError

FoldFunction = Callable[[bytes, bytes, list[str]], bytes]


def parse_unchanged(header: bytes) -> list[str]:
    """The column names of an ``unchanged`` header (a JSON list of strings)."""
    try:
        names = orjson.loads(header)
    except orjson.JSONDecodeError as exc:
        raise FoldError(f"the unchanged header is not JSON ({exc})") from None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise FoldError("the unchanged header is not a JSON list of column names")
    return names
