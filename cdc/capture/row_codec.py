"""Per-table row encoders: column values to the JSON fragments of the change event, compiled once per shape.

A :class:`RowCodec` is built once for each :class:`~cdc.capture.tables.TableShape` (a new Relation message gives a
new shape and so a new codec). It holds, per column, its JSON name prefix and an encoder from the
column's text form to its JSON value bytes, and it assembles ``after`` objects and keys from those
fragments by byte concatenation instead of building a dict per row and serialising it.

Guarantee: every fragment is byte for byte what ``orjson.dumps(converter(text))`` writes with the column's
:mod:`cdc.capture.values` converter, and objects and keys are byte for byte what ``orjson.dumps`` writes for the
equivalent dicts (keys with sorted names), so events read the same whichever path built them
(tests/cdc/capture/test_row_codec.py compares the two on every type). Shortcuts are taken only for text forms
whose conversion is a pure byte rewrite (integers, numeric, uuid, bool, timestamps in UTC); anything
else goes through the converter.

:meth:`RowCodec.insert_encoder` compiles, per table, one function that reads an Insert message's
TupleData straight from the pgoutput payload and returns the record's key and envelope: the hot path
of streaming, with no intermediate tuple of strings, dict or per-column call for most types. It returns
``None`` for anything it does not expect (a column count that differs from the shape's, a binary or
unchanged column), and the caller then takes the general path through :class:`~cdc.capture.pgoutput.Decoder`.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import Any

import orjson

from cdc.capture.values import (
    Converter,
    to_bool,
    to_int,
    to_text,
    to_timestamp,
    to_timestamptz,
)

NULL = b"null"
#: Column text (as bytes) -> JSON value bytes.
Fragmenter = Callable[[bytes], bytes]
#: ``(payload, pos, envelope template, sequence, ts_ms)`` -> ``(key, value)`` or ``None``.
InsertEncoder = Callable[[bytes, int, bytes, int, int], "tuple[bytes | None, bytes] | None"]

_I32 = struct.Struct("!i")
_dumps = orjson.dumps
_NUMBER_TYPES = frozenset({"int2", "int4", "int8", "oid"})
_QUOTED_TYPES = frozenset({"numeric", "uuid"})


def _generic(convert: Converter) -> Fragmenter:
    def fragment(raw: bytes) -> bytes:
        return _dumps(convert(raw.decode("utf-8")))

    return fragment


def _text(raw: bytes) -> bytes:
    return _dumps(raw.decode("utf-8"))


def _number(raw: bytes) -> bytes:
    return raw


def _quoted(raw: bytes) -> bytes:
    return b'"' + raw + b'"'


def _bool(raw: bytes) -> bytes:
    return b"true" if raw == b"t" else b"false"


def _timestamptz(raw: bytes) -> bytes:
    if raw[-3:] == b"+00" and 48 <= raw[0] <= 57:
        return b'"' + raw[:-3].replace(b" ", b"T", 1) + b'Z"'
    return _dumps(to_timestamptz(raw.decode("utf-8")))


def _timestamp(raw: bytes) -> bytes:
    if 48 <= raw[0] <= 57 and raw[-3:] != b" BC":
        return b'"' + raw.replace(b" ", b"T", 1) + b'"'
    return _dumps(to_timestamp(raw.decode("utf-8")))


def fragmenter(type_name: str, convert: Converter) -> Fragmenter:
    """The encoder of one column: its text form (UTF-8 bytes) to its JSON value, as ``convert`` defines it."""
    if convert is to_int and type_name in _NUMBER_TYPES:
        return _number
    if convert is to_text:
        return _quoted if type_name in _QUOTED_TYPES else _text
    if convert is to_bool:
        return _bool
    if convert is to_timestamptz:
        return _timestamptz
    if convert is to_timestamp:
        return _timestamp
    return _generic(convert)


def _escape(data: bytes) -> bytes:
    return data.replace(b"%", b"%%")


class RowCodec:
    """The fragment encoders and byte templates of one table shape.

    ``names`` are the column names, ``types`` their base type names, ``converters`` their
    :mod:`cdc.capture.values` converters and ``keys`` the indexes of the key columns.
    """

    def __init__(self, names: Sequence[str], types: Sequence[str], converters: Sequence[Converter], keys: Sequence[int]) -> None:
        self.names = tuple(names)
        self.count = len(self.names)
        self.fragmenters: tuple[Fragmenter, ...] = tuple(fragmenter(t, c) for t, c in zip(types, converters, strict=True))
        self.prefixes: tuple[bytes, ...] = tuple(_dumps(name) + b":" for name in self.names)
        self.keys = tuple(keys)
        #: key column indexes in the order of their sorted names (the canonical key's field order)
        self.sorted_keys = tuple(sorted(self.keys, key=lambda i: self.names[i]))
        self.key_template: bytes | None = None
        if self.keys:
            self.key_template = b"{" + b",".join(_escape(self.prefixes[i]) + b"%b" for i in self.sorted_keys) + b"}"
        #: ``{"a":%b,"b":%b}``: the whole row, fragments in column order
        self.after_template = b"{" + b",".join(_escape(p) + b"%b" for p in self.prefixes) + b"}"
        self._insert_encoder: InsertEncoder | None = None

    # -- fragments -----------------------------------------------------------------------------------

    def fragment(self, index: int, value: str | None) -> bytes:
        """The JSON value of column ``index`` from its text form (``None``: SQL NULL)."""
        if value is None:
            return NULL
        return self.fragmenters[index](value.encode("utf-8"))

    def key(self, fragments: Sequence[bytes | None]) -> bytes | None:
        """The canonical key JSON from per-column fragments (a missing key fragment reads as null)."""
        if self.key_template is None:
            return None
        return self.key_template % tuple(NULL if fragments[i] is None else fragments[i] for i in self.sorted_keys)

    def obj(self, fragments: Sequence[bytes | None], only: Sequence[int] | None = None) -> bytes:
        """A JSON object of the columns whose fragment is not ``None`` (``only``: just these indexes)."""
        indexes = range(self.count) if only is None else only
        prefixes = self.prefixes
        parts = [prefixes[i] + fragments[i] for i in indexes if fragments[i] is not None]  # type: ignore[operator]
        return b"{" + b",".join(parts) + b"}"

    # -- the Insert hot path ---------------------------------------------------------------------------

    def insert_encoder(self) -> InsertEncoder:
        """``encode(payload, pos, template, sequence, ts_ms)`` -> the key and value of an Insert, or ``None``.

        ``pos`` is where the new row's TupleData starts; ``template`` is the envelope with one ``%b``
        per column, then ``%d`` for the sequence and for ``ts_ms``. ``None`` means: take the general path.
        """
        if self._insert_encoder is None:
            self._insert_encoder = self._compile()
        return self._insert_encoder

    def _compile(self) -> InsertEncoder:
        lines = [
            "def encode(buf, p, template, sequence, now):",
            f"    if buf[p] != {self.count >> 8} or buf[p + 1] != {self.count & 0xFF}:",
            "        return None",
            "    p += 2",
        ]
        namespace: dict[str, Any] = {"ulen": _I32.unpack_from, "NULL": NULL, "dumps": _dumps}
        for index, encode in enumerate(self.fragmenters):
            namespace[f"enc{index}"] = encode
            if encode is _number:
                convert = f"f{index} = buf[p:p + n]"
            elif encode is _quoted:
                convert = f"f{index} = b'\"' + buf[p:p + n] + b'\"'"
            elif encode is _text:
                convert = f"f{index} = dumps(buf[p:p + n].decode())"
            elif encode is _timestamptz:  # the common UTC form inline, as _timestamptz writes it
                convert = (
                    f"f{index} = (b'\"' + buf[p:p + n - 3].replace(b' ', b'T', 1) + b'Z\"' "
                    f"if buf.endswith(b'+00', p, p + n) and 48 <= buf[p] <= 57 else enc{index}(buf[p:p + n]))"
                )
            else:
                convert = f"f{index} = enc{index}(buf[p:p + n])"
            lines += [
                "    k = buf[p]",
                "    if k == 116:",
                "        n = ulen(buf, p + 1)[0]",
                "        p += 5",
                f"        {convert}",
                "        p += n",
                "    elif k == 110:",
                "        p += 1",
                f"        f{index} = NULL",
                "    else:",
                "        return None",
            ]
        columns = "".join(f"f{i}, " for i in range(self.count))
        key = "None" if self.key_template is None else "KEY % (" + "".join(f"f{i}, " for i in self.sorted_keys) + ")"
        namespace["KEY"] = self.key_template
        lines.append(f"    return {key}, template % ({columns}sequence, now)")
        exec(compile("\n".join(lines), f"<insert parser {len(self.names)} columns>", "exec"), namespace)  # noqa: S102
        return namespace["encode"]  # type: ignore[no-any-return]
