"""The reads' lifecycle beside the stream: when each read begins, gets a chunk, gives way, goes on or ends.

:class:`ReadScheduler` keeps the reads of one capture run (under way, waiting to resume, parked, asked
for) and carries them out with :class:`~cdc.capture.reads.online_read.OnlineRead`,
:class:`~cdc.capture.reads.held_changes.HeldChanges` and the ledger
(:class:`~cdc.capture.table_snapshots.SnapshotLedger`). Its driver, :class:`cdc.run.coordinator.Capture`, calls it
between two passes of the streaming loop and after each group it appends; the stream never waits for a read.

Its decisions (room, turns, renewals, giving way to locks, a read's end, how a read stops) are
:class:`~cdc.capture.reads.scheduler_core.SchedulerCore`'s, taken without I/O and property-tested; this
module and its bases carry them out, one layer on the next: the reads' state
(:mod:`~cdc.capture.reads.reads_under_way`), how a read stops (:mod:`~cdc.capture.reads.read_stops`), reads
across sessions and runs (:mod:`~cdc.capture.reads.read_resumes`), how a read begins
(:mod:`~cdc.capture.reads.read_starts`), reads asked for (:mod:`~cdc.capture.reads.read_requests`); this
module takes the turns and answers the streaming loop. Guarantees (each stated again where it is kept):

* **Room.** At most ``CDC_SNAPSHOT_CONCURRENCY`` reads run or wait for the stream at once
  (:meth:`~cdc.capture.reads.reads_under_way.ReadsUnderWay._room`); the others wait for their turn holding
  no snapshot.
* **Turns.** The reads under way take turns, one chunk per pass of the loop, unless they gave way to a lock,
  one renewed its snapshot, or the rows-per-second ceiling holds them back (:meth:`ReadScheduler.read_chunk`).
* **Short snapshots.** A read by key goes on from a new snapshot once its own is ``read_snapshot_seconds`` old;
  a read whose snapshot holds a lock another session waits for gives way to it
  (:meth:`~cdc.capture.reads.read_stops.ReadStops._stop`).
* **A read's end follows the stream.** Its last rows are written only once the stream received every
  transaction its snapshot sees (:meth:`~cdc.capture.reads.read_starts.ReadStarts._stream_reached`).
* **Starting over.** A truncate, a change of the table's columns, or a key change leaving TOAST values
  unchanged starts a read over from a new snapshot (:meth:`~cdc.capture.reads.read_stops.ReadStops._abandon`);
  a lost session or a stop suspends reads by key, which go on past their last durable key
  (:meth:`~cdc.capture.reads.read_stops.ReadStops.drop_table_snapshots`,
  :meth:`~cdc.capture.reads.read_resumes.ReadResumes.reopen_reads`); ``cdc snapshot --cancel`` stops them
  (:meth:`~cdc.capture.reads.read_requests.ReadRequests.cancel_reads`).
"""

from __future__ import annotations

import logging
import time

from cdc.capture.errors import SourceError
from cdc.capture.reads.online_read import OnlineRead
from cdc.capture.reads.read_requests import ReadRequests
from cdc.capture.tables import TableShape

log = logging.getLogger("cdc.capture")


class ReadScheduler(ReadRequests):
    """The reads of one capture: begun by discovery, read a chunk at a time between passes of the streaming loop.

    Not thread-safe: only the streaming loop's thread calls it. :meth:`attach` gives it the run's log,
    ledger and writers before any other call; the state of reads left under way outlives a run (the next
    run of the same capture resumes them from the ledger)."""

    def new_shape(self, shape: TableShape) -> None:
        """A table's columns changed in the stream: the next discovery looks at it, and a read of it in
        another shape stops (a read holds its table's lock from the check of its columns on
        (:class:`OnlineRead`), so a shape of its own is the one it reads: only another one, met in the
        stream first, starts it over). A partial read stops once this group is in the log, its held
        changes written, and goes on in the new shape (:mod:`cdc.capture.reads.partial_reads`); a whole
        read starts over."""
        fingerprint = shape.fingerprint()
        reading = [read for read in self.reads if shape.relid == read.relid and read.shape.fingerprint() != fingerprint]
        stop_later, over = self.decisions.reshaped(self._facts(reading))
        self._reshaped += self._reads_of(stop_later)
        if over:
            self._abandon(self._reads_of(over), f"the columns of {shape.qualified} changed")

    def begin_session(self) -> None:
        """A replication session begins: snapshots that waited when the last one ended are taken again at a
        new point, and reads under way go on from new ones (the slot sends again what the log does not
        hold, so held changes past the log's position are cut); the partial reads it stopped write their
        held changes first."""
        self.drop_table_snapshots()
        self.flush_parked()
        for _, held in self.resumes.values():
            held.cut_to(self.position)
        self.discover()

    def run_ended(self) -> None:
        """The run ends: reads under way are suspended and their holding files closed; the next run resumes
        them from their progress records (:meth:`reopen_reads`), partial ones included."""
        self.drop_table_snapshots()
        self.close_resumes()
        self._parked.clear()  # the next run writes their held changes, from their progress records

    def discovery_due(self) -> None:
        """A discovery is carried out now: what made it due is met by it."""
        self.decisions.discovered()

    def group_written(self) -> None:
        """The group just appended is durable: partial reads whose table changed shape in it stop (their held
        changes written), and the cancellations it carried are carried out (:meth:`cancel_reads`)."""
        reshaped, self._reshaped = self._reshaped, []
        for read in [read for read in reshaped if read in self.reads]:
            self._stop_partial(read, f"the columns of {read.shape.qualified} changed")
        if self._cancels:
            self.cancel_reads()

    def wants_discovery(self) -> bool:
        """Whether a discovery is due now: a table's change met the gate, a table's columns changed, or a
        read waits for a new snapshot. Tables waiting for their turn to be read (``gate.wanted``) wait
        for a read to end first, so that a new log's tables do not make every pass look at the catalog."""
        return self.decisions.wants_discovery(bool(self.gate.wanted), len(self.reads), self._waiting())

    def read_chunk(self) -> None:
        """Append the next chunk of one of the first ``CDC_SNAPSHOT_CONCURRENCY`` reads, each in turn,
        unless the reads gave way to a lock (:meth:`_give_way_to_locks`). A partial read whose condition
        fails on a row (``1 / n`` with ``n = 0``, a cast of a text that is no number) ends there, its held
        changes written and its request forgotten: asked again, it would fail again."""
        assert self.writer is not None
        if self._give_way_to_locks() or self._renew_snapshots() or not self.reads:
            return
        now = time.monotonic()
        self.core.throttled = not self._throttle.allows(now)
        if self.core.throttled:
            self.stats.reads_throttled += 1
            return
        turn = self.decisions.next_chunk(self._facts(self.reads))
        assert turn is not None  # there are reads
        read = self._reads_of([turn])[0]
        try:
            rows = read.parts.written.events  # rows this run read (a resumed run's earlier rows aside)
            finished = read.next_chunk(self.writer, self.position.hex16())
            self._throttle.took(read.parts.written.events - rows, now)
            if not finished and read.parts.finishing:
                self.core.throttled = True  # the last part waits for the stream: wait for frames, not spin
        except SourceError as exc:
            sqlstate = str(getattr(exc.__cause__, "sqlstate", None) or "")
            if read.condition is None or sqlstate[:2] not in ("22", "42"):
                raise
            log.error("the partial read of %s ends: its condition failed on a row: %s", read.shape.log_name, exc)
            done = self.ledger.asked_done(read.shape.log_name, read.condition)
            self._end_read(read, flush=True, done=done)
            return
        if finished:
            self._finish(read)

    def _finish(self, read: OnlineRead) -> None:
        """``read``'s last part (rows, held records, ledger record) is in the log: its table's changes go
        straight to the log from now on."""
        self._end_read(read)
        if read.condition is not None:
            self.decisions.resume_due = True  # a whole read of the table may wait for it to end (discovery)
        written = read.parts.written
        written.events += read.held.handed_out  # the held changes its last group wrote are events too
        written.value_bytes += read.held.handed_out_bytes
        self._count(written)
        self.stats.held_changes += read.held.count
        self.stats.reads_resumed += read.resumed_after is not None
        log.info(
            "snapshot of %s written: %d rows as of %s in %d groups, %d changes held during the read",
            read.table.qualified, written.rows, read.pending.as_of, written.groups, read.held.count,
        )  # fmt: skip
