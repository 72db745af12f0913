"""Compare one source table with one view table in memory that does not grow with their size.

Both sides are read as streams of row batches: the source through a server-side cursor of the verify's
snapshot (rows of Python values), the view through ``deltalake``'s query engine at one table version
(Arrow record batches, turned into Python values only for the rows compared one by one). A table of up to
:data:`HELD_ROWS` rows a side is held and compared at once. A larger one is compared by hash first:
each row falls in one of up to :data:`BUCKETS` buckets by its key, the same on both sides, and each
bucket keeps, per side, its row count and the sum of its rows' 64-bit hashes (no rows). Only the buckets
whose counts or sums differ are read again, from both sides, a few at a time (at most about
:data:`HELD_ROWS` rows a side held at once), and compared row by row. The memory held is the buckets'
figures and one batch of rows, whatever the table's size.

Hashes are taken a batch at a time, each column at once, of each value in a form that is the same on
both sides for a value they hold alike (:mod:`derived_views.runs.verify_hashes`), so equal tables cost
one read of each side; a value one side holds in a form its hash does not bring to the other's only
makes its bucket read again (when many buckets differ, both sides are first hashed again with every
value in its comparable form, :func:`~derived_views.runs.verify_values.normalize`, one more read of
each). Rows of a held table or of a bucket read again whose hashes match a row of the other side are not
compared again. A row that differs goes unseen only when its 64-bit hash, or its bucket's sum, is
unchanged by chance.

Every difference names its key and its column, as a comparison of whole tables would: a key in one
side only, or a column whose values differ. Differences are listed by key, the first :data:`KEPT` of
them; past those, the buckets left are counted in one line.

This module compares; reading each side as batches (the source through a cursor or ``COPY``, the view
with ``deltalake``) is :mod:`derived_views.runs.verify_reads`.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import pyarrow as pa

from derived_views.runs.verify_hashes import Column, buckets_of, columns_of, row_hashes, unmatched
from derived_views.runs.verify_values import NATIVE, normalize

if TYPE_CHECKING:
    from derived_views.events.schema import TableSchema

#: Rows of one side held at once: a table no larger is compared at once, a larger one by hash.
HELD_ROWS = 100_000
#: The most buckets a table's rows are hashed into (a larger table has larger buckets).
BUCKETS = 1 << 16
#: Difference lines kept in a report; the others are counted.
KEPT = 1_000
_ROWS_PER_BUCKET = 256
#: More than one bucket in this many differing: compared again by each value's comparable form.
_SYSTEMATIC = 8
_INT_TYPES = frozenset({"int2", "int4", "int8", "oid"})
_NOT_PLAIN_TEXT = frozenset({"timetz", "inet", "cidr", "json", "jsonb"})
#: Types whose equal Python values may still differ once compared: ``0.0 == -0.0``.
_FLOATS = frozenset({"float4", "float8", "_float4", "_float8"})

Row = tuple[Any, ...]
_T = TypeVar("_T")


@dataclass
class Report:
    """Differences found by one verification (the first :data:`KEPT` lines; :attr:`count` counts all)."""

    view: str
    compared: int = 0
    differences: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """What was not compared, and why (a table no longer in the source)."""
    more: int = 0
    """Differences found beyond those in :attr:`differences`."""

    @property
    def ok(self) -> bool:
        """True when the view equals the source."""
        return not self.differences

    @property
    def count(self) -> int:
        """How many differences were found (past :data:`KEPT`, the buckets not read again as one)."""
        return len(self.differences) + self.more

    def add(self, lines: Iterable[str]) -> None:
        """Record differences, keeping the first :data:`KEPT` lines."""
        for line in lines:
            if len(self.differences) < KEPT:
                self.differences.append(line)
            else:
                self.more += 1


@dataclass(frozen=True)
class Layout:
    """The columns of a table compared, in the order both sides' rows hold them."""

    names: tuple[str, ...]
    types: tuple[str, ...]
    key: tuple[int, ...]
    #: whether the table has key columns (a keyless table's key is every column: twins are rows alike)
    keyed: bool = True

    @classmethod
    def of(cls, schema: TableSchema) -> Layout:
        """The columns of ``schema``; the key is its key columns, or every column of a keyless table."""
        names = tuple(c.name for c in schema.columns)
        keyed = [i for i, c in enumerate(schema.columns) if c.key]
        return cls(names, tuple(c.type_name for c in schema.columns), tuple(keyed or range(len(names))), bool(keyed))

    def by_key(self, label: str, rows: Iterable[Row], report: Report | None = None) -> dict[tuple[str, ...], Row]:
        """``rows`` (the view's, with ``report``) by key; with ``report``, a line for each key of a keyed
        table held more than once (rows left under an earlier key of the table hold the same key values now)."""
        key = self.key_function()
        out: dict[tuple[str, ...], Row] = {}
        twice: collections.Counter[tuple[str, ...]] = collections.Counter()
        for row in rows:
            k = key(row)
            if k in out:
                twice[k] += 1
            out[k] = row
        if report is not None and self.keyed:
            report.add(f"{label}: key {k} is in the view {n + 1} times" for k, n in sorted(twice.items()))
        return out

    def key_function(self) -> Callable[[Row], tuple[str, ...]]:
        """The key of a row of either side: each key value's ``repr`` in its comparable form (an integer
        or a plain text value is its own comparable form, and skips :func:`normalize`)."""
        parts: list[tuple[int, str, type | None]] = []
        for i in self.key:
            type_name = self.types[i]
            plain: type | None = None
            if type_name in _INT_TYPES:
                plain = int
            elif not type_name.startswith("_") and type_name not in NATIVE and type_name not in _NOT_PLAIN_TEXT:
                plain = str
            parts.append((i, type_name, plain))

        def key(row: Row) -> tuple[str, ...]:
            return tuple(
                repr(value) if type(value := row[i]) is plain else repr(normalize(value, type_name))
                for i, type_name, plain in parts
            )

        return key

    def differences(self, label: str, source: Mapping[tuple[str, ...], Row], view: Mapping[tuple[str, ...], Row]) -> list[str]:
        """One line per key on one side only, and per column whose values differ, sorted by key.

        Rows whose values are equal in Python are equal once normalized (each column's values are of one
        Python type on both sides), except for floats (``0.0 == -0.0``): those columns are always compared."""
        out = [f"{label}: key {key} is in the source but not in the view" for key in sorted(source.keys() - view.keys())]
        out += [f"{label}: key {key} is in the view but not in the source" for key in sorted(view.keys() - source.keys())]
        every = range(len(self.names))
        floats = [i for i in every if self.types[i] in _FLOATS]
        changed: list[tuple[tuple[str, ...], list[str]]] = []
        for key, left in source.items():
            right = view.get(key)
            if right is None:
                continue
            lines = []
            for i in every if left != right else floats:
                a, b = normalize(left[i], self.types[i]), normalize(right[i], self.types[i])
                if a != b:
                    lines.append(f"{label}: key {key} column {self.names[i]}: source {a!r} != view {b!r}")
            if lines:
                changed.append((key, lines))
        for _, lines in sorted(changed):
            out += lines
        return out


Batches = Callable[[], Iterable[Any]]
"""A new read of one side: its batches, each a list of rows or an Arrow record batch (columns in
:class:`Layout` order)."""


@dataclass
class _Side:
    """One side's figures per bucket, and its batches (with their row and key hashes) while it holds no
    more than :data:`HELD_ROWS` rows."""

    counts: np.ndarray
    sums: np.ndarray
    held: list[tuple[Any, np.ndarray, np.ndarray]] | None


def _size(batch: Any) -> int:
    return batch.num_rows if isinstance(batch, pa.RecordBatch) else len(batch)


def batch_rows(batch: Any, taken: np.ndarray | None = None) -> list[Row]:
    """The rows of a batch (those at the positions ``taken``) as tuples."""
    if isinstance(batch, pa.RecordBatch):
        columns = [_taken(column, taken) for column in batch.columns]
        return list(zip(*columns, strict=True))
    return batch if taken is None else [batch[i] for i in taken]


def _taken(column: pa.Array, taken: np.ndarray | None) -> list[Any]:
    """The values of ``column`` (those at the positions ``taken``) as Python values."""
    if taken is None:
        return column.to_pylist()  # type: ignore[no-any-return]
    try:
        return column.take(pa.array(taken)).to_pylist()  # type: ignore[no-any-return]
    except pa.ArrowNotImplementedError:  # no take of its type (a string view, as deltalake reads text)
        values = column.to_pylist()
        return [values[i] for i in taken]


def _summed(batches: Batches, columns: list[Column], key: tuple[int, ...], buckets: int, hold: bool = True) -> _Side:
    """Per bucket the count and the sum of the row hashes of one side's rows (a row's bucket is its key's
    hash), and its batches when no more than :data:`HELD_ROWS` rows (``hold``)."""
    counts = np.zeros(buckets, dtype=np.int64)
    sums = np.zeros(buckets, dtype=np.uint64)
    held: list[tuple[Any, np.ndarray, np.ndarray]] | None = [] if hold else None
    rows = 0
    for batch in batches():
        if not _size(batch):
            continue
        row, keys = row_hashes(batch, columns, key)
        bucket = buckets_of(keys, buckets)
        counts += np.bincount(bucket, minlength=buckets)
        np.add.at(sums, bucket, row)
        rows += len(row)
        if held is not None and rows > HELD_ROWS:
            held = None
        elif held is not None:
            held.append((batch, row, keys))
    return _Side(counts, sums, held)


def _rows_in(
    batches: Batches, columns: list[Column], key: tuple[int, ...], buckets: int, chosen: set[int]
) -> list[tuple[Any, np.ndarray, np.ndarray]]:
    """The rows of one side in the ``chosen`` buckets (of ``buckets``), with their row and key hashes."""
    wanted = np.fromiter(chosen, dtype=np.intp)
    out = []
    for batch in batches():
        if not _size(batch):
            continue
        row, keys = row_hashes(batch, columns, key)
        taken = np.nonzero(np.isin(buckets_of(keys, buckets), wanted))[0]
        if len(taken):
            out.append((batch_rows(batch, taken), row[taken], keys[taken]))
    return out


def _compare_rows(
    label: str,
    layout: Layout,
    source: list[tuple[Any, np.ndarray, np.ndarray]],
    view: list[tuple[Any, np.ndarray, np.ndarray]],
    report: Report,
) -> None:
    """Compare row by row the rows of both sides that hold a key some row of either side has no equal
    of (by row hash): a key whose rows are alike on both sides is not compared again."""
    sides = []
    for parts in (source, view):
        rows = [row for batch, _, _ in parts for row in batch_rows(batch)]
        empty = np.zeros(0, dtype=np.uint64)
        hashes = np.concatenate([h for _, h, _ in parts]) if parts else empty
        keys = np.concatenate([k for _, _, k in parts]) if parts else empty
        sides.append((rows, hashes, keys))
    (left_rows, left_hashes, left_keys), (right_rows, right_hashes, right_keys) = sides
    left_odd, right_odd = unmatched(left_hashes, right_hashes)
    odd_keys = np.union1d(left_keys[left_odd], right_keys[right_odd])
    if not len(odd_keys):
        return
    left = [left_rows[i] for i in np.nonzero(np.isin(left_keys, odd_keys))[0]]
    right = [right_rows[i] for i in np.nonzero(np.isin(right_keys, odd_keys))[0]]
    report.add(layout.differences(label, layout.by_key(label, left), layout.by_key(label, right, report)))


def _both(read: Callable[[Batches], _T], source: Batches, view: Batches) -> tuple[_T, _T]:
    """``read`` of both sides at once: the view's in a thread of its own while the source's runs here, so
    the server producing the source's rows, ``deltalake`` scanning the view's and the hashing of each
    overlap."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="cdc-verify-view") as pool:
        theirs = pool.submit(read, view)
        ours = read(source)
        return ours, theirs.result()


def compare_table(
    label: str,
    layout: Layout,
    source: Batches,
    view: Batches,
    expected_rows: float,
    report: Report,
    view_types: Sequence[Any] | None = None,
    hashed_source: Batches | None = None,
) -> int:
    """Compare the rows of ``source`` and ``view`` (each a function giving its batches of rows in
    :class:`Layout` order, the same rows each time), adding every difference to ``report``; returns how
    many source rows were compared. ``expected_rows`` (the larger side's row count, as far as known)
    sizes the buckets; ``view_types``: the view's Arrow type of each column (``None``: unknown), which
    sets how a decimal is hashed (:mod:`derived_views.runs.verify_hashes`); ``hashed_source``: a faster
    read of the source's rows whose hashes are those of ``source``'s
    (:func:`~derived_views.runs.verify_reads.copied_batches`), for the
    reads that only hash them (the table is then compared by hash, not at once)."""
    buckets = max(1024, min(BUCKETS, math.ceil(expected_rows / _ROWS_PER_BUCKET)))
    columns = columns_of(layout.types, view_types)
    hashed = hashed_source or source
    hold = hashed_source is None
    source_side, view_side = _both(lambda side: _summed(side, columns, layout.key, buckets, hold), hashed, view)
    compared = int(source_side.counts.sum())
    if source_side.held is not None and view_side.held is not None:
        _compare_rows(label, layout, source_side.held, view_side.held, report)
        return compared
    counts = (source_side.counts, view_side.counts)
    differing = np.nonzero((counts[0] != counts[1]) | (source_side.sums != view_side.sums))[0]
    del source_side, view_side
    if len(differing) > buckets // _SYSTEMATIC:
        # many buckets differ: maybe a column one side holds in a form its hash does not bring to the
        # other's; hash both sides again with every value by its comparable form, so that only the
        # buckets that truly differ are read again (each such read is a read of both sides)
        columns = columns_of(layout.types, view_types, layout.key, thorough=True)
        sums = [side.sums for side in _both(lambda side: _summed(side, columns, layout.key, buckets, hold=False), hashed, view)]
        differing = np.nonzero((counts[0] != counts[1]) | (sums[0] != sums[1]))[0]
    left = collections.deque(int(b) for b in differing)
    while left and len(report.differences) < KEPT:
        # the next buckets, as many as hold no more than HELD_ROWS rows a side (one, if it holds more)
        chosen: set[int] = set()
        held = 0
        while left and (not chosen or held + max(counts[0][left[0]], counts[1][left[0]]) <= HELD_ROWS):
            bucket = left.popleft()
            chosen.add(bucket)
            held += max(counts[0][bucket], counts[1][bucket])
        rows = _both(lambda side: _rows_in(side, columns, layout.key, buckets, chosen), source, view)  # noqa: B023 - called here
        _compare_rows(label, layout, rows[0], rows[1], report)
    if left:
        rows_left = sum(int(counts[0][b]) for b in left), sum(int(counts[1][b]) for b in left)
        report.differences.append(
            f"{label}: {len(left)} more buckets of keys differ ({rows_left[0]} source rows, {rows_left[1]} view rows), not listed"
        )
    return compared
