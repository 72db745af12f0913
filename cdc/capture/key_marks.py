"""The columns a table's events are keyed by, as a mark the catalog reads and the snapshot ledger keeps.

Every event of a table is keyed by its primary key when the old key the server sends holds it, else by
the columns of its replica identity (:meth:`cdc.capture.change_replayer.ChangeReplayer.shape_from_relation`).
``ALTER TABLE ... DROP CONSTRAINT ..., ADD PRIMARY KEY (b)`` or ``REPLICA IDENTITY USING INDEX`` on
another index changes those columns, and so the key of every later event of a row: the records the log
holds under the old keys would stay beside the new ones for ever (no later event names them). So a
table whose key columns differ from those of the ledger's record of its snapshot is not covered
(:meth:`cdc.capture.table_snapshots.SnapshotLedger.covers`): it is read again, with a tombstone for every
key its topic holds (:mod:`cdc.capture.snapshot_writer`), as for a changed column list. Renaming a key
column changes the keys' JSON too, and counts as a change.

The mark, per leaf relation: ``<replica identity><p><primary key's column numbers><i><replica identity
index's column numbers>``, numbers ``.``-separated in index order (``dp1i``: default identity, key on
column 1, no identity index).
"""

from __future__ import annotations

from collections.abc import Mapping

_INDEX_COLUMNS = (
    "coalesce((SELECT string_agg(k.attnum::text, '.' ORDER BY k.n) FROM pg_index i, "
    "unnest(i.indkey::int2[]) WITH ORDINALITY k(attnum, n) WHERE i.indrelid = l.relid AND i.{flag}), '')"
)
#: The key mark of the leaf relation ``l.relid``, as SQL.
KEY_MARK = (
    "(SELECT r.relreplident::text FROM pg_class r WHERE r.oid = l.relid) || 'p' || "
    + _INDEX_COLUMNS.format(flag="indisprimary")
    + " || 'i' || "
    + _INDEX_COLUMNS.format(flag="indisreplident")
)


def key_columns(mark: str, names: Mapping[str, str]) -> frozenset[str] | None:
    """The columns the events are keyed by (by ``names``: column number -> a hash of its name, the
    published columns), from a key ``mark``; ``None`` when there is no mark (written before marks held
    keys: nothing is judged). The primary key when the replica identity sends it (FULL, the default,
    or an index over it); else the identity index's columns; else none."""
    if not mark:
        return None
    identity, _, numbers = mark.partition("p")
    primary_text, _, index_text = numbers.partition("i")
    primary, index = primary_text.split(".") if primary_text else [], index_text.split(".") if index_text else []
    sent = {"d": primary, "i": index, "f": list(names)}.get(identity, [])
    key = primary if primary and (identity == "f" or set(primary) <= set(sent)) else [] if identity == "f" else sent
    return frozenset(names.get(number) or number for number in key)
