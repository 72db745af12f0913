"""The 64-bit hashes ``cdc verify`` sums per bucket: every value of a batch hashed at once, column by column.

A batch is a list of rows (the source's, as psycopg loads them) or an Arrow record batch (the view's, as
``deltalake`` reads it, its columns in the same order). Each column is hashed by its :class:`Kind`, which
brings a value of either side to one canonical form first, so that a value both sides hold alike hashes
alike whatever form each holds it in:

- integers, dates, instants (microseconds since 1970, UTC for ``timestamptz``), booleans, floats (their
  64-bit pattern; a ``real`` rounded to 32 bits as the source holds it) and decimals of the view's
  precision and scale (their 128-bit unscaled value) as fixed-width numbers: cast by Arrow and mixed by
  numpy over the whole column (a source text such as ``2024-01-01 00:00:01+00`` or ``12.30`` parsed by
  Arrow's casts);
- text, ``bytea`` and a composite's compared forms by Python's own hash of each value (64 bits, the
  same for equal values within one process: a verify hashes both sides in one); a decimal the view
  holds as text (an unconstrained ``numeric``) by the hash of its text without trailing zeros
  (``1.50`` as ``1.5``), the zeros cut by Arrow over the whole column;
- anything else, and a value no fixed-width form holds (``NaN``, ``-0``, an infinite or BC date, a
  decimal a view holds as text), by the hash of the text of its comparable form
  (:func:`~derived_views.runs.verify_values.normalize`), one value at a time.

A column Arrow cannot cast whole (a source text such as ``infinity`` among dates) is hashed one value at
a time, each in the same canonical form, so it hashes as the cast would have. A row's hash combines its
columns' in order; a key's, its key columns'. Hashes of values that differ are equal only by chance.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterable, Sequence
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from derived_views.runs.verify_values import EXACT, normalize

MASK = (1 << 64) - 1
#: The hash of a NULL of any kind (Python's hash of ``None``: what a value hashed by Python's hash gives for it).
NULL = hash(None) & MASK
_ROW_FACTOR = np.uint64(0x9E3779B97F4A7C15)
_HIGH_SALT = 0x632BE59BD9B4E019
_EPOCH = datetime(1970, 1, 1)
_EPOCH_UTC = datetime(1970, 1, 1, tzinfo=UTC)
_EPOCH_DAY = date(1970, 1, 1)
_MICROSECOND = timedelta(microseconds=1)
_INT_TYPES = frozenset({"int2", "int4", "int8", "oid"})
_PLAIN_TEXT = frozenset({"text", "varchar", "bpchar", "name", "citext", "uuid"})
#: The type a composite's column of compared forms has (:mod:`derived_views.runs.verify_composites`).
COMPARED = "compared"


class Kind(enum.Enum):
    """How a column's values are hashed (see the module docstring)."""

    INT = "int"
    FLOAT4 = "float4"
    FLOAT8 = "float8"
    DECIMAL = "decimal"
    DECIMAL_TEXT = "decimal_text"
    DATE = "date"
    TIMESTAMP = "timestamp"
    TIMESTAMPTZ = "timestamptz"
    BOOL = "bool"
    TEXT = "text"
    BYTES = "bytes"
    COMPARED = "compared"
    OTHER = "other"


#: The Arrow type each fixed-width kind is cast to (a decimal's comes from the view's column).
_ARROW: dict[Kind, pa.DataType] = {
    Kind.INT: pa.int64(),
    Kind.FLOAT4: pa.float64(),
    Kind.FLOAT8: pa.float64(),
    Kind.DATE: pa.date32(),
    Kind.TIMESTAMP: pa.timestamp("us"),
    Kind.TIMESTAMPTZ: pa.timestamp("us", tz="UTC"),
    Kind.BOOL: pa.bool_(),
}
_BY_TYPE = {"float4": Kind.FLOAT4, "float8": Kind.FLOAT8, "date": Kind.DATE, "timestamp": Kind.TIMESTAMP}
_BY_TYPE |= {"timestamptz": Kind.TIMESTAMPTZ, "bool": Kind.BOOL, "bytea": Kind.BYTES, COMPARED: Kind.COMPARED}


class Column:
    """One column's hashing: its source type, its :class:`Kind` and, for a decimal, the view's type."""

    def __init__(self, type_name: str, kind: Kind, decimal: pa.DataType | None = None) -> None:
        self.type_name = type_name
        self.kind = kind
        self.arrow = decimal if kind is Kind.DECIMAL else _ARROW.get(kind)

    @classmethod
    def of(cls, type_name: str, view_type: pa.DataType | None = None, *, thorough: bool = False) -> Column:
        """The hashing of a column of source type ``type_name`` whose view column has the Arrow type
        ``view_type`` (``None``: unknown); ``thorough``: every value in the text of its comparable form."""
        if thorough and type_name != COMPARED:
            return cls(type_name, Kind.OTHER)
        if type_name in _INT_TYPES:
            return cls(type_name, Kind.INT)
        if type_name in _PLAIN_TEXT:
            return cls(type_name, Kind.TEXT)
        if type_name == "numeric" and view_type is not None and pa.types.is_decimal(view_type):
            return cls(type_name, Kind.DECIMAL, pa.decimal128(view_type.precision, view_type.scale))
        if type_name == "numeric":
            return cls(type_name, Kind.DECIMAL_TEXT)
        return cls(type_name, _BY_TYPE.get(type_name, Kind.OTHER))

    def hashes(self, values: pa.Array | Sequence[Any]) -> np.ndarray:
        """The hash of each value (``uint64``), from an Arrow array or a sequence of Python values."""
        kind = self.kind
        if kind is Kind.BYTES:  # the source's bytes, or their base64 (copied_batches), as bytes
            listed = values.to_pylist() if isinstance(values, pa.Array) else values
            return _python_hashes([None if v is None else normalize(v, "bytea") for v in listed])
        if kind in (Kind.TEXT, Kind.COMPARED):
            return _python_hashes(values.to_pylist() if isinstance(values, pa.Array) else values)
        if kind is Kind.DECIMAL_TEXT:
            return _python_hashes(_decimal_texts(values))
        if kind is not Kind.OTHER:
            cast = self._cast(values)
            if cast is not None:
                return self._fixed(cast)
        return self._each(values.to_pylist() if isinstance(values, pa.Array) else values)

    def _cast(self, values: pa.Array | Sequence[Any]) -> pa.Array | None:
        """``values`` as an Arrow array of the kind's type, or ``None`` when Arrow cannot cast them all."""
        target = self.arrow
        assert target is not None
        try:
            if not isinstance(values, pa.Array):
                try:
                    return pa.array(values, type=target)
                except (pa.ArrowException, TypeError, ValueError):
                    values = pa.array(values, type=pa.string())
            if pa.types.is_timestamp(values.type) and pa.types.is_timestamp(target):
                return values.cast(pa.timestamp("us", values.type.tz)).cast(pa.int64()).cast(target)
            return values.cast(target)
        except (pa.ArrowException, TypeError, ValueError):
            return None

    def _fixed(self, array: pa.Array) -> np.ndarray:
        """The hashes of an array of the kind's Arrow type, column-wide."""
        valid = array.is_valid().to_numpy(zero_copy_only=False)
        special: list[tuple[np.ndarray, int]] = []
        if self.kind is Kind.DECIMAL:
            words = _decimal_words(array)
            hashed = _mix(words[:, 0] ^ _mix(words[:, 1] ^ np.uint64(_HIGH_SALT)))
        else:
            if self.kind in (Kind.FLOAT4, Kind.FLOAT8):
                numbers = pc.fill_null(array, 0.0).to_numpy(zero_copy_only=False)
                if self.kind is Kind.FLOAT4:  # as normalize rounds a real: to 32 bits, below its overflow
                    small = np.abs(numbers) < 3.5e38
                    numbers = np.where(small, np.where(small, numbers, 0).astype(np.float32).astype(np.float64), numbers)
                special = [
                    (np.isnan(numbers), _text_hash("NaN")),
                    ((numbers == 0) & np.signbit(numbers), _text_hash("-0")),
                ]
                payload = numbers.view(np.uint64)
            else:
                if pa.types.is_date32(array.type):
                    array = array.cast(pa.int32())
                payload = pc.fill_null(array.cast(pa.int64()), 0).to_numpy(zero_copy_only=False).view(np.uint64)
            hashed = _mix(payload)
        for where, value in special:
            hashed = np.where(where, np.uint64(value), hashed)
        return np.where(valid, hashed, np.uint64(NULL))

    def _each(self, values: Iterable[Any]) -> np.ndarray:
        """The hashes of ``values`` one at a time, each as :meth:`_fixed` hashes it when a fixed-width form
        holds it, else by the text of its comparable form."""
        return np.fromiter((self._one(value) for value in values), dtype=np.uint64)

    def _one(self, value: Any) -> int:
        if value is None:
            return NULL
        normalized = normalize(value, self.type_name)
        payload = None if self.kind is Kind.OTHER else _payload(self, normalized)
        if payload is None:
            return _text_hash(normalized)
        if self.kind is Kind.DECIMAL:
            low, high = payload & MASK, (payload >> 64) & MASK
            return _mix_int(low ^ _mix_int(high ^ _HIGH_SALT))
        return _mix_int(payload & MASK)


def _payload(column: Column, value: Any) -> int | None:
    """The fixed-width form of a normalized value (``None``: none holds it)."""
    kind = column.kind
    if kind is Kind.INT:
        return value if value.__class__ is int and -(1 << 63) <= value < 1 << 63 else None
    if kind is Kind.BOOL:
        return int(value) if value.__class__ is bool else None
    if kind in (Kind.FLOAT4, Kind.FLOAT8):
        return int(struct.unpack("<Q", struct.pack("<d", value))[0]) if isinstance(value, float) else None
    if kind is Kind.DATE:
        return (value - _EPOCH_DAY).days if value.__class__ is date else None
    if kind in (Kind.TIMESTAMP, Kind.TIMESTAMPTZ) and isinstance(value, datetime):
        aware = value.tzinfo is not None
        if aware != (kind is Kind.TIMESTAMPTZ):
            return None
        return (value - (_EPOCH_UTC if aware else _EPOCH)) // _MICROSECOND
    if kind is Kind.DECIMAL and isinstance(value, Decimal) and value.is_finite():
        assert isinstance(column.arrow, pa.Decimal128Type)
        unscaled = value.scaleb(column.arrow.scale, EXACT)
        if unscaled == unscaled.to_integral_value() and abs(unscaled) < 10**column.arrow.precision:
            return int(unscaled)
    return None


def _decimal_texts(values: pa.Array | Sequence[Any]) -> list[Any]:
    """Decimals (as text, or as :class:`~decimal.Decimal`) as their text without trailing zeros after the
    point: ``1.50`` and ``1.5`` alike, ``NaN`` as it is."""
    if isinstance(values, pa.Array) and not (pa.types.is_string(values.type) or pa.types.is_large_string(values.type)):
        values = values.to_pylist()
    if not isinstance(values, pa.Array):
        try:
            values = pa.array(values, type=pa.string())
        except (pa.ArrowException, TypeError, ValueError):
            return [None if v is None else _decimal_text(v) for v in values]
    cut = pc.replace_substring_regex(values, pattern=r"(\.[0-9]*?)0+$", replacement=r"\1")
    return pc.replace_substring_regex(cut, pattern=r"\.$", replacement="").to_pylist()  # type: ignore[no-any-return]


def _decimal_text(value: Any) -> str:
    """:func:`_decimal_texts` of one value."""
    text = format(value, "f") if isinstance(value, Decimal) else str(value)
    return text.rstrip("0").rstrip(".") if "." in text else text


def _decimal_words(array: pa.Array) -> np.ndarray:
    """The two 64-bit words (low, high) of each value of a ``decimal128`` array (zeros where NULL)."""
    data = array.buffers()[1]
    if data is None:
        return np.zeros((len(array), 2), dtype=np.uint64)
    words = np.frombuffer(data, dtype=np.uint64)[2 * array.offset : 2 * (array.offset + len(array))]
    return words.reshape(-1, 2)


def _text_hash(value: Any) -> int:
    """The hash of the text of a comparable form (a decimal without trailing zeros)."""
    if isinstance(value, Decimal) and value.is_finite():
        value = value.normalize(EXACT)
    return hash(repr(value)) & MASK


def _python_hashes(values: Sequence[Any]) -> np.ndarray:
    """Python's hash of each value (one that cannot be hashed, a list or a dict: of its text)."""
    try:
        return np.fromiter(map(hash, values), dtype=np.int64, count=len(values)).view(np.uint64)
    except TypeError:
        return np.fromiter((_hashable_hash(v) for v in values), dtype=np.int64, count=len(values)).view(np.uint64)


def _hashable_hash(value: Any) -> int:
    try:
        return hash(value)
    except TypeError:
        return hash(repr(value))


def _mix(values: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer over ``uint64`` values (wrapping arithmetic)."""
    x = values ^ (values >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _mix_int(value: int) -> int:
    """:func:`_mix` of one value."""
    x = value & MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def row_hashes(
    batch: pa.RecordBatch | Sequence[tuple[Any, ...]], columns: Sequence[Column], key: Sequence[int]
) -> tuple[np.ndarray, np.ndarray]:
    """The hash of each row of ``batch`` (its columns in ``columns``' order) and of its key (the columns
    at the positions ``key``), both ``uint64``."""
    size = batch.num_rows if isinstance(batch, pa.RecordBatch) else len(batch)
    if isinstance(batch, pa.RecordBatch):
        values: list[Any] = list(batch.columns)
    else:
        values = list(zip(*batch, strict=True)) if size else [() for _ in columns]
    hashed = [column.hashes(v) for column, v in zip(columns, values, strict=True)]
    row = np.zeros(size, dtype=np.uint64)
    for h in hashed:
        row = row * _ROW_FACTOR + h
    keys = np.zeros(size, dtype=np.uint64)
    for i in key:
        keys = keys * _ROW_FACTOR + hashed[i]
    return _mix(row), _mix(keys)


def buckets_of(key_hashes: np.ndarray, buckets: int) -> np.ndarray:
    """The bucket of each key hash, of ``buckets``."""
    return (key_hashes % np.uint64(buckets)).astype(np.intp)


def unmatched(left: np.ndarray, right: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Which rows of two sides (by their row hashes) have no counterpart: a row hash held more times on
    one side than the other marks every row holding it, on both sides."""
    values, counts = np.unique(left, return_counts=True)
    others, other_counts = np.unique(right, return_counts=True)
    common, at_left, at_right = np.intersect1d(values, others, assume_unique=True, return_indices=True)
    matched = common[counts[at_left] == other_counts[at_right]]
    return ~np.isin(left, matched), ~np.isin(right, matched)


def columns_of(
    types: Sequence[str], view_types: Sequence[pa.DataType | None] | None = None, keys: Iterable[int] = (), thorough: bool = False
) -> list[Column]:
    """The hashing of each column of a layout (``types``: source type names), given the view's Arrow
    types when known; ``thorough``: every column but the ``keys`` by the text of its comparable form."""
    key = set(keys)
    view = list(view_types) if view_types is not None else [None] * len(types)
    return [Column.of(t, v, thorough=thorough and i not in key) for i, (t, v) in enumerate(zip(types, view, strict=True))]
