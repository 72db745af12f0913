"""The reads' lifecycle beside the stream: when each read begins, gets a chunk, gives way, goes on or ends.

:class:`ReadScheduler` keeps the reads of one capture run (under way, waiting to resume, parked, asked
for) and carries them out with :class:`~cdc.capture.reads.online_read.OnlineRead`,
:class:`~cdc.capture.reads.held_changes.HeldChanges` and the ledger
(:class:`~cdc.capture.table_snapshots.SnapshotLedger`). Its driver, :class:`cdc.run.coordinator.Capture`, calls it
between two passes of the streaming loop and after each group it appends; the stream never waits for a read.

Its decisions (room, turns, renewals, giving way to locks, a read's end, how a read stops) are
:class:`~cdc.capture.reads.scheduler_core.SchedulerCore`'s, taken without I/O and property-tested; this
module carries them out. Guarantees (each stated again where it is kept):

* **Room.** At most ``CDC_SNAPSHOT_CONCURRENCY`` reads run or wait for the stream at once
  (:meth:`ReadScheduler.room`); the others wait for their turn holding no snapshot.
* **Turns.** The reads under way take turns, one chunk per pass of the loop, unless they gave way to a lock,
  one renewed its snapshot, or the rows-per-second ceiling holds them back (:meth:`ReadScheduler.read_chunk`).
* **Short snapshots.** A read by key goes on from a new snapshot once its own is ``read_snapshot_seconds`` old;
  a read whose snapshot holds a lock another session waits for gives way to it (:meth:`ReadScheduler._stop`).
* **A read's end follows the stream.** Its last rows are written only once the stream received every
  transaction its snapshot sees (:meth:`ReadScheduler._stream_reached`).
* **Starting over.** A truncate, a change of the table's columns, or a key change leaving TOAST values
  unchanged starts a read over from a new snapshot (:meth:`ReadScheduler._abandon`); a lost session or a stop
  suspends reads by key, which go on past their last durable key (:meth:`ReadScheduler.drop_table_snapshots`,
  :meth:`ReadScheduler.reopen_reads`); ``cdc snapshot --cancel`` stops them (:meth:`ReadScheduler.cancel_reads`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Protocol

from cdc.capture.catalog import Catalog
from cdc.capture.discovery import snapshot_new_tables
from cdc.capture.errors import SourceError
from cdc.capture.group_writer import GroupWriter
from cdc.capture.lsn import Lsn
from cdc.capture.published_tables import PublishedTable
from cdc.capture.reads.held_changes import HeldChanges
from cdc.capture.reads.online_read import OnlineRead, held_path, keyset_keys, progress_plan, run_keep
from cdc.capture.reads.partial_reads import PartialRequests, flush_records, going_on
from cdc.capture.reads.read_conditions import checked_condition
from cdc.capture.reads.read_throttle import ReadThrottle
from cdc.capture.reads.scheduler_core import End, ReadFacts, SchedulerCore, StartOver, Stop, StopPartial, Suspend
from cdc.capture.reads.snapshot_requests import SnapshotRequest
from cdc.capture.snapshot_writer import KeysetPlan, SnapshotWriter, SnapshotWritten
from cdc.capture.stream_core import StreamCore
from cdc.capture.streaming import Transaction
from cdc.capture.table_snapshots import PartialRead, PendingSnapshot, ReadProgress, SnapshotLedger, TableGate
from cdc.capture.tables import TableShape
from cdc.capture.visibility import ReceivedXids
from cdc.errors import ConfigError
from log_store import ProducerRecord
from log_store.log import Log

log = logging.getLogger("cdc.capture")


class ReadSettings(Protocol):
    """The settings reads use (the application's settings class has them all)."""

    @property
    def database_url(self) -> str: ...

    @property
    def publication(self) -> str: ...

    @property
    def slot(self) -> str: ...

    @property
    def data_dir(self) -> Path: ...

    @property
    def snapshot_concurrency(self) -> int: ...

    @property
    def snapshot_sessions(self) -> int: ...

    @property
    def snapshot_rows_per_second(self) -> int: ...

    @property
    def request_key_bytes(self) -> bytes | None: ...


@dataclass(frozen=True)
class ReadTuning:
    """The reads' timing knobs, in seconds where they are times."""

    #: how often, at most, capture looks for sessions waiting for a lock a read holds (between chunks)
    lock_check_seconds: float = 0.05
    #: how long a read waits for its table's lock, at its start and in each chunk's query
    read_lock_timeout_ms: int = 200
    #: how long a read by key reads from one snapshot before it goes on from a new one (xmin held at most that)
    read_snapshot_seconds: float = 2.0


@dataclass
class ReadStats:
    """What the reads of one run did."""

    #: tables read that joined the capture (or were read again because they changed)
    tables_added: int = 0
    #: reads beside the stream begun again from a new snapshot (:mod:`cdc.capture.reads.online_read`)
    reads_abandoned: int = 0
    #: changes of tables being read that waited in a holding file for their read's last chunk
    held_changes: int = 0
    #: reads resumed past the last key an earlier run wrote
    reads_resumed: int = 0
    #: tables read again on request (``cdc snapshot``)
    reads_requested: int = 0
    #: times a read gave way to another session's lock (DDL) and went on later from a new snapshot
    reads_yielded: int = 0
    #: reads stopped on request (``cdc snapshot --cancel``)
    reads_cancelled: int = 0
    #: times a read by key went on from a new snapshot because its own had been held long enough
    snapshots_renewed: int = 0
    #: passes of the loop in which no chunk was read, to keep reads within ``CDC_SNAPSHOT_ROWS_PER_SECOND``
    reads_throttled: int = 0


def _lasting_caps(held: HeldChanges) -> tuple[tuple[int, int], ...]:
    return tuple(held.lasting_caps)


class ReadScheduler:
    """The reads of one capture: begun by discovery, read a chunk at a time between passes of the streaming loop.

    Not thread-safe: only the streaming loop's thread calls it. :meth:`attach` gives it the run's log,
    ledger and writers before any other call; the state of reads left under way outlives a run (the next
    run of the same capture resumes them from the ledger)."""

    def __init__(
        self,
        settings: ReadSettings,
        tuning: ReadTuning,
        stats: ReadStats,
        catalog: Catalog,
        core: StreamCore[Transaction, PendingSnapshot],
        received: ReceivedXids,
        count: Callable[[SnapshotWritten], None],
    ) -> None:
        self.settings = settings
        self.tuning = tuning
        self.stats = stats
        self.catalog = catalog
        self.core = core
        #: transactions the stream received, that a new snapshot must see
        self.received = received
        self._count = count  # a read's rows are in the log: its figures go to the run's
        self.log: Log | None = None
        self.ledger = SnapshotLedger("")
        self.gate = TableGate(self.ledger)
        self.writer: SnapshotWriter | None = None
        self.groups: GroupWriter | None = None
        self.include: Callable[[str, str], bool] = lambda schema, table: True
        #: the decisions: room, turns, renewals, giving way, a read's end (:mod:`cdc.capture.reads.scheduler_core`)
        self.decisions = SchedulerCore(settings.snapshot_concurrency, tuning.read_snapshot_seconds, tuning.lock_check_seconds)
        self.reads: list[OnlineRead] = []  # tables read beside the stream, in the order they began
        #: by OID: reads an earlier run left under way (their progress, their held changes), to resume
        self.resumes: dict[int, tuple[ReadProgress, HeldChanges]] = {}
        self._resume_snapshotted: set[int] = set()  # resumes whose new snapshot waits for the stream
        self._throttle = ReadThrottle(settings.snapshot_rows_per_second)
        self.label_floor = 0  # the highest position a snapshot's rows were labelled with (see discover)
        self.first_reads: set[int] = set()  # tables a new log reads first: not counted as tables added
        self._resumes_over: list[tuple[str, HeldChanges]] = []  # resumes started over: files to delete
        self._cancels: list[str] = []  # tables whose read a request in the group being written cancels
        self.partial = PartialRequests()  # partial reads asked for, not begun (cdc.capture.reads.partial_reads)
        self._reshaped: list[OnlineRead] = []  # partial reads to stop after the group being written
        #: partial reads stopped with their session: (read, its progress), flushed when the next one begins
        self._parked: list[tuple[OnlineRead, ReadProgress | None]] = []

    def attach(
        self,
        store: Log,
        ledger: SnapshotLedger,
        gate: TableGate,
        writer: SnapshotWriter,
        groups: GroupWriter,
        include: Callable[[str, str], bool],
    ) -> None:
        """The run's log, ledger, gate and writers (a new run of the same capture attaches its own)."""
        self.log, self.ledger, self.gate, self.writer, self.groups, self.include = store, ledger, gate, writer, groups, include

    @property
    def position(self) -> Lsn:
        """The log's position (:attr:`StreamCore.position`)."""
        return self.core.position

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

    def wants_discovery(self) -> bool:
        """Whether a discovery is due now: a table's change met the gate, a table's columns changed, or a
        read waits for a new snapshot. Tables waiting for their turn to be read (``gate.wanted``) wait
        for a read to end first, so that a new log's tables do not make every pass look at the catalog."""
        return self.decisions.wants_discovery(bool(self.gate.wanted), len(self.reads), self._waiting())

    def _waiting(self) -> int:
        """How many tables' snapshots wait for the stream."""
        return sum(len(p.tables) for p in self.core.waiting)

    def _room(self) -> int:
        """How many more reads may begin: ``CDC_SNAPSHOT_CONCURRENCY`` less those under way or waiting for the stream."""
        return self.decisions.room(len(self.reads), self._waiting())

    @staticmethod
    def _facts(reads: list[OnlineRead]) -> list[ReadFacts]:
        """What :attr:`decisions` needs of ``reads`` (each read's handle is its ``id``)."""
        return [
            ReadFacts(
                id(read),
                partial=read.condition is not None,
                resumable=read.progress is not None,
                finishing=read.parts.finishing,
                abandoned=read.abandoned,
                started=read.pending.started,
            )  # fmt: skip
            for read in reads
        ]

    def _reads_of(self, handles: list[int]) -> list[OnlineRead]:
        """The reads under way with these handles, in their order."""
        wanted = set(handles)
        return [read for read in self.reads if id(read) in wanted]

    # -- tables added mid-stream (see cdc.capture.table_snapshots) ---------------------------------------------

    def discover(self) -> None:
        """Take a snapshot of the tables that need one (:mod:`cdc.capture.discovery`), read when the stream reaches it.

        A read's rows are as of its boundary minus one, which must lie past every position a snapshot's
        rows were labelled with before (the log's position at the start, the reads begun since): rows
        labelled alike would not order after those. While the stream has not moved past it, the snapshot
        waits (the server is asked where its WAL ends, and to flush it)."""
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

    def _drop_resumes_left_out(self) -> None:
        """Reads to resume whose table capture no longer takes (it left the publication or ``CDC_TABLES``)
        are over: their holding files go, and their progress records get tombstones, so that
        ``cdc snapshot --status`` and ``cdc lag`` stop listing them."""
        assert self.log is not None and self.groups is not None
        taken = {t.relid for t in self.catalog.published_tables(self.settings.publication) if self.include(t.schema, t.table)}
        records: list[ProducerRecord] = []
        for relid in [relid for relid in self.resumes if relid not in taken]:
            progress, held = self.resumes.pop(relid)
            self.groups.held.pop(progress.topic, None)
            self.gate.holds.pop(relid, None)
            held.discard()
            name = next((name for name, read in self.ledger.reads.items() if read.relid == relid), None)
            if name is not None:
                records.append(self.ledger.progress_gone(name))
            log.info("the read of %s is over: its table is no longer captured", progress.topic)
        if records:
            self.log.append_group(records, self.position.hex16())

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

    def end_reads(self) -> list[ProducerRecord]:
        """The log goes on past a gap (:func:`~cdc.capture.initial_snapshot.begin_again`): the reads an earlier run
        left under way are over (their held changes are older than the gap); the tombstones of their
        progress records, to append with the move. Call :meth:`drop_holding_files` once they are durable."""
        return [self.ledger.progress_gone(name) for name in list(self.ledger.reads)]

    def drop_holding_files(self) -> None:
        """Delete this slot's holding files (the reads they served are over)."""
        held_dir = self.settings.data_dir / "held"
        for path in held_dir.glob(f"{self.settings.slot}-*.held") if held_dir.exists() else ():
            path.unlink(missing_ok=True)

    def reopen_reads(self) -> None:
        """Find the reads an earlier run left under way (a progress record in the ledger and its holding
        file): their held changes are kept (cut to the log's position) and the gate holds their tables'
        changes from their first boundary on, until a new snapshot resumes them. Other holding files of
        this slot are deleted (their reads start over). A partial read's held changes go to the log now,
        and it goes on as a new partial read (:mod:`cdc.capture.reads.partial_reads`). A read ``cdc snapshot``
        asked for that has not ended (the ledger's note of it) is asked for again."""
        assert self.groups is not None
        assert self.log is not None
        held_dir = self.settings.data_dir / "held"
        kept: set[Path] = set()
        gone = []
        for name, progress in list(self.ledger.reads.items()):
            path = held_path(held_dir, self.settings.slot, progress.relid)
            if progress.relid in self.resumes:
                continue
            if progress.condition is not None:
                self._flush_held(name, progress, path)
                continue
            if not path.exists():
                gone.append(self.ledger.progress_gone(name))
                continue
            held = HeldChanges.reopen(path, self.position, next_run=len(progress.earlier) + 1)
            if held.truncated:  # the read starts over (start_truncated_over)
                held.discard()
                gone.append(self.ledger.progress_gone(name))
                continue
            held.remember(progress.snapshots, progress.caps)
            kept.add(path)
            self.resumes[progress.relid] = (progress, held)
            self.gate.holds[progress.relid] = progress.boundary
            self.groups.held[progress.topic] = held
            log.info("resuming the read of %s after %d rows", progress.topic, progress.rows)
        for path in held_dir.glob(f"{self.settings.slot}-*.held") if held_dir.exists() else ():
            if path not in kept:
                path.unlink(missing_ok=True)
        if gone:
            self.log.append_group(gone, self.position.hex16())
        for name, where in self.ledger.asked:  # asked for by `cdc snapshot`, not ended
            if where is None:
                self.ledger.read_again(name)
            elif not self.partial.holds(name, where):  # (the read that goes on from its progress is that one)
                self.partial.ask(name, PartialRead(where))

    def _flush_held(self, name: str, progress: ReadProgress, path: Path) -> None:
        """A partial read an earlier run or session left (its progress record, its holding file at ``path``):
        its held changes go to the log now, and it goes on past its last key (:mod:`cdc.capture.reads.partial_reads`)."""
        assert self.log is not None and progress.condition is not None
        held = HeldChanges.reopen(path, self.position) if path.exists() else HeldChanges(path)
        self.log.append_group(flush_records(held, self.ledger, name, self.position), self.position.hex16())
        held.discard()
        self.partial.first(name, going_on(progress, progress.condition, progress.rows))
        log.info("the partial read of %s goes on after %d rows", progress.topic, progress.rows)

    def flush_parked(self) -> None:
        """The partial reads the last session stopped: their held changes go to the log, before any group of
        this session, and they go on (:meth:`_flush_held`)."""
        parked, self._parked = self._parked, []
        for read, progress in parked:
            self._flush_held(read.shape.log_name, progress or read.initial_progress(), read.held.path)

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

    def _give_way_to_locks(self) -> bool:
        """Suspend every read whose snapshot holds a lock another session waits for (``ALTER TABLE``,
        ``TRUNCATE`` of a table read, or a session queued behind them); whether any was.

        A read's snapshot transaction keeps the ``ACCESS SHARE`` lock of each table it read until it ends,
        and the application's writers queue behind DDL that waits for it. Checked between chunks, at most
        every ``lock_check_seconds``; the DDL then waits about one chunk's time."""
        if not self.decisions.lock_check_due(time.monotonic()):
            return False
        snapshots = {pid: read.pending for read in self.reads for pid in read.pending.reader.pids}
        blocking = {id(snapshots[pid]) for pid in self.catalog.blocking(list(snapshots))}
        blocked = {id(read) for read in self.reads if id(read.pending) in blocking}
        for stop in self.decisions.give_way(self._facts(self.reads), blocked):
            self.stats.reads_yielded += 1
            self._stop(stop, "another session waits for a lock it holds")
        return bool(blocking)

    def _renew_snapshots(self) -> bool:
        """Suspend every read by key whose snapshot is ``read_snapshot_seconds`` old and that has a durable
        key to go on from (:meth:`_stop`): it goes on past it from a new snapshot, taken at once
        (no slot, nothing waited for: :func:`~cdc.capture.table_snapshots.take_snapshot`). So no snapshot
        of a read holds the server's xmin horizon (what VACUUM may remove) for longer than that and a
        chunk. A read by block ranges keeps its one snapshot to the end (it could not go on from another).
        Whether any was suspended."""
        now = time.monotonic()
        old = self.decisions.renewals(self._facts(self.reads), now)
        for stop in old:
            self.stats.snapshots_renewed += 1
            started = next(read.pending.started for read in self.reads if id(read) == stop.read)
            self._stop(stop, f"its snapshot is {now - started:.1f} s old", renewal=True)
        return bool(old)

    def _stop(self, stop: Stop, why: str, *, renewal: bool = False) -> None:
        """Carry out how :attr:`decisions` stops a read, releasing its snapshot: :class:`Suspend`, a read by
        key goes on from its last durable key with a new snapshot at a later point, as after a restart
        (:func:`~cdc.capture.reads.online_read.run_keep`), its held changes kept; :class:`StartOver`, a
        read by block ranges, or one that wrote no rows yet, starts over; :class:`End`, it is forgotten (its
        session ended: the next discovery finds its table); :class:`StopPartial`, a partial read writes
        its held changes (now, or first thing next session) and goes on as a new one
        (:mod:`cdc.capture.reads.partial_reads`)."""
        read = self._reads_of([stop.read])[0]
        match stop:
            case StopPartial(park=park):
                self._stop_partial(read, why, park=park)
            case StartOver():
                self._abandon([read], why)
                self._end_read(read)
            case End():
                self._end_read(read)
            case Suspend():
                progress = read.progress
                assert progress is not None
                self.reads.remove(read)
                read.suspend()
                self.resumes[read.relid] = (progress, read.held)
                self.ledger.reads[read.shape.log_name] = progress
                self._resume_snapshotted.discard(read.relid)
                self.core.reading = bool(self.reads)
                log.log(
                    logging.DEBUG if renewal else logging.INFO,
                    "the read of %s stops after %d rows and goes on from a new snapshot: %s", read.topic, read.rows, why,
                )  # fmt: skip

    def _stop_partial(self, read: OnlineRead, why: str, *, park: bool = False) -> None:
        """Stop the partial read ``read`` early (:mod:`cdc.capture.reads.partial_reads`): its held changes go to the
        log and it goes on from a new snapshot past its last durable key. ``park``: its session is ending
        (maybe because the log failed): nothing is written now; the next session writes them first
        (:meth:`flush_parked`), or the next run does, from the progress record in the log."""
        progress = read.parts.progress or read.initial_progress()
        if park:
            self._detach(read)
            read.suspend()
            read.held.close()
            self._parked.append((read, progress))
        else:
            self._end_read(read, flush=True)
            self.partial.first(read.shape.log_name, going_on(progress, read.condition or "", read.rows))
        self.decisions.resume_due = True
        log.info("the partial read of %s stops after %d rows and goes on from a new snapshot: %s", read.topic, read.rows, why)

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

    def _end_read(self, read: OnlineRead, *, flush: bool = False, done: list[ProducerRecord] | None = None) -> None:
        """Forget ``read`` (finished or abandoned): its holding file is deleted, the gate holds its table no
        more. ``flush``: a partial read that stops early writes its held changes first, in a group of their
        own, with ``done`` (its request's tombstone, when it ends for good)."""
        assert self.log is not None
        if flush:
            read.parts.close()
            records = flush_records(read.held, self.ledger, read.shape.log_name, self.position, done or ())
            self.log.append_group(records, self.position.hex16())
        self._detach(read)
        read.close()
        self.core.reading = bool(self.reads)

    def _detach(self, read: OnlineRead) -> None:
        """Take ``read`` out of the reads under way: its table's records go straight to the log again."""
        assert self.groups is not None
        if read in self.reads:
            self.reads.remove(read)
        self.groups.held.pop(read.topic, None)
        self.groups.folded.discard(read.topic)
        self.gate.holds.pop(read.relid, None)
        self.core.reading = bool(self.reads)

    def abandon_topics(self, topics: set[str]) -> None:
        """The group being written needs rows of these held topics the log may not hold yet: read their tables again."""
        why = "an update changed a key and left TOAST values unchanged"
        reading = [read for read in self.reads if read.topic in topics and not read.abandoned]
        self._abandon(reading, why)
        for relid, (progress, held) in list(self.resumes.items()):
            if progress.topic in topics:
                self._resume_over(relid, progress, held, why)

    def _unwait(self, relid: int) -> None:
        """Take a table out of the snapshots waiting to be read (one left with no table is released)."""
        for pending in list(self.core.waiting):
            pending.tables = [table for table in pending.tables if table.relid != relid]
            pending.partial.pop(relid, None)
            if not pending.tables:
                self.core.waiting.remove(pending)
                pending.close()

    def _resume_over(self, relid: int, progress: ReadProgress, held: HeldChanges, why: str) -> None:
        """A read waiting to be resumed starts over instead (its held records would hold a row the log
        may lack): as :meth:`_abandon`, and no snapshot already taken to resume it is read."""
        del self.resumes[relid]
        self._resume_snapshotted.discard(relid)
        self._resumes_over.append((progress.topic, held))  # deleted once the group being written is done
        self._unwait(relid)
        self.gate.holds.pop(relid, None)
        self.gate.wanted[relid] = progress.topic
        self.stats.reads_abandoned += 1
        log.info("the read of %s starts again from a new snapshot: %s", progress.topic, why)

    def _abandon(self, reads: list[OnlineRead], why: str) -> None:
        """Stop ``reads`` at once: the gate refuses their tables' changes from here on (the next discovery
        takes a new snapshot); their files go once the group being written is done (:meth:`reap`)."""
        for read in reads:
            read.abandoned = True
            if read.condition is not None:  # its held changes are not all in the log: read the whole table
                self.ledger.read_again(read.shape.log_name)
            self.gate.holds.pop(read.relid, None)
            self.gate.wanted[read.relid] = read.table.qualified
            self.stats.reads_abandoned += 1
            log.info("the read of %s starts again from a new snapshot: %s", read.table.qualified, why)

    def reap(self) -> None:
        for read in [read for read in self.reads if read.abandoned]:
            self._end_read(read)
        assert self.groups is not None
        for topic, held in self._resumes_over:
            self.groups.held.pop(topic, None)
            held.discard()
        self._resumes_over.clear()

    def drop_table_snapshots(self) -> None:
        """Forget waiting snapshots (their tables are found again by the next discovery) and suspend the
        reads by key under way (:meth:`_stop`): with reads an earlier run left, they are resumed from
        new snapshots; the others start over."""
        for pending in self.core.waiting:
            self.partial.put_back(pending)
            pending.close()
        self.core.waiting.clear()
        for read in list(self.reads):
            self._stop(self.decisions.stop(self._facts([read])[0], session_ended=True), "the replication session ended")
        self._resume_snapshotted.clear()
        self.gate.holds = {relid: boundary for relid, boundary in self.gate.holds.items() if relid in self.resumes}

    def close_resumes(self) -> None:
        """Close the holding files of reads not finished: the next run resumes them (:meth:`reopen_reads`)."""
        for _, held in self.resumes.values():
            held.close()
        self.resumes.clear()

    def start_truncated_over(self) -> None:
        """Reads whose table a group just truncated start over from a new snapshot: the rows read before
        the ``TRUNCATE`` and those read after it could not both stand beside one truncate marker."""
        why = "its table was truncated"
        truncated = self.decisions.truncated(self._facts([read for read in self.reads if read.held.truncated]))
        if truncated:
            self._abandon(self._reads_of(truncated), why)
            self.reap()
        for relid, (progress, held) in list(self.resumes.items()):
            if held.truncated:
                self._resume_over(relid, progress, held, why)
        self.reap()
