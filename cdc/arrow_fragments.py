"""Column text forms as Arrow arrays -> JSON fragments, keys and ``after`` objects, a column at a time.

The snapshot reads each column as one Arrow array of the values' text forms (what the type's output
function writes, as pgoutput sends them). :func:`fragments` turns such an array into the JSON value of
every row with Arrow compute kernels, and :func:`join_objects` lays the fragments out as objects.

Guarantee: every fragment is byte for byte what the column's :func:`~cdc.row_codec.fragmenter` writes
for the same text (so ``after`` objects and keys equal the streamed events' and keys choose the same
partitions). The kernels cover only rewrites that are exact for the rows they take: integers as they
are; numeric and uuid quoted; text quoted when it holds nothing JSON escapes (``"``, ``\\``, control
characters); bool; timestamps in UTC. Every other row (and every row of any other type) goes through
the fragmenter itself, one value at a time (tests/cdc/test_arrow_fragments.py compares both on
every kind of text).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cdc.row_codec import NULL, Fragmenter, _bool, _number, _quoted, _text, _timestamp, _timestamptz

BYTES = pa.large_binary()
EMPTY = pa.scalar(b"", BYTES)
_QUOTE = pa.scalar(b'"', BYTES)
_UTC_END = pa.scalar(b'Z"', BYTES)
#: What JSON strings escape (orjson: the quote, the backslash and the control characters).
_NEEDS_ESCAPE = r'[\x00-\x1f"\\]'


def literal(data: bytes) -> pa.Scalar:
    """A byte string to join with arrays."""
    return pa.scalar(data, BYTES)


def fragments(texts: pa.Array, nulls: pa.Array | None, encode: Fragmenter) -> pa.Array:
    """The JSON value of every row: ``null`` where ``nulls`` is true, else ``encode`` of the text.

    ``texts`` is a ``large_binary`` array without nulls (a null row's text is ignored).
    """
    if encode is _number:
        out, slow = texts, None
    elif encode is _quoted:
        out, slow = _wrapped(texts), None
    elif encode is _text:
        slow = pc.match_substring_regex(texts, _NEEDS_ESCAPE)
        out = _wrapped(texts)
    elif encode is _bool:
        out = pc.if_else(pc.equal(texts, literal(b"t")), literal(b"true"), literal(b"false"))
        slow = None
    elif encode is _timestamptz:
        fast = pc.and_(pc.ends_with(texts, b"+00"), _digit_first(texts))
        slow = pc.invert(fast)
        body = pc.replace_substring(pc.binary_slice(texts, 0, -3), b" ", b"T", max_replacements=1)
        out = pc.binary_join_element_wise(_QUOTE, body, _UTC_END, EMPTY)
    elif encode is _timestamp:
        fast = pc.and_(pc.invert(pc.ends_with(texts, b" BC")), _digit_first(texts))
        slow = pc.invert(fast)
        out = _wrapped(pc.replace_substring(texts, b" ", b"T", max_replacements=1))
    else:
        out, slow = texts, pa.array(np.ones(len(texts), dtype=bool))
    if nulls is not None and nulls.true_count:
        slow = None if slow is None else pc.and_not(slow, nulls)
        out = pc.if_else(nulls, literal(NULL), out)
    if slow is not None and slow.true_count:
        picked = np.flatnonzero(np.asarray(slow, dtype=bool))
        rows = texts.take(pa.array(picked)).to_pylist()
        out = pc.replace_with_mask(out, slow, pa.array(list(map(encode, rows)), BYTES))
    return out


def join_objects(prefixes: Sequence[bytes], parts: Sequence[pa.Array]) -> pa.Array:
    """``{<prefix 0><part 0>,<prefix 1><part 1>...}`` per row, the prefixes being ``"name":``."""
    pieces: list[pa.Array | pa.Scalar] = []
    for index, (prefix, part) in enumerate(zip(prefixes, parts, strict=True)):
        pieces.append(literal((b"{" if index == 0 else b",") + prefix))
        pieces.append(part)
    pieces.append(literal(b"}"))
    return pc.binary_join_element_wise(*pieces, EMPTY)


def _wrapped(texts: pa.Array) -> pa.Array:
    return pc.binary_join_element_wise(_QUOTE, texts, _QUOTE, EMPTY)


def _digit_first(texts: pa.Array) -> pa.Array:
    first = pc.binary_slice(texts, 0, 1)
    return pc.and_(pc.greater_equal(first, literal(b"0")), pc.less_equal(first, literal(b"9")))
