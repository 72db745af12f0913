"""Compare one source table with one view table in memory that does not grow with their size.

Both sides are read as streams of row batches: the source through a server-side cursor of the verify's
snapshot, the view through ``deltalake``'s query engine at one table version. A table of up to
:data:`HELD_ROWS` rows a side is held and compared at once. A larger one is compared by hash first:
each row falls in one of up to :data:`BUCKETS` buckets by its key, the same on both sides, and each
bucket keeps, per side, its row count and the sum of its rows' 64-bit hashes (no rows). Only the buckets
whose counts or sums differ are read again, from both sides, a few at a time (at most about
:data:`HELD_ROWS` rows a side held at once), and compared row by row. The memory held is the buckets'
figures and one batch of rows, whatever the table's size.

Hashes are taken of each value in a form that is the same on both sides for a value they hold alike
(integers and decimals as themselves or their text, floats and arrays in their comparable form,
:func:`~derived_views.views.verify_values.normalize`), so equal tables cost one read of each side; a
value one side holds in another form only makes its bucket read again (when many buckets differ, both
sides are first hashed again with every value in its comparable form, one more read of each). A row
that differs goes unseen only when its bucket's 64-bit sum is unchanged by chance.

Every difference names its key and its column, as a comparison of whole tables would: a key in one
side only, or a column whose values differ. Differences are listed by key, the first :data:`KEPT` of
them; past those, the buckets left are counted in one line.
"""

from __future__ import annotations

import collections
import decimal
import itertools
import math
import operator
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from derived_views.engine.delta_reads import open_table, stream_query
from derived_views.errors import MissingTableError
from derived_views.events.column_names import source_columns
from derived_views.views.source_relation import relation_sql
from derived_views.views.verify_values import NATIVE, normalize, quote_identifier, select_list

if TYPE_CHECKING:
    import psycopg

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
_FETCH = 10_000
_INT_TYPES = frozenset({"int2", "int4", "int8", "oid"})
_PLAIN_TEXT = frozenset({"text", "varchar", "bpchar", "name", "citext", "uuid"})
_NOT_PLAIN_TEXT = frozenset({"timetz", "inet", "cidr", "json", "jsonb"})
#: Types whose equal Python values may still differ once compared: ``0.0 == -0.0``.
_FLOATS = frozenset({"float4", "float8", "_float4", "_float8"})
#: Integers whose hash is their value (``hash(-1) == hash(-2)``, and hashes wrap at 2**61 - 1).
_SMALL = (1 << 61) - 1
#: Rounds no decimal (``Decimal.normalize`` rounds to its context's precision, 28 digits by default).
_EXACT = decimal.Context(prec=decimal.MAX_PREC, Emax=decimal.MAX_EMAX, Emin=decimal.MIN_EMIN)

Row = tuple[Any, ...]


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


def _int_form(value: Any, type_name: str) -> Any:
    """An integer column's value, hashed alike on both sides: a small non-negative integer as itself,
    anything else (a negative one, a large one, the text a view may hold) as the text of its comparable form."""
    if type(value) is not int:
        value = normalize(value, type_name)
    return value if type(value) is int and 0 <= value < _SMALL else repr(value)


def _text_form(value: Any, type_name: str) -> Any:
    return value if type(value) is str else normalize(value, type_name)


def _decimal_form(value: Any, type_name: str) -> str:
    """A decimal as the text of its value without trailing zeros (``1.50`` and ``1.5000`` alike: a view
    may store a decimal at another scale), every digit kept."""
    value = value if type(value) is Decimal else normalize(value, type_name)
    return str(value.normalize(_EXACT)) if isinstance(value, Decimal) else str(value)


def _text_array_form(value: Any, type_name: str) -> Any:
    """An array of text as a tuple of its elements (each hashed as the text it is); any other value (an
    array a view holds as its JSON text, a nested list) in its comparable form."""
    if value.__class__ is list and not any(element.__class__ is list for element in value):
        return tuple(value)
    return _compared_form(value, type_name)


def _compared_form(value: Any, type_name: str) -> str:
    return repr(normalize(value, type_name))


def _form(type_name: str, key: bool) -> Callable[[Any, str], Any] | None:
    """How a column's values are hashed (``None``: as they are, for a non-key column whose values both
    sides hold as the same Python values: a difference of form only makes a bucket read again). ``key``:
    in a form equal on both sides for values that compare equal (a key's buckets must agree)."""
    if type_name in _INT_TYPES:
        return _int_form
    if type_name == "numeric":
        return _decimal_form
    if type_name in _PLAIN_TEXT:
        return _text_form if key else None
    if type_name.lstrip("_") in _PLAIN_TEXT and not key:
        return _text_array_form
    if key or type_name.startswith("_") or type_name in _FLOATS or type_name in _NOT_PLAIN_TEXT - {"json", "jsonb"}:
        return _compared_form  # floats: 0.0 == -0.0; arrays: lists; timetz, inet: the server's text differs
    return None


#: How a column's values are put in their hashed form, inline in :func:`_row_form` (``v``: the value).
_INLINE: dict[Callable[[Any, str], Any], str] = {
    _int_form: "({v} if {v}.__class__ is int and 0 <= {v} < SMALL else {f}({v}, {t}))",
    _text_form: "({v} if {v}.__class__ is str else {f}({v}, {t}))",
    _decimal_form: "(str({v}.normalize(EXACT)) if {v}.__class__ is Decimal else {f}({v}, {t}))",
    _text_array_form: "(tuple({v}) if {v}.__class__ is list and not any(e.__class__ is list for e in {v}) else {f}({v}, {t}))",
    _compared_form: "{f}({v}, {t})",
}


def _row_form(layout: Layout, columns: Iterable[int], thorough: bool = False) -> Callable[[Row], Row]:
    """A function of a row giving the hashed form of its ``columns`` (:func:`_form`; ``thorough``: each in
    its comparable form, as a key's), in that order.

    Built as one expression (a call per value costs as much as reading it): each column's part is a
    fixed template of :data:`_INLINE` over ``r[<position>]``; names and types are arguments, never code."""
    parts, names = [], {"SMALL": _SMALL, "EXACT": _EXACT, "Decimal": Decimal}
    for i in columns:
        form = _form(layout.types[i], thorough or i in layout.key)
        if form is None:
            parts.append(f"r[{i}]")
            continue
        names[f"f{i}"], names[f"t{i}"] = form, layout.types[i]
        parts.append(_INLINE[form].format(v=f"r[{i}]", f=f"f{i}", t=f"t{i}"))
    return eval(f"lambda r: ({', '.join(parts)},)", names)  # type: ignore[no-any-return]  # noqa: S307 - see above


Batches = Callable[[], Iterable[list[Row]]]


def _summed(
    batches: Batches, layout: Layout, buckets: int, thorough: bool = False
) -> tuple[list[int], list[int], list[Row] | None]:
    """Per bucket the count and the hash sum of one side's rows (``thorough``: of their values in their
    comparable forms), and the rows themselves when no more than :data:`HELD_ROWS` (else ``None``). A
    row's bucket is the hash of its key's hashed form."""
    counts, sums = [0] * buckets, [0] * buckets
    held: list[Row] | None = []
    form = _row_form(layout, range(len(layout.names)), thorough)
    key = operator.itemgetter(*layout.key)
    for batch in batches():
        for row in batch:
            hashed = form(row)
            bucket = hash(key(hashed)) % buckets
            counts[bucket] += 1
            try:
                sums[bucket] += hash(hashed)
            except TypeError:  # a value Python cannot hash (a struct a view holds as a dict)
                sums[bucket] += hash(repr(hashed))
        if held is not None:
            held.extend(batch)
            if len(held) > HELD_ROWS:
                held = None
    return counts, sums, held


def _rows_in(batches: Batches, layout: Layout, buckets: int, chosen: set[int]) -> Iterator[Row]:
    """The rows of one side in the ``chosen`` buckets (of ``buckets``)."""
    form = _row_form(layout, layout.key)
    part = operator.itemgetter(*range(len(layout.key)))  # as _summed takes the key: one column alone
    return (row for batch in batches() for row in batch if hash(part(form(row))) % buckets in chosen)


def compare_table(label: str, layout: Layout, source: Batches, view: Batches, expected_rows: float, report: Report) -> int:
    """Compare the rows of ``source`` and ``view`` (each a function giving its batches of rows in
    :class:`Layout` order, the same rows each time), adding every difference to ``report``; returns how
    many source rows were compared. ``expected_rows`` (the larger side's row count, as far as known)
    sizes the buckets."""
    buckets = max(1024, min(BUCKETS, math.ceil(expected_rows / _ROWS_PER_BUCKET)))
    source_counts, source_sums, source_rows = _summed(source, layout, buckets)
    view_counts, view_sums, view_rows = _summed(view, layout, buckets)
    compared = sum(source_counts)
    if source_rows is not None and view_rows is not None:
        report.add(layout.differences(label, layout.by_key(label, source_rows), layout.by_key(label, view_rows, report)))
        return compared
    del source_rows, view_rows
    differing = [b for b in range(buckets) if source_counts[b] != view_counts[b] or source_sums[b] != view_sums[b]]
    if len(differing) > buckets // _SYSTEMATIC:
        # many buckets differ: maybe a column one side holds in another form (JSON text spelled
        # otherwise, say); hash both sides again with every value in its comparable form, so that only
        # the buckets that truly differ are read again (each such read is a read of both sides)
        source_sums = _summed(source, layout, buckets, thorough=True)[1]
        view_sums = _summed(view, layout, buckets, thorough=True)[1]
        differing = [b for b in range(buckets) if source_counts[b] != view_counts[b] or source_sums[b] != view_sums[b]]
    left = collections.deque(differing)
    while left and len(report.differences) < KEPT:
        # the next buckets, as many as hold no more than HELD_ROWS rows a side (one, if it holds more)
        chosen: set[int] = set()
        held = 0
        while left and (not chosen or held + max(source_counts[left[0]], view_counts[left[0]]) <= HELD_ROWS):
            bucket = left.popleft()
            chosen.add(bucket)
            held += max(source_counts[bucket], view_counts[bucket])
        source_keyed = layout.by_key(label, _rows_in(source, layout, buckets, chosen))
        report.add(layout.differences(label, source_keyed, layout.by_key(label, _rows_in(view, layout, buckets, chosen), report)))
    if left:
        rows = sum(source_counts[b] for b in left), sum(view_counts[b] for b in left)
        report.differences.append(
            f"{label}: {len(left)} more buckets of keys differ ({rows[0]} source rows, {rows[1]} view rows), not listed"
        )
    return compared


def source_batches(
    conn: psycopg.Connection,
    schema: TableSchema,
    row_filter: str | None = None,
    masks: Mapping[str, Callable[[str], str]] | None = None,
) -> Iterator[list[Row]]:
    """The rows of a source table in :class:`Layout` order, batch by batch through a server-side cursor
    (those ``row_filter``, the publication's row filter as the server prints it, passes), each masked
    column's value masked as capture masks it: the mask of the text the type's output function writes
    (:mod:`event_format.masks`)."""
    table = relation_sql(conn, schema.schema, schema.table)  # its own rows, not its children's
    where = f" WHERE ({row_filter})" if row_filter is not None else ""
    masked = [(i, masks[c.name]) for i, c in enumerate(schema.columns) if masks and c.name in masks]
    with conn.cursor(name="cdc_verify") as cursor:
        cursor.execute(f"SELECT {select_list(schema, masks or {})} FROM {table}{where}")  # noqa: S608 - quoted names
        while batch := cursor.fetchmany(_FETCH):
            if masked:
                batch = [_masked(row, masked) for row in batch]
            yield batch


def _masked(row: Row, masked: list[tuple[int, Callable[[str], str]]]) -> Row:
    values = list(row)
    for i, mask in masked:
        if values[i] is not None:
            values[i] = mask(values[i])
    return tuple(values)


@dataclass
class ViewTable:
    """A view table read for a comparison: the source names of its columns, its row count (from its
    Delta log), and its rows in a :class:`Layout`'s order (NULL for a column it does not hold)."""

    columns: frozenset[str]
    rows: int
    batches: Callable[[], Iterator[list[Row]]]
    """A new read of the rows, of the same table version each time."""
    holding_values: Callable[[list[str]], list[str]]
    """Those of the given columns (source names) that hold a value other than NULL in the rows read."""


def view_table(path: str, view: str, layout: Layout, names: Iterable[str] = (), where: str = "") -> ViewTable:
    """The Delta table at ``path`` (the rows matching the SQL ``where``), its columns stored for
    ``names`` known by those names.

    Read with ``deltalake``, not Spark: a second reader of the table's files, the one every view table
    promises to open, and one that answers a small table in milliseconds where a Spark read plans a job."""
    import pyarrow as pa
    from deltalake import DeltaTable

    if not DeltaTable.is_deltatable(path):
        raise MissingTableError(path, view)
    table = open_table(path)
    stored = [f.name for f in table.schema().fields]
    held = source_columns(names, stored)
    back = {column: name for name, column in held.items()}
    files = pa.table(table.get_add_actions(flatten=True))
    rows = sum(n or 0 for n in files.column("num_records").to_pylist()) if "num_records" in files.column_names else 0
    present = [name for name in layout.names if name in held]
    condition = f" WHERE {where}" if where else ""
    selected = ", ".join(quote_identifier(held[name]) for name in present) or "1"
    sql = f"SELECT {selected} FROM t{condition}"  # noqa: S608 - quoted names
    columns = frozenset(back.get(c, c) for c in stored)

    def holding_values(names: list[str]) -> list[str]:
        if not names:
            return []
        counts = ", ".join(f"count({quote_identifier(held.get(name, name))})" for name in names)
        found = stream_query(path, f"SELECT {counts} FROM t{condition}", table).read_all()  # noqa: S608 - quoted names
        return [name for i, name in enumerate(names) if found.column(i)[0].as_py()]

    return ViewTable(columns, rows, lambda: _aligned(stream_query(path, sql, table), layout, present), holding_values)


def _aligned(reader: Iterable[Any], layout: Layout, present: list[str]) -> Iterator[list[Row]]:
    position = {name: i for i, name in enumerate(present)}
    for batch in reader:
        if not batch.num_rows:
            continue
        if not present:
            yield [(None,) * len(layout.names)] * batch.num_rows
            continue
        columns = [batch.column(i).to_pylist() for i in range(len(present))]
        missing = itertools.repeat(None)
        yield list(zip(*(columns[position[n]] if n in position else missing for n in layout.names), strict=False))
