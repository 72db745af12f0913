"""How a read begins: discovery takes a snapshot of the tables that need one, and once the stream reaches
it each table is read beside the stream, or resumed past its last durable key.

Guarantee kept here (see :mod:`cdc.capture.reads.scheduler`): **a read's end follows the stream.** Its last
rows are written only once the stream received every transaction its snapshot sees
(:meth:`ReadStarts._stream_reached`).
"""

from __future__ import annotations

import logging
import time
from functools import partial

from cdc.capture.discovery import snapshot_new_tables
from cdc.capture.lsn import Lsn
from cdc.capture.published_tables import PublishedTable
from cdc.capture.reads.held_changes import HeldChanges
from cdc.capture.reads.online_read import OnlineRead, held_path, keyset_keys, progress_plan, run_keep
from cdc.capture.reads.read_conditions import checked_condition
from cdc.capture.reads.read_resumes import ReadResumes
from cdc.capture.snapshot_writer import KeysetPlan
from cdc.capture.table_snapshots import PartialRead, PendingSnapshot
from cdc.capture.tables import TableShape
from cdc.errors import ConfigError

log = logging.getLogger("cdc.capture")


def _lasting_caps(held: HeldChanges) -> tuple[tuple[int, int], ...]:
    return tuple(held.lasting_caps)


class ReadStarts(ReadResumes):
    """Beginning reads: tables discovered, snapshots taken, reads started when the stream reaches them."""

    def discover(self) -> None:
        """Take a snapshot of the tables that need one (:mod:`cdc.capture.discovery`), read when the stream reaches it.

        A read's rows are as of its boundary minus one, which must lie past every position a snapshot's
        rows were labelled with before (the log's position at the start, the reads begun since): rows
        labelled alike would not order after those. While the stream has not moved past it, the snapshot
        waits (the server is asked where its WAL ends, and to flush it).

        Discovery also keeps the IDs of the transactions the stream received bounded: once enough came in,
        those a snapshot of the server now sees are forgotten (:class:`~cdc.capture.visibility.ReceivedXids`)."""
        if self.received.due:
            self.received.forget_seen(self.catalog.current_snapshot())
        boundary = Lsn(max(self.core.server_end, self.position + 1))
        if boundary - 1 <= self.label_floor:
            self.core.want_end = max(self.core.want_end, self.label_floor + 2)
            self.decisions.resume_due = True
            if self.decisions.nudge_due(time.monotonic()):
                self.catalog.flush_wal()
            return
        resuming = set(self.resumes) - self._resume_snapshotted
        busy = {read.shape.log_name for read in self.reads} | {t.log_name for p in self.core.waiting for t in p.tables}
        in_part = {read.shape.log_name for read in self.reads if read.condition is not None} | {
            t.log_name for p in self.core.waiting for t in p.tables if t.relid in p.partial
        }
        pending = snapshot_new_tables(
            self.catalog, self.settings.database_url, self.settings.publication, self.include, self.ledger, self.gate,
            boundary=boundary, resuming=resuming,
            partial=self.partial.due(busy), read_in_part=in_part, received=self.received, room=self._room(),
            sessions=self.settings.snapshot_sessions,
        )  # fmt: skip
        if pending is not None:
            for table in pending.tables:  # the runs that resume reads: their held records are all older
                if (resume := self.resumes.get(table.relid)) is not None:
                    resume[1].run_started(len(resume[0].earlier) + 1, pending.xids, taken_now=True, wal_end=pending.wal_end)
            self.partial.taken(pending)
            self.stats.tables_added += sum(
                t.relid not in pending.partial and t.relid not in resuming and t.relid not in self.first_reads
                for t in pending.tables
            )
            self.first_reads -= {t.relid for t in pending.tables}
            self._resume_snapshotted |= {t.relid for t in pending.tables}
            self.core.waiting.append(pending)
        if resuming - self._resume_snapshotted:
            self._drop_resumes_left_out()

    def start_read(self, pending: PendingSnapshot) -> None:
        """The stream reached ``pending``'s boundary: each of its tables is read beside the stream
        (:mod:`cdc.capture.reads.online_read`), with the membership and columns read before the snapshot was
        taken, never later ones (which could include a partition attached after the snapshot, whose
        rows it does not hold). A table an earlier run began reading resumes past its last durable key."""
        assert self.writer is not None and self.groups is not None
        self.label_floor = max(self.label_floor, int(pending.as_of))
        self.core.snapshot_durable(pending.as_of)
        held_dir = self.settings.data_dir / "held"
        for table in pending.tables:
            shape = self.writer.shape_of(table)
            why = pending.reader.hold(shape, partial(self.catalog.relation_state, table.relid), self.tuning.read_lock_timeout_ms)
            self._resume_snapshotted.discard(table.relid)
            if why is not None:
                self._read_later(table, why, pending)
                continue
            keys = keyset_keys(shape, self.catalog.table(table.relid).primary_key)
            wanted = pending.partial.get(table.relid)
            if wanted is not None:
                self._start_partial(pending, table, shape, keys, wanted)
                continue
            self.partial.drop(table.log_name)  # a whole read holds every row a partial one would
            resume = self.resumes.pop(table.relid, None)
            plan = progress_plan(resume[0] if resume else None, keys, shape, pending.boundary)
            if resume is not None and plan is not None and plan.after is not None:
                held = resume[1]
            else:  # from the first key: the new snapshot sees every change held so far
                if resume is not None:
                    resume[1].discard()
                    self.groups.held.pop(resume[0].topic, None)
                    resume = None
                held = HeldChanges(held_path(held_dir, self.settings.slot, table.relid))
            keep = run_keep(shape, keys, tuple(last for _, last in plan.earlier) if plan is not None else ())
            read = OnlineRead.start(pending, table, self.writer, held, plan, keep, resume[0] if resume else None)
            read.parts.may_finish = partial(self._stream_reached, pending.wal_end)
            read.parts.recent_snapshots = partial(self._recent_snapshots, held)
            read.parts.held_caps = partial(_lasting_caps, held)
            self.reads.append(read)
            self.groups.held[read.topic] = held
            log.info(
                "reading %s as of %s beside the stream%s", table.qualified, pending.as_of,
                f", resumed after {read.resumed_rows} rows" if read.resumed_after is not None else "",
            )  # fmt: skip
        if pending.users == 0:
            pending.close()
        self.core.reading = bool(self.reads)

    def _recent_snapshots(self, held: HeldChanges) -> tuple[tuple[int, str, int], ...]:
        """The runs of a read whose snapshot may see a transaction the log does not hold yet."""
        return held.recent(self.position)

    def _stream_reached(self, end: Lsn) -> bool:
        """Whether the stream received, and wrote or held, every transaction committing before ``end`` (the
        WAL's end when a read's snapshot was taken: the transactions it sees). Until then a read's last rows wait, so that
        each of those transactions is judged against the read's snapshots (held, or dropped as already in
        the rows) rather than written after them again; the server is asked where its WAL ends meanwhile."""
        reached = self.decisions.stream_reached(end, self.core.server_end, bool(self.core.pending), time.monotonic())
        if reached.want_end is not None:
            self.core.want_end = max(self.core.want_end, reached.want_end)
        if reached.nudge:
            # the server sends only flushed WAL, and what lies before ``end`` (hint bits' page images, say)
            # may stay unflushed on an idle server: a transaction that takes an ID flushes it with its commit
            self.catalog.flush_wal()
        return reached.done

    def _start_partial(
        self,
        pending: PendingSnapshot,
        table: PublishedTable,
        shape: TableShape,
        keys: tuple[str, ...] | None,
        wanted: PartialRead,
    ) -> None:
        """Begin the partial read ``wanted`` of ``table`` in ``pending``'s snapshot (:mod:`cdc.capture.reads.partial_reads`):
        by key past ``wanted.after`` when it was read in the same shape, else from the first row."""
        assert self.writer is not None and self.groups is not None and self.log is not None
        try:  # the columns the publication publishes may have changed since it was asked for
            checked_condition(wanted.condition, table, self.catalog)
        except ConfigError as exc:
            log.warning("the partial read of %s is not done: %s", table.log_name, exc)
            done = self.ledger.asked_done(table.log_name, wanted.condition)
            if done:
                self.log.append_group(done, self.position.hex16())
            return
        plan = None
        if keys is not None:
            same = wanted.after is not None and wanted.fingerprint == shape.fingerprint().hex()
            plan = KeysetPlan(keys, wanted.after if same else None, wanted.rows if same else 0, pending.boundary)
        held = HeldChanges(held_path(self.settings.data_dir / "held", self.settings.slot, table.relid))
        read = OnlineRead.start(pending, table, self.writer, held, plan, None, condition=wanted.condition)
        # its progress is in the log before any change of the table is held: a kill -9 at any moment leaves
        # a record that makes the next run write what the holding file holds
        self.log.append_group([self.ledger.progress_record(shape, read.initial_progress())], self.position.hex16())
        self.reads.append(read)
        self.groups.held[read.topic] = held
        self.groups.folded.add(read.topic)  # the log holds a full row of every key: never abandoned for one
        log.info("reading the rows of %s where %s as of %s beside the stream", table.qualified, wanted.condition, pending.as_of)

    def _read_later(self, table: PublishedTable, why: str, pending: PendingSnapshot) -> None:
        """``table`` cannot be read in the snapshot that reached the stream (:meth:`SnapshotReader.hold`
        says why): a read that resumes waits for the next discovery's snapshot; one that had not begun
        starts then (the gate drops the table's changes until that snapshot, which holds their effect;
        a partial read's are written all along)."""
        self.stats.reads_yielded += 1
        self.decisions.resume_due = True
        wanted = pending.partial.get(table.relid)
        if wanted is not None:
            self.partial.first(table.log_name, wanted)
        elif table.relid not in self.resumes:
            self.gate.holds.pop(table.relid, None)
            self.gate.wanted[table.relid] = table.qualified
        log.info("the read of %s waits for a new snapshot: %s", table.qualified, why)
