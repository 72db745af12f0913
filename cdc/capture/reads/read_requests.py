"""Reads asked for with ``cdc snapshot`` (:mod:`cdc.capture.reads.snapshot_requests`): a table read again
whole or in part, and reads cancelled (``cdc snapshot --cancel``, :meth:`ReadRequests.cancel_reads`).
"""

from __future__ import annotations

import logging

from cdc.capture.errors import SourceError
from cdc.capture.lsn import Lsn
from cdc.capture.reads.read_conditions import checked_condition
from cdc.capture.reads.read_starts import ReadStarts
from cdc.capture.reads.snapshot_requests import SnapshotRequest
from cdc.capture.table_snapshots import PartialRead
from cdc.errors import ConfigError
from log_store import ProducerRecord

log = logging.getLogger("cdc.capture")


class ReadRequests(ReadStarts):
    """The requests a transaction being written carries, taken in the same group, and carried out."""

    def requested(self, request: SnapshotRequest, commit_ts_ms: int, lsn: Lsn) -> list[ProducerRecord]:
        """A ``cdc snapshot`` request (:mod:`cdc.capture.reads.snapshot_requests`) in a transaction being written:
        its tables' ledger entries are forgotten, so the discovery after this group reads them again (a
        partial read's table is read in part instead, :mod:`cdc.capture.reads.partial_reads`). The records to
        write in the same group: the ledger's note of each request taken (a capture that stops before
        the read ends finds it when it starts again), and the tombstone of a cancellation it lifts."""
        if request.where is not None:
            try:
                return self._partial_requested(request, commit_ts_ms, lsn)
            except SourceError:
                raise  # the connection to the source: the group is not confirmed, the slot sends it again
            except Exception:  # a request must never stop capture: any role may send one
                log.exception("ignored a request at %s to read %s in part", lsn, request.tables)
                return []
        records: list[ProducerRecord] = []
        for name in request.tables:
            uncancelled = self.ledger.read_requested(name)
            if self.ledger.read_again(name) or uncancelled:
                self._drop_partial(name)
                records += [*uncancelled, self.ledger.asked_record(name, None)]
                self.decisions.shape_changed = True
                self.stats.reads_requested += 1
                log.info("%s is read again, as asked at %s", name, lsn)
        self._cancels += request.cancel
        return records

    def _partial_requested(self, request: SnapshotRequest, commit_ts_ms: int, lsn: Lsn) -> list[ProducerRecord]:
        """A partial read asked for (``cdc snapshot --where``): queued when ``CDC_REQUEST_KEY`` signed it and
        its condition passes the checks again here; any other is logged and ignored."""
        if not request.signed_by(self.settings.request_key_bytes, commit_ts_ms):
            log.warning(
                "ignored a request at %s to read a table in part: it is not signed with CDC_REQUEST_KEY, or more than "
                "five minutes passed between signing and sending it", lsn,
            )  # fmt: skip
            return []
        published = {t.log_name: t for t in self.catalog.published_tables(self.settings.publication)}
        table = published.get(request.tables[0]) if len(request.tables) == 1 else None
        if table is None or not self.include(table.schema, table.table) or request.where is None:
            log.warning("ignored a request at %s to read %s in part: capture does not read it", lsn, request.tables)
            return []
        if not self.ledger.covers(table.log_name, table.relid):
            log.warning(
                "ignored a request at %s to read %s in part: a whole read of it is under way or due (it holds those rows), "
                "or its read was cancelled (`cdc snapshot %s` reads it whole)", lsn, table.log_name, table.log_name,
            )  # fmt: skip
            return []
        try:
            condition = checked_condition(request.where, table, self.catalog)
        except ConfigError as exc:
            log.warning("ignored a request at %s to read %s in part: %s", lsn, table.log_name, exc)
            return []
        self.partial.ask(table.log_name, PartialRead(condition.sql))
        self.decisions.resume_due = True
        self.stats.reads_requested += 1
        log.info("the rows of %s where %s are read again, as asked at %s", table.log_name, condition.sql, lsn)
        return [self.ledger.asked_record(table.log_name, condition.sql)]

    def _drop_partial(self, name: str) -> None:
        """A whole read of ``name`` is asked for: its partial reads, asked for, waiting or under way, give way
        to it (one under way ends at once, its held changes deleted: the whole read's snapshot, taken
        later, holds their effect, and the gate drops the table's changes until then)."""
        self.partial.drop(name)
        for pending in list(self.core.waiting):
            for relid in [t.relid for t in pending.tables if t.log_name == name and t.relid in pending.partial]:
                self._unwait(relid)
        partial = [read for read in self.reads if read.shape.log_name == name and read.condition is not None]
        self._abandon(partial, "a whole read was asked for")

    def cancel_reads(self) -> None:
        """Carry out the cancellations of the group just written (:mod:`cdc.capture.reads.snapshot_requests`):
        each read of a named table, under way, waiting for its snapshot or due, stops; its held changes
        and its progress go, and the ledger records the table as left out
        (:meth:`~cdc.capture.table_snapshots.SnapshotLedger.cancel_record`), in a group of their own."""
        assert self.log is not None
        names, self._cancels = self._cancels, []
        records: list[ProducerRecord] = []
        published = {t.log_name: t.relid for t in self.catalog.published_tables(self.settings.publication)} if names else {}
        for name in names:
            relid = published.get(name)
            if relid is not None and self._cancel_partial(name, relid):
                records += self.ledger.asked_done(name, None)
                continue
            if relid is None or self.ledger.covers(name, relid):
                log.info("no read of %s under way or due: nothing to cancel", name)
                continue
            for read in [read for read in self.reads if read.relid == relid]:
                self._end_read(read)
            resume = self.resumes.pop(relid, None)
            if resume is not None:
                self.groups.held.pop(resume[0].topic, None)  # type: ignore[union-attr]
                resume[1].discard()
            self._resume_snapshotted.discard(relid)
            self._unwait(relid)
            self.gate.holds.pop(relid, None)
            self.gate.wanted.pop(relid, None)
            records += self.ledger.cancel_record(name)
            self.stats.reads_cancelled += 1
            log.info("the read of %s is cancelled: its changes are left out until `cdc snapshot %s`", name, name)
        if records:
            self.log.append_group(records, self.position.hex16())
        self.core.reading = bool(self.reads)

    def _cancel_partial(self, name: str, relid: int) -> bool:
        """Stop the partial reads of ``name`` (asked for, waiting or under way: one under way writes its held
        changes first); whether there was one. The table stays captured: the log holds all of it."""
        if not self.ledger.covers(name, relid):
            return False
        asked = self.partial.drop(name)
        waiting = any(relid in pending.partial for pending in self.core.waiting)
        self._unwait(relid)
        reading = [read for read in self.reads if read.relid == relid and read.condition is not None]
        for read in reading:  # its request's tombstone goes with its held changes
            self._end_read(read, flush=True, done=self.ledger.asked_done(name, None))
        if asked or waiting or reading:
            self.stats.reads_cancelled += 1
            log.info("the partial read of %s is cancelled", name)
        return asked or waiting or bool(reading)
