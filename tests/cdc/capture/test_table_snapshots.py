"""cdc.capture.table_snapshots: the ledger and the gate of tables snapshotted while capture streams."""

from __future__ import annotations

import orjson

from cdc.capture.published_tables import PublishedTable
from cdc.capture.table_snapshots import SnapshotLedger, TableGate
from cdc.capture.tables import TableShape
from tests.cdc.wire import sample_shape


def test_gate_admits_a_table_only_after_its_snapshot() -> None:
    ledger = SnapshotLedger("cdc.__snapshots")
    gate = TableGate(ledger)
    shape = sample_shape()  # OID 1, public.t
    assert not gate.admits(shape, 500) and gate.wanted == {1: "public.t"}
    gate.wanted.clear()
    gate.holds[1] = 1000  # a snapshot at consistent point 1000 waits to be written
    assert not gate.admits(shape, 992) and gate.admits(shape, 1000) and not gate.wanted
    record = ledger.record(shape, 999, 42, 0)
    assert orjson.loads(record.key or b"") == "public.t"
    assert orjson.loads(record.value or b"") == {
        "schema": "public",
        "table": "t",
        "topic": "cdc.public.t",
        "relid": 1,
        "lsn": 999,
        "rows": 42,
    }
    ledger.add([shape], 999)
    gate.holds.clear()
    assert gate.admits(shape, 10)
    recreated = TableShape.build(2, "public", "t", "cdc.public.t", [("id", 20, -1)], ["id"])
    assert not gate.admits(recreated, 2000) and gate.wanted == {2: "public.t"}


def test_a_column_added_with_values_for_existing_rows_uncovers_the_table() -> None:
    """A column numbered above the snapshot's highest that holds a stored default for older rows, or that
    came with a rewrite, asks for a new snapshot; marks are per leaf relation:
    ``<oid>=<highest>/<highest published>/<highest with a stored default>/<relfilenode>/<types>``."""
    ledger = SnapshotLedger("cdc.__snapshots")

    def _marks(*leaves: tuple[object, ...]) -> str:
        """Marks of leaves ``(oid, highest, live, missing, relfilenode[, types])``; types default to int4
        columns 1..live."""
        out = []
        for oid, highest, live, missing, relfilenode, *types in leaves:
            kinds = types[0] if types else ";".join(f"{n}:23:-1" for n in range(1, int(live) + 1))  # type: ignore[call-overload]
            out.append(f"{oid}={highest}/{live}/{missing}/{relfilenode}/{kinds}")
        return ",".join(out)

    shape = sample_shape()  # OID 1, public.t
    seen = PublishedTable(1, "public", "t", "e:", _marks((1, 2, 2, 1, 900), (2, 3, 3, 0, 901)))  # two leaves
    record = ledger.record(shape, 999, 42, 0, seen)
    assert orjson.loads(record.value or b"")["columns"] == seen.columns
    ledger.add([shape], 999, {1: seen})

    def covers(columns: str) -> bool:
        return ledger.covers("public.t", 1, "e:", columns)

    assert covers(_marks((1, 2, 2, 1, 900), (2, 3, 3, 0, 901)))
    assert covers(_marks((1, 3, 3, 1, 900), (2, 3, 3, 0, 901)))  # ADD COLUMN without a default: existing rows hold null
    assert covers(_marks((1, 2, 2, 1, 905), (2, 3, 3, 0, 901)))  # VACUUM FULL: rewritten, but no column added
    assert covers(_marks((1, 3, 2, 1, 905), (2, 3, 3, 0, 901)))  # a column added and dropped again, then a rewrite
    # ADD COLUMN ... DEFAULT on the table itself: a stored default for older rows, which the stream carries
    # into the schema record with the column's first event (cdc.capture.added_column_fills)
    assert covers(_marks((1, 3, 3, 3, 900), (2, 3, 3, 0, 901)))
    assert not covers(_marks((1, 3, 3, 1, 905), (2, 3, 3, 0, 901)))  # ... volatile, or an identity: the table was rewritten
    # a leaf below a partitioned root holds its own stored default, which no schema record carries
    assert not covers(_marks((1, 2, 2, 1, 900), (2, 4, 4, 4, 901)))
    assert covers(_marks((1, 2, 2, 1, 900), (2, 3, 3, 0, 901), (3, 9, 9, 9, 950)))  # a new leaf is the membership's to judge
    assert ledger.covers("public.t", 1, None, None)  # the stream's question
    # a covered table's marks move on: a column added without a default is not judged again after a rewrite
    ledger.note_columns("public.t", _marks((1, 3, 3, 1, 900), (2, 3, 3, 0, 901)))
    assert covers(_marks((1, 3, 3, 1, 905), (2, 3, 3, 0, 901)))
    # ALTER COLUMN ... TYPE rewrote the stored values (column 2 of leaf 1 is int8 now)
    assert not covers(_marks((1, 2, 2, 1, 906, "1:23:-1;2:20:-1"), (2, 3, 3, 0, 901)))
    # ... a type change that rewrites nothing keeps every value (varchar(10) to varchar(20))
    assert covers(_marks((1, 2, 2, 1, 900, "1:23:-1;2:1043:24"), (2, 3, 3, 0, 901)))
    # a column dropped and added again under its name (the hash of "n" on a new number)
    ledger.note_columns("public.t", _marks((1, 2, 2, 1, 900, "1:23:-1:aa;2:23:-1:bb"), (2, 3, 3, 0, 901)))
    assert not covers(_marks((1, 3, 3, 1, 900, "1:23:-1:aa;3:25:-1:bb"), (2, 3, 3, 0, 901)))
    assert covers(_marks((1, 3, 3, 1, 900, "1:23:-1:aa;3:25:-1:cc"), (2, 3, 3, 0, 901)))  # another name
    # marks written before they held types still judge added columns (and no type change)
    ledger.note_columns("public.t", "1=2/2/1/900,2=3/3/0/901")
    assert not covers(_marks((1, 3, 3, 1, 905), (2, 3, 3, 0, 901)))
    assert covers(_marks((1, 2, 2, 1, 906, "1:23:-1;2:20:-1"), (2, 3, 3, 0, 901)))
    ledger.add([shape], 999)  # an entry from before the log kept column marks: not judged by them
    assert covers(_marks((1, 4, 4, 4, 999), (2, 3, 3, 0, 901)))
    ledger.note_columns("public.t", _marks((1, 4, 4, 4, 999), (2, 3, 3, 0, 901)))  # ... until it is given the marks of now
    assert not covers(_marks((1, 5, 5, 5, 999), (2, 4, 4, 4, 901)))


def test_a_column_altered_and_rewritten_since_uncovers_the_table_even_on_its_old_type() -> None:
    """Marks hold, per column, the transaction that last changed its ``pg_attribute`` row: a column
    altered since (``numeric`` -> ``numeric(12)`` -> ``numeric``, its type the same again) on a leaf
    rewritten since had its values converted; without a rewrite nothing changed."""
    ledger = SnapshotLedger("cdc.__snapshots")
    shape = sample_shape()
    before = "1=2/2/0/900/1:23:-1:aa:700;2:1700:-1:bb:701"
    ledger.add([shape], 999, {1: PublishedTable(1, "public", "t", "e:", before)})

    def covers(columns: str) -> bool:
        return ledger.covers("public.t", 1, "e:", columns)

    assert covers(before)
    assert not covers("1=2/2/0/905/1:23:-1:aa:700;2:1700:-1:bb:812")  # altered, and the leaf rewritten
    assert covers("1=2/2/0/900/1:23:-1:aa:700;2:1700:-1:bb:812")  # altered, nothing rewritten (SET NOT NULL)
    assert covers("1=2/2/0/905/1:23:-1:aa:700;2:1700:-1:bb:701")  # rewritten alone (VACUUM FULL)
    assert not covers("1=2/2/0/905/1:23:-1:aa:700;2:1700:786436:bb:812")  # a typmod of its own (numeric(12))
    # marks written before they held transactions judge by type alone
    ledger.note_columns("public.t", "1=2/2/0/900/1:23:-1:aa;2:1700:-1:bb")
    assert covers("1=2/2/0/905/1:23:-1:aa:700;2:1700:-1:bb:812")
