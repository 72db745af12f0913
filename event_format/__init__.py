"""The change event's format, in one place: what capture (``cdc/``) writes and the views
(``derived_views/``) read, beyond the envelope's JSON fields themselves (docs/event-format.md).

It imports nothing of either side, only the log's error for a refused fold, and the log imports nothing
of it: the fold reaches the log as :attr:`log_store.config.LogConfig.fold`, so the log knows nothing of
envelopes.

* **Headers.** ``unchanged``: the JSON list of the columns an update left out (unchanged TOAST values),
  which makes the record a partial row; ``lsn`` and ``sequence``: the position of the delete a tombstone
  follows.
* **Markers.** A truncate record has ``op = "t"``; on a log that places every record by its key its key
  is ``{"__truncate__":n}`` (:func:`truncate_key`). :data:`SNAPSHOT_POSITION` is the watermark
  position of a group that holds part of a snapshot that is not complete.
* **Numbers exactly as written.** :func:`loads_exact` parses a value without turning a number into a
  float, so that a value written back keeps its digits.
* **The fold.** :func:`fold_after` completes a partial row from the key's previous row: the one fold
  compaction, capture (reading a row back) and the views agree on.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

from log_store.errors import FoldError
from log_store.record import UNCHANGED_HEADER

__all__ = ["UNCHANGED_HEADER"]  # the log's mark of a partial row, which the event format adopts

#: headers of a tombstone: the ``(lsn, sequence)`` of the delete it follows
LSN_HEADER = "lsn"
SEQUENCE_HEADER = "sequence"
#: the watermark position of groups that hold part of a snapshot and no source commit
SNAPSHOT_POSITION = "0" * 16
#: how the key of a truncate record begins on a log that places every record by its key
TRUNCATE_KEY_PREFIX = b'{"__truncate__":'


def truncate_key(n: int) -> bytes:
    """The ``n``-th truncate key (capture picks the first one the partitioner places on each partition)."""
    return TRUNCATE_KEY_PREFIX + b"%d}" % n


def is_truncate_key(key: bytes | None) -> bool:
    """Whether a record with this key may be a truncate marker (a null key, or a truncate key)."""
    return key is None or key.startswith(TRUNCATE_KEY_PREFIX)


def is_truncate_record(key: bytes | None, value: bytes | None) -> bool:
    """Whether a record is a truncate marker: its key a truncate key, or its key null (a log whose records
    take an explicit partition) and its ``op`` ``"t"``. A null key alone does not tell: every change of a
    keyless table (no primary key or replica identity index) has one too."""
    if key is not None:
        return key.startswith(TRUNCATE_KEY_PREFIX)
    return value is not None and orjson.loads(value).get("op") == "t"


def loads_exact(data: bytes) -> Any:
    """JSON with every number kept as written (an ``orjson.Fragment`` that dumps to the same text)."""
    return json.loads(data, parse_int=orjson.Fragment, parse_float=orjson.Fragment, parse_constant=orjson.Fragment)


def fold_after(previous: bytes, partial: bytes, unchanged: list[str]) -> bytes:
    """``partial`` with the ``unchanged`` columns of its ``"after"`` copied from ``previous["after"]``.

    Numbers keep their text and the row keeps the previous row's column order. No column is ever
    filled with a placeholder: when the previous row lacks one, :class:`~log_store.errors.FoldError`
    says so (compaction then keeps the record as written).
    """
    try:
        before_obj, partial_obj = loads_exact(previous), loads_exact(partial)
    except (ValueError, UnicodeDecodeError) as exc:
        raise FoldError(f"a value is not JSON ({exc})") from None
    if not isinstance(before_obj, dict) or not isinstance(before_obj.get("after"), dict):
        raise FoldError('the previous value has no "after" object')
    if not isinstance(partial_obj, dict) or not isinstance(partial_obj.get("after"), dict):
        raise FoldError('the partial value has no "after" object')
    old_after: dict[str, Any] = before_obj["after"]
    new_after: dict[str, Any] = partial_obj["after"]
    missing = [name for name in unchanged if name not in old_after]
    if missing:
        raise FoldError(f"the previous value lacks column(s) {', '.join(missing)}")
    wanted = set(unchanged)
    merged = {
        name: (old_after[name] if name in wanted else new_after[name])
        for name in old_after
        if name in wanted or name in new_after
    }
    for name, value in new_after.items():
        if name not in merged:
            merged[name] = value
    partial_obj["after"] = merged
    return orjson.dumps(partial_obj)
