"""Column text forms as Arrow arrays -> JSON fragments, keys and ``after`` objects, a column at a time.

The snapshot reads each column as one Arrow array of the values' text forms (what the type's output
function writes, as pgoutput sends them). :func:`fragments` turns such an array into the JSON value of
every row with Arrow compute kernels, and :func:`object_pieces` and :func:`join` lay them out as objects.

Guarantee: every fragment is byte for byte what the column's :func:`~cdc.capture.row_codec.fragmenter` writes
for the same text (so ``after`` objects and keys equal the streamed events' and keys choose the same
partitions). The kernels cover only rewrites that are exact for the rows they take: integers as they
are; numeric and uuid quoted; text quoted when it holds nothing JSON escapes (``"``, ``\\``, control
characters); bool; timestamps in UTC. Every other row (and every row of any other type) goes through
the fragmenter itself, one value at a time (tests/cdc/capture/test_arrow_fragments.py compares both on
every kind of text).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cdc.capture.row_codec import NULL, Fragmenter, _bool, _number, _quoted, _text, _timestamp, _timestamptz

BYTES = pa.large_binary()
EMPTY = pa.scalar(b"", BYTES)
_QUOTE = pa.scalar(b'"', BYTES)
_UTC_END = pa.scalar(b'Z"', BYTES)
#: What JSON strings escape (orjson: the quote, the backslash and the control characters).
_NEEDS_ESCAPE = r'[\x00-\x1f"\\]'


def literal(data: bytes) -> pa.Scalar:
    """A byte string to join with arrays."""
    return pa.scalar(data, BYTES)


def fragments(texts: pa.Array, nulls: pa.Array | None, encode: Fragmenter) -> list[pa.Array | pa.Scalar]:
    """The JSON value of every row, as pieces for :func:`join`: ``null`` where ``nulls`` is true, else
    ``encode`` of the text.

    ``texts`` is a ``large_binary`` array (a null row's text is ignored). The pieces are the texts
    themselves between literal quotes where no row needs more, so that :func:`join` copies each
    byte once.
    """
    pieces: list[pa.Array | pa.Scalar]
    if encode is _number:
        pieces, slow = [texts], None
    elif encode is _quoted:
        pieces, slow = [_QUOTE, texts, _QUOTE], None
    elif encode is _text:
        slow = pc.match_substring_regex(texts, _NEEDS_ESCAPE) if _any_escaped(texts) else None
        pieces = [_QUOTE, texts, _QUOTE]
    elif encode is _bool:
        pieces, slow = [pc.if_else(pc.equal(texts, literal(b"t")), literal(b"true"), literal(b"false"))], None
    elif encode is _timestamptz:
        slow = pc.invert(pc.and_(pc.ends_with(texts, b"+00"), _digit_first(texts)))
        pieces = [_QUOTE, pc.replace_substring(pc.binary_slice(texts, 0, -3), b" ", b"T", max_replacements=1), _UTC_END]
    elif encode is _timestamp:
        slow = pc.invert(pc.and_(pc.invert(pc.ends_with(texts, b" BC")), _digit_first(texts)))
        pieces = [_QUOTE, pc.replace_substring(texts, b" ", b"T", max_replacements=1), _QUOTE]
    else:
        pieces, slow = [texts], pa.array(np.ones(len(texts), dtype=bool))
    if slow is not None and nulls is not None:
        slow = pc.and_not(slow, nulls)
    if slow is not None and not slow.true_count:
        slow = None
    if nulls is None and slow is None:
        return pieces
    out = join(pieces, len(texts)) if len(pieces) > 1 else pieces[0]
    if nulls is not None:
        out = pc.if_else(nulls, literal(NULL), out)
    if slow is not None:
        out = replaced_rows(out, slow, texts, encode)
    return [out]


def replaced_rows(out: pa.Array, mask: pa.Array, texts: pa.Array, convert: Callable[[bytes], bytes]) -> pa.Array:
    """``out`` with every row where ``mask`` is true replaced by ``convert`` of that row's text (in Python,
    one row at a time: for the few rows no kernel covers)."""
    rows = texts.take(pa.array(np.flatnonzero(np.asarray(mask, dtype=bool)))).to_pylist()
    return pc.replace_with_mask(out, mask, pa.array(list(map(convert, rows)), BYTES))


def object_pieces(prefixes: Sequence[bytes], parts: Sequence[Sequence[pa.Array | pa.Scalar]]) -> list[pa.Array | pa.Scalar]:
    """What :func:`join` makes ``{<prefix 0><part 0>,<prefix 1><part 1>...}`` of, per row (the prefixes
    being ``"name":``, the parts :func:`fragments`' pieces); kept apart so that a caller can join more
    around it in the same pass."""
    pieces: list[pa.Array | pa.Scalar] = []
    for index, (prefix, part) in enumerate(zip(prefixes, parts, strict=True)):
        pieces.append(literal((b"{" if index == 0 else b",") + prefix))
        pieces.extend(part)
    pieces.append(literal(b"}" if parts else b"{}"))
    return _merged(pieces)


def join(pieces: Sequence[pa.Array | pa.Scalar], count: int) -> pa.Array:
    """The pieces (arrays of ``count`` rows, or scalars repeated on every row) joined per row."""
    pieces = _merged(pieces)
    if not any(isinstance(piece, pa.Array) for piece in pieces):
        pieces = [*pieces, pa.nulls(count, BYTES).fill_null(EMPTY)]
    return pc.binary_join_element_wise(*pieces, EMPTY)


def _merged(pieces: Sequence[pa.Array | pa.Scalar]) -> list[pa.Array | pa.Scalar]:
    """``pieces`` with neighbouring scalars joined into one."""
    out: list[pa.Array | pa.Scalar] = []
    for piece in pieces:
        if isinstance(piece, pa.Scalar) and out and isinstance(out[-1], pa.Scalar):
            out[-1] = literal(out[-1].as_py() + piece.as_py())
        else:
            out.append(piece)
    return out


def _any_escaped(texts: pa.Array) -> bool:
    """Whether the texts may hold a byte that JSON strings escape: one pass over their data buffer (a
    buffer shared with other arrays may only add false alarms); the rows that hold one are then found
    with a regular expression."""
    data = texts.buffers()[2]
    raw = np.frombuffer(data, dtype=np.uint8) if data is not None else np.empty(0, np.uint8)
    return bool(np.any((raw < 0x20) | (raw == 0x22) | (raw == 0x5C)))


def _digit_first(texts: pa.Array) -> pa.Array:
    first = pc.binary_slice(texts, 0, 1)
    return pc.and_(pc.greater_equal(first, literal(b"0")), pc.less_equal(first, literal(b"9")))
