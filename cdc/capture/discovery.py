"""Which published tables capture must snapshot, and whether the capture role may read them.

A table joins the log through a snapshot (:mod:`cdc.capture.table_snapshots`) when the publication covers it,
``CDC_TABLES`` includes it, the ledger does not cover it (see :meth:`SnapshotLedger.covers`: also a
table added back, whose partitions changed or that was given a column its existing rows hold values
in), and no snapshot of it already waits for the stream. A table the ledger covers is read again in
part when ``cdc snapshot --where`` asks for it (:mod:`cdc.capture.reads.partial_reads`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping

from cdc.capture.catalog import Catalog
from cdc.capture.column_marks import steady
from cdc.capture.errors import PrivilegeError, SourceError
from cdc.capture.lsn import Lsn
from cdc.capture.published_tables import PublishedTable
from cdc.capture.table_snapshots import PartialRead, PendingSnapshot, SnapshotLedger, TableGate, take_snapshot
from cdc.capture.visibility import ReceivedXids

log = logging.getLogger("cdc.capture")


def captured_tables(catalog: Catalog, publication: str, include: Callable[[str, str], bool]) -> list[PublishedTable]:
    """The published tables ``include`` takes, for the initial snapshot, once the role may read each."""
    tables = catalog.published_tables(publication)
    if not tables:
        raise SourceError(f"publication {publication} does not exist or publishes no table; run `cdc setup`")
    tables = [t for t in tables if include(t.schema, t.table)]
    require_readable(catalog, tables, publication)
    return tables


def tables_to_snapshot(
    catalog: Catalog,
    publication: str,
    include: Callable[[str, str], bool],
    ledger: SnapshotLedger,
    gate: TableGate,
    resuming: Collection[int] = (),
    partial: Collection[str] = (),
    read_in_part: Collection[str] = (),
) -> list[PublishedTable]:
    """The published, included tables that need a snapshot now (``partial``: log names of tables the
    ledger covers to read in part; ``read_in_part``: those with a partial read under way or waiting, whose
    whole read, when one is due, waits for it to end: a table has one holding file); clears
    ``gate.wanted`` (a wanted table no longer published is no longer captured).

    The publication is read twice: a table whose publication entry or columns change while they are
    read (its listing and its entry rows are read with different catalog snapshots) waits for the next
    discovery rather than recording a state it was never in.
    """
    tables: list[PublishedTable] = []
    for table in catalog.published_tables(publication):
        if not include(table.schema, table.table) or table.log_name in ledger.cancelled:
            continue
        if ledger.covers(table.log_name, table.relid, table.membership, table.columns):
            ledger.note_columns(table.log_name, table.columns)
            if table.log_name in partial:
                tables.append(table)
        elif table.log_name in read_in_part:
            continue
        elif table.relid not in gate.holds or table.relid in resuming:
            tables.append(table)
    gate.wanted.clear()
    if not tables:
        return tables
    again = {t.relid: steady(t) for t in catalog.published_tables(publication)}
    unsteady = [t for t in tables if again.get(t.relid) != steady(t)]
    if unsteady:
        log.info(
            "publication of %s changed while it was read; its snapshot waits for the next discovery",
            ", ".join(t.qualified for t in unsteady),
        )
    return [t for t in tables if t not in unsteady]


def snapshot_new_tables(
    catalog: Catalog,
    url: str,
    publication: str,
    include: Callable[[str, str], bool],
    ledger: SnapshotLedger,
    gate: TableGate,
    boundary: Lsn,
    resuming: Collection[int] = (),
    partial: Mapping[str, PartialRead] | None = None,
    read_in_part: Collection[str] = (),
    received: ReceivedXids | None = None,
    room: int | None = None,
    sessions: int = 2,
) -> PendingSnapshot | None:
    """A snapshot of the tables that need one (:func:`tables_to_snapshot`), seeing every transaction
    before ``boundary`` (the stream's reach, see :func:`~cdc.capture.table_snapshots.take_snapshot`);
    their events wait in ``gate`` until it is written. ``None`` when no table needs one, or when no
    snapshot could be had at once (``gate.wanted`` then names the tables, for the next pass); ``sessions``
    read it (``CDC_SNAPSHOT_SESSIONS``). ``resuming``:
    tables whose read an earlier run began, which the gate holds from that read's boundary on;
    ``partial``: by log name, tables to read in part (their changes pass the gate all along).

    ``room``: how many more reads may begin now (``CDC_SNAPSHOT_CONCURRENCY`` less the reads under way
    or waiting). Reads that resume or read in part always begin; of the tables read whole from their first
    row, only those that fit are in the snapshot, and the others wait in ``gate.wanted`` (their changes
    dropped: the snapshot that reads them later holds their effect). So a snapshot is never held open by
    tables waiting for their turn: a new log's hundreds of tables are read a few at a time, each from a
    snapshot of its own, begun when it begins."""
    partial = partial or {}
    tables = tables_to_snapshot(catalog, publication, include, ledger, gate, resuming, partial, read_in_part)
    if room is not None:
        fresh = [t for t in tables if t.relid not in resuming and t.log_name not in partial]
        later = fresh[max(0, room - (len(tables) - len(fresh))) :]
        if later:
            gate.wanted.update({t.relid: t.qualified for t in later})
            tables = [t for t in tables if t not in later]
    if not tables:
        return None
    require_readable(catalog, tables, publication)
    pending = take_snapshot(url, tables, boundary, received, sessions)
    if pending is None:
        gate.wanted.update({t.relid: t.qualified for t in tables})
        return None
    for table in tables:
        if table.log_name in partial and ledger.covers(table.log_name, table.relid):
            pending.partial[table.relid] = partial[table.log_name]
        elif table.relid not in resuming:
            gate.holds[table.relid] = pending.boundary
    log.info(
        "snapshot of %s at %s, read beside the stream",
        ", ".join(t.qualified for t in tables),
        pending.boundary,
    )
    return pending


def require_readable(catalog: Catalog, tables: list[PublishedTable], publication: str) -> None:
    """Refuse to snapshot ``tables`` (before any slot is made for it) when the role cannot read one."""
    unreadable = set(catalog.unreadable([t.relid for t in tables]))
    if unreadable:
        names = ", ".join(t.qualified for t in tables if t.relid in unreadable)
        raise PrivilegeError(
            f"the capture role cannot read {names}, published by {publication}, so it cannot "
            f"snapshot it; run GRANT SELECT ON {names} TO the capture role (ALTER DEFAULT PRIVILEGES "
            "... GRANT SELECT ON TABLES covers tables created later)"
        )
