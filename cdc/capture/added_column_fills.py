"""The value a column added with a constant default holds in the rows that predate it, for the schema topic.

Since PostgreSQL 11, ``ALTER TABLE t ADD COLUMN c ... DEFAULT <constant>`` (a default that is not
volatile: a literal, or a stable expression evaluated once) stores the value once in
``pg_attribute.attmissingval`` (``atthasmissing``) and writes no row: every row that predates the column
holds that value from then on, and logical decoding sends no change for any of them. Instead of reading
the table again, capture writes that fact into the column's entry in the table's schema record
(docs/event-format.md, "Schema topic"): ``"filled": {"value": v, "lsn": P, "sequence": S}`` means *every
row whose last event is before (P, S) holds c = v*; rows with an event at or after it carry c in their
events. ``v`` is encoded as the column's values are in change events (the column's own converter,
:mod:`cdc.capture.values`, or its mask's, :mod:`event_format.masks`: a masked column's fact holds the
masked value); a column the publication does not publish is in no shape, so it gets no fact.

**Why (P, S) is exact.** It is the position of the first event written with the new column: the
schema record that announces the column holds from there (:meth:`~cdc.capture.tables.TableShape.schema_value`).
``ADD COLUMN`` takes an ``ACCESS EXCLUSIVE`` lock, so every transaction that wrote the table before it
committed before the ``ALTER`` did, and every change after it (in a later transaction, or later in the
``ALTER``'s own) is decoded with the new column. So every event before (P, S) was written without the
column, from a row version that predates it: that row holds v now. Every event at or after (P, S) was
written with it and carries the row's value. Any position between the ``ALTER``'s commit and the first
event carrying the column splits the events the same way, since no event of the table lies in between;
capture takes the latter because it is the first moment the stream shows the column.

Which columns get a fact: those of a new shape numbered above every column of the table's previous
schema record (added since; a column that a changed column list newly publishes is older, and its
rows were written with their own values: the changed rule reads the table again), that hold a stored
default now. ``atthasmissing`` still set means the table has not been rewritten since the column was
added: a rewrite (a volatile default, an identity, a domain with a constraint, ``ALTER COLUMN TYPE``,
``VACUUM FULL``, ``CLUSTER``) writes the value into every row and clears it. Such a column gets no fact
here, and :func:`cdc.capture.column_marks.columns_filled_since` reads the table again instead.

The catalog is read when the stream reaches the column, so it may be ahead of the stream. The
stored value cannot change without a rewrite that clears it; a column dropped and added again under its
name between the two gives the newer value here, and its own fact later, which holds from a later
position and so rules for every row again (:func:`cdc.capture.column_marks.columns_filled_since` reads the table
again when it sees the name reused).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

from cdc.capture.tables import TableShape

if TYPE_CHECKING:
    from cdc.capture.catalog import Catalog


def added_columns(shape: TableShape, previous: bytes | None) -> list[int]:
    """Indexes of ``shape``'s columns numbered above every column of the ``previous`` schema record (none
    without a previous record: a table's first record comes with its snapshot, whose rows hold every value)."""
    if previous is None:
        return []
    columns = orjson.loads(previous).get("columns", [])
    highest = max((int(column.get("attnum", 0)) for column in columns), default=0)
    if highest == 0:
        return []
    return [index for index, column in enumerate(shape.columns) if column.attnum > highest]


def filled_values(catalog: Catalog, shape: TableShape, previous: bytes | None) -> dict[str, Any]:
    """Column name -> the value (as change events encode it) that the rows predating the column hold,
    for each column of ``shape`` added since ``previous`` that holds a stored default."""
    added = added_columns(shape, previous)
    if not added:
        return {}
    stored = catalog.stored_defaults(shape.relid)
    values: dict[str, Any] = {}
    for index in added:
        column = shape.columns[index]
        if column.attnum in stored:
            text = stored[column.attnum]
            values[column.name] = None if text is None else shape.converters[index](text)
    return values
