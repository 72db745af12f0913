"""Folding of records that omit unchanged columns onto the previous value of their key.

pgoutput leaves unchanged TOAST columns out of an update. The capture side marks such a record with the
header ``("unchanged", b'["col_a", ...]')``; its value is a change-event JSON object whose ``"after"``
lacks those columns. Compaction may drop the previous record of the key, so before it does it folds:
the missing columns are copied from the previous record's ``"after"`` (itself possibly a fold), the
header is dropped and the newer record's offset is kept. No column is ever filled with a placeholder: if
the previous value lacks a column the fold fails (:class:`FoldError`) and the record is kept as written.

A fold function has the signature ``fold(previous: bytes, partial: bytes, unchanged: list[str]) -> bytes``
and is chosen by :attr:`log_store.config.LogConfig.fold`. :func:`fold_json_after` keeps numbers exactly
as written (their text is copied, never parsed to float) and the column order of the previous row.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import orjson

from log_store.errors import FoldError

FoldFunction = Callable[[bytes, bytes, list[str]], bytes]


def _loads(data: bytes) -> Any:
    return json.loads(data, parse_int=orjson.Fragment, parse_float=orjson.Fragment,
                      parse_constant=orjson.Fragment)


def parse_unchanged(header: bytes) -> list[str]:
    """The column names of an ``unchanged`` header (a JSON list of strings)."""
    try:
        names = orjson.loads(header)
    except orjson.JSONDecodeError as exc:
        raise FoldError(f"the unchanged header is not JSON ({exc})") from None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise FoldError("the unchanged header is not a JSON list of column names")
    return names


def fold_json_after(previous: bytes, partial: bytes, unchanged: list[str]) -> bytes:
    """Copy the ``unchanged`` columns of ``previous["after"]`` into ``partial["after"]``."""
    try:
        before_obj, partial_obj = _loads(previous), _loads(partial)
    except (ValueError, UnicodeDecodeError) as exc:
        raise FoldError(f"a value is not JSON ({exc})") from None
    if not isinstance(before_obj, dict) or not isinstance(before_obj.get("after"), dict):
        raise FoldError("the previous value has no \"after\" object")
    if not isinstance(partial_obj, dict) or not isinstance(partial_obj.get("after"), dict):
        raise FoldError("the partial value has no \"after\" object")
    old_after: dict[str, Any] = before_obj["after"]
    new_after: dict[str, Any] = partial_obj["after"]
    missing = [name for name in unchanged if name not in old_after]
    if missing:
        raise FoldError(f"the previous value lacks column(s) {', '.join(missing)}")
    wanted = set(unchanged)
    merged = {name: (old_after[name] if name in wanted else new_after[name])
              for name in old_after if name in wanted or name in new_after}
    for name, value in new_after.items():
        if name not in merged:
            merged[name] = value
    partial_obj["after"] = merged
    return orjson.dumps(partial_obj)
