"""The reads of one capture run and their state: under way, waiting to resume, parked, asked for.

:class:`ReadsUnderWay` is the base of :class:`~cdc.capture.reads.scheduler.ReadScheduler`: it holds the
reads' state, which the layers above it (:mod:`~cdc.capture.reads.read_stops`,
:mod:`~cdc.capture.reads.read_resumes`, :mod:`~cdc.capture.reads.read_starts`,
:mod:`~cdc.capture.reads.read_requests`, then the scheduler) act on, and the bookkeeping they share: how
much room there is for another read (``CDC_SNAPSHOT_CONCURRENCY``, :meth:`ReadsUnderWay._room`), what the
decisions (:class:`~cdc.capture.reads.scheduler_core.SchedulerCore`) are told of each read, and a read
taken out of the reads under way, its table's records going straight to the log again.
"""

from __future__ import annotations

from collections.abc import Callable

from cdc.capture.catalog import Catalog
from cdc.capture.group_writer import GroupWriter
from cdc.capture.lsn import Lsn
from cdc.capture.reads.held_changes import HeldChanges
from cdc.capture.reads.online_read import OnlineRead
from cdc.capture.reads.partial_reads import PartialRequests, flush_records
from cdc.capture.reads.read_settings import ReadSettings, ReadStats, ReadTuning
from cdc.capture.reads.read_throttle import ReadThrottle
from cdc.capture.reads.scheduler_core import ReadFacts, SchedulerCore
from cdc.capture.snapshot_writer import SnapshotWriter, SnapshotWritten
from cdc.capture.stream_core import StreamCore
from cdc.capture.streaming import Transaction
from cdc.capture.table_snapshots import PendingSnapshot, ReadProgress, SnapshotLedger, TableGate
from cdc.capture.visibility import ReceivedXids
from log_store import ProducerRecord
from log_store.log import Log


class ReadsUnderWay:
    """The reads of one capture, their state and what every layer of the scheduler does with them.

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

    def _unwait(self, relid: int) -> None:
        """Take a table out of the snapshots waiting to be read (one left with no table is released)."""
        for pending in list(self.core.waiting):
            pending.tables = [table for table in pending.tables if table.relid != relid]
            pending.partial.pop(relid, None)
            if not pending.tables:
                self.core.waiting.remove(pending)
                pending.close()
