"""A published table's column marks, and what two of them say about the rows the log holds.

:attr:`~cdc.capture.published_tables.PublishedTable.columns` records, per leaf relation, its column numbers,
file node, published columns' types and key (:class:`ColumnMark`, as
:meth:`cdc.capture.catalog.Catalog.published_tables` reads them). Comparing the marks the log's snapshot was
taken with to the marks now tells whether the table must be read again: its rows given values without
change events (:func:`columns_filled_since`), its events keyed by other columns (:func:`key_changed`); and
whether two reads of a table agree before it is snapshotted (:func:`steady`).
"""

from __future__ import annotations

from typing import NamedTuple

from cdc.capture.key_marks import key_columns
from cdc.capture.published_tables import PublishedTable


class ColumnMark(NamedTuple):
    """One leaf relation's column numbers and storage, as :meth:`~cdc.capture.catalog.Catalog.published_tables` reads them."""

    highest: int  #: highest column number, dropped columns included
    live: int  #: highest number of a published column (neither dropped nor an unpublished generated one)
    missing: int  #: highest number of a published column holding a stored default for older rows
    relfilenode: int  #: changes whenever the table is rewritten
    #: ``<attnum>:<type OID>:<typmod>:<name hash>:<xmin>`` of each published column, ``;``-separated
    types: str = ""
    #: the columns its events are keyed by (:mod:`cdc.capture.key_marks`; empty: marks written without it)
    key: str = ""

    def type_of(self) -> dict[str, str]:
        """Column number -> ``<type OID>:<typmod>``."""
        return {number: ":".join(rest[:2]) for number, *rest in (part.split(":") for part in self.types.split(";") if part)}

    def name_of(self) -> dict[str, str]:
        """Column number -> a hash of its name (empty when the marks do not hold names)."""
        return {number: rest[2] if len(rest) > 2 else "" for number, *rest in (p.split(":") for p in self.types.split(";") if p)}

    def altered_by(self) -> dict[str, str]:
        """Column number -> the transaction that last changed its ``pg_attribute`` row (empty when the
        marks do not hold it)."""
        return {number: rest[3] if len(rest) > 3 else "" for number, *rest in (p.split(":") for p in self.types.split(";") if p)}


def column_marks(columns: str) -> dict[int, ColumnMark]:
    """``PublishedTable.columns`` by leaf OID."""
    marks: dict[int, ColumnMark] = {}
    for part in filter(None, columns.split(",")):
        leaf, _, numbers = part.partition("=")
        fields = numbers.split("/")
        if len(fields) == 4:  # written before the marks held types: judged without them
            fields.append("")
        if len(fields) == 5:  # written before the marks held keys: judged without them
            fields.append("")
        if len(fields) != len(ColumnMark._fields):
            return {}  # marks of another form judge nothing (as an entry without marks)
        first, second, third, fourth = map(int, fields[:4])
        marks[int(leaf)] = ColumnMark(first, second, third, fourth, fields[4], fields[5])
    return marks


def steady(table: PublishedTable) -> tuple[object, ...]:
    """What two reads of ``table`` must agree on before it is snapshotted: all but the relfilenodes,
    which a ``TRUNCATE`` changes as often as it runs (a rewrite between the reads costs at most one
    snapshot more, never one less)."""
    marks = column_marks(table.columns)
    return (
        table.relid,
        table.log_name,
        table.membership,
        sorted((leaf, mark.highest, mark.live, mark.missing, mark.types, mark.key) for leaf, mark in marks.items()),
    )


def columns_filled_since(before: str, now: str, relid: int = 0) -> bool:
    """Whether a leaf's existing rows may have been given values without change events since ``before``
    that the log does not carry: a published column numbered above every column the leaf had then (so
    added since) exists while the leaf has been rewritten since (a volatile default, an identity, a
    domain with a constraint: the values are written with the rewrite, and stay when the default is
    dropped again).

    A column added since that holds a stored default for the older rows (``atthasmissing``: ``ADD COLUMN
    ... DEFAULT`` with a constant, no rewrite) is no reason when the leaf is the table itself (``relid``):
    the stream writes its value for those rows into the schema topic with the first event carrying the
    column (:mod:`cdc.capture.added_column_fills`), as it writes the column itself. A rewrite clears the stored
    default and writes it into every row, so a rewrite after the column was added (and before the stream
    carried it) is a reason, by the rule above; so is the first rewrite after the stream carried it (see
    below: capture cannot tell it from a type changed and back). The leaves of a table published via its
    partitioned root each hold their own stored default, which the root's schema record does not carry:
    such a column is a reason there.

    Also when a column the leaf had then holds another type and the leaf has been rewritten since
    (``ALTER COLUMN ... TYPE`` converted the stored values, with any ``USING`` expression); a type change
    that rewrites nothing (``varchar(10)`` to ``text``) leaves every value as it was. The type is compared
    with its typmod (``numeric(12,4)`` to ``numeric(12)`` rounds every value), and a column whose
    ``pg_attribute`` row was changed since counts as retyped too: types changed there and back between
    two looks (``numeric`` to ``numeric(12)`` to ``numeric``) end on the type they started from, yet the
    values were rounded on the way (a rename or ``SET NOT NULL`` in the same interval as a ``VACUUM FULL``
    then costs one read more, never one less). So does the first rewrite (``VACUUM FULL``, ``CLUSTER``) of
    a leaf with a column holding a stored default: the rewrite writes the value into every row and clears
    ``atthasmissing`` by updating the column's ``pg_attribute`` row, as a type changed and changed back
    does too, rounding the values on the way; from the catalog alone the two look the same. Such a rewrite
    reads and writes the whole table itself; it costs one read, after which no column holds a stored
    default. And when a column
    added since has the name of a column the leaf had then (dropped and added again: the log holds the
    dropped column's values under that name, the rows now hold the new column's).

    A column added without a default leaves the older rows null, and a default set on it later is for
    later rows: neither asks for anything. Nor does a rewrite with no column added and no type changed
    (``VACUUM FULL``, ``TRUNCATE``). A leaf absent from ``before`` is not judged here: attaching it
    changes the table's membership."""
    seen = column_marks(before)
    return any(
        leaf in seen
        and (
            (leaf != relid and mark.missing > seen[leaf].highest)
            or (mark.relfilenode != seen[leaf].relfilenode and (mark.live > seen[leaf].highest or _retyped(seen[leaf], mark)))
            or _name_reused(seen[leaf], mark)
        )
        for leaf, mark in column_marks(now).items()
    )


def key_changed(before: str, now: str) -> bool:
    """Whether a leaf in both marks keys its events by other columns now than in ``before`` (a new primary
    key, another replica identity index, a key column renamed: :mod:`cdc.capture.key_marks`); never for
    marks that do not hold keys."""
    seen = column_marks(before)
    return any(
        leaf in seen
        and (was := key_columns(seen[leaf].key, seen[leaf].name_of())) is not None
        and (key := key_columns(mark.key, mark.name_of())) is not None
        and was != key
        for leaf, mark in column_marks(now).items()
    )


def _name_reused(before: ColumnMark, now: ColumnMark) -> bool:
    """Whether a column added since ``before`` has the name of a column ``before`` had: a column dropped
    and added again under its name, whose old values the log holds under that name for every row."""
    old = {name for name in before.name_of().values() if name}
    return any(int(number) > before.highest and name in old for number, name in now.name_of().items() if name)


def _retyped(before: ColumnMark, now: ColumnMark) -> bool:
    """Whether a column numbered in both marks holds another type (OID or typmod) in ``now``, or had its
    ``pg_attribute`` row changed since ``before`` (see :func:`columns_filled_since`); never when
    ``before`` predates the types in the marks, and by type alone when it predates the transactions."""
    old, new = before.type_of(), now.type_of()
    if any(number in old and old[number] != kind for number, kind in new.items()):
        return True
    was, altered = before.altered_by(), now.altered_by()
    return any(was.get(number) and xmin and was[number] != xmin for number, xmin in altered.items())
