"""The streaming loop's decisions, without I/O: what goes into a group, when the slot is confirmed, when
a heartbeat, a discovery or a waiting table snapshot is due, and when a replication session ends.

:class:`StreamCore` is told what happened (a committed transaction, a keepalive, a pass of the loop, a
group made durable) and answers with commands (:data:`Command`) that its driver,
:class:`cdc.run.coordinator.Capture`, carries out in order. It reads no socket, clock or log, so the rules
below are unit-tested with plain values beside the tests against PostgreSQL:

* **Durable before confirmed (promise 1).** A position is only ever sent in a :class:`SendStatus` after
  the driver reported the group holding it durable (:meth:`StreamCore.group_durable`,
  :meth:`StreamCore.heartbeat_durable`, :meth:`StreamCore.snapshot_durable`), or for a transaction the
  log already held.
* **Skip what the log holds.** A transaction whose commit LSN is at or before :attr:`StreamCore.position`
  becomes a :class:`Skip` (replayed only for its Relation messages), never part of a group; the slot
  resends such transactions after a crash between the fsync and the confirmation.
* **Whole transactions.** A group is a list of whole committed transactions, so the log's watermark
  always lies on a transaction boundary.
* **Table snapshots in order.** A waiting snapshot is written once the stream reaches its boundary,
  after every transaction before the boundary is in the log and before any transaction at or after it.

Commands that may change what later decisions see (a group appended, a snapshot written, a discovery)
come from generators: the driver carries out each before the next is decided.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from cdc.capture.lsn import Lsn


class Committed(Protocol):
    """What the loop needs of a committed transaction (:class:`cdc.capture.streaming.Transaction`)."""

    @property
    def commit_lsn(self) -> int: ...

    @property
    def end_lsn(self) -> int: ...

    @property
    def change_count(self) -> int: ...


class Waiting(Protocol):
    """What the loop needs of a table snapshot waiting for the stream (:class:`cdc.capture.table_snapshots.PendingSnapshot`)."""

    @property
    def boundary(self) -> Lsn: ...


Tx = TypeVar("Tx", bound=Committed)
Snap = TypeVar("Snap", bound=Waiting)


@dataclass(frozen=True)
class StreamTuning:
    """The loop's batching and timing knobs, in seconds where they are times."""

    batch_changes: int = 20_000
    batch_seconds: float = 0.2
    heartbeat_seconds: float = 5.0
    discover_seconds: float = 5.0
    status_seconds: float = 10.0


@dataclass(frozen=True)
class AppendGroup(Generic[Tx]):
    """Append these transactions as one group, then report it with :meth:`StreamCore.group_durable`."""

    transactions: list[Tx]


@dataclass(frozen=True)
class Skip(Generic[Tx]):
    """The log already holds this transaction: replay it only for its Relation messages, then close it."""

    transaction: Tx


@dataclass(frozen=True)
class WriteSnapshot(Generic[Snap]):
    """Write this waiting table snapshot as one group, then report it with :meth:`StreamCore.snapshot_durable`."""

    snapshot: Snap


@dataclass(frozen=True)
class Heartbeat:
    """The captured tables are idle up to the server's WAL ``end``: append an empty group at ``end - 1``,
    then report it with :meth:`StreamCore.heartbeat_durable`."""

    end: Lsn


@dataclass(frozen=True)
class SendStatus:
    """Tell the server that everything before ``flushed`` is durable (and, with ``reply``, ask where its WAL ends)."""

    flushed: Lsn
    reply: bool = False


@dataclass(frozen=True)
class Discover:
    """Look for published tables the log has no snapshot of (:mod:`cdc.capture.discovery`)."""


@dataclass(frozen=True)
class Retarget:
    """``once``: read the server's flushed WAL position and pass it to :meth:`StreamCore.retarget`."""


@dataclass(frozen=True)
class Finish:
    """End the session: send the final status (:attr:`flushed`) and close the stream."""

    flushed: Lsn


Command = AppendGroup[Tx] | Skip[Tx] | WriteSnapshot[Snap] | Heartbeat | SendStatus | Discover | Retarget | Finish


def group_position(last: Committed) -> Lsn:
    """The watermark position of a group ending with ``last``: the end of its commit record minus one.

    No transaction commits inside a commit record, so every commit <= that position is in the log, and
    the slot is confirmed at exactly the position plus one (:mod:`cdc.capture.slot_continuity` relies on it).
    """
    return Lsn(max(last.commit_lsn, last.end_lsn - 1))


class StreamCore(Generic[Tx, Snap]):
    """The state of one capture run's streaming: what the log holds, what the server was told, the
    transactions waiting for a group, the table snapshots waiting for the stream, the ``once`` target.

    It lives as long as the run; :meth:`begin_session` starts each replication session (a reconnect
    keeps the position, the confirmation and the drain target).
    """

    def __init__(self, tuning: StreamTuning, position: Lsn) -> None:
        self.tuning = tuning
        #: every transaction committed at or before it is in the log, and no later one
        self.position = position
        #: the position last confirmed to (or to be confirmed to) the server: everything before it is durable
        self.confirmed = Lsn(0)
        #: table snapshots waiting for the stream, ordered by boundary
        self.waiting: list[Snap] = []
        #: whether a table is being read beside the stream (its chunks are appended between passes)
        self.reading = False
        #: a position the stream must reach before a read may end (the server is asked for its WAL end)
        self.want_end = 0
        #: reads wait for their rate ceiling: the loop waits for frames as when idle
        self.throttled = False
        #: ``once``: the server position to drain to, and when to lower it to the flushed WAL
        self.target: int | None = None
        self.retarget_at = float("inf")
        self.begin_session(0.0)

    # -- inputs -------------------------------------------------------------------------------------

    def begin_session(self, now: float) -> None:
        """A new replication session starts streaming at ``now``."""
        self.pending: list[Tx] = []
        self.pending_changes = 0
        self.first_pending = 0.0
        #: the server's WAL end as far as keepalives and commits tell: every commit before it was sent
        self.server_end: int = self.confirmed
        self.last_status = self.last_heartbeat = self.last_discovery = now
        self.asked = False

    def drain_to(self, target: int, retarget_at: float) -> None:
        """``once``: end when the stream reaches ``target``, lowered at ``retarget_at`` (see :class:`Retarget`)."""
        self.target = target
        self.retarget_at = retarget_at

    def read_timeout(self) -> float:
        """How long the next read may wait for frames: short while a group fills."""
        if (self.reading and not self.throttled) or self._snapshot_due(self.server_end):
            return 0.0  # a chunk, or a read's start, follows each pass: only take what already arrived
        return self.tuning.batch_seconds / 4 if self.pending else 0.25

    def committed(self, tx: Tx, now: float) -> Sequence[Command[Tx, Snap]] | Iterator[Command[Tx, Snap]]:
        """A transaction committed on the server and was received whole."""
        self.server_end = max(self.server_end, tx.end_lsn)
        if tx.commit_lsn <= self.position:
            if not self.pending and tx.end_lsn > self.confirmed:
                self.confirmed = Lsn(tx.end_lsn)
            return (Skip(tx),)
        if self._snapshot_due(tx.commit_lsn):
            return self._past_boundary(tx, now)
        self._hold(tx, now)
        return ()

    def keepalive(self, wal_end: int, reply_requested: bool, now: float) -> Sequence[Command[Tx, Snap]]:
        """The server says where its WAL ends, and may ask for a status."""
        self.asked = False
        self.server_end = max(self.server_end, wal_end)
        if reply_requested:
            self.last_status = now
            return (SendStatus(self.confirmed),)
        return ()

    def tick(
        self, now: float, *, got_frames: bool, stop: bool, assembler_idle: bool, wants_discovery: Callable[[], bool]
    ) -> Iterator[Command[Tx, Snap]]:
        """One pass of the loop after a read: close a group, then the idle work, then end or keep alive.

        ``wants_discovery`` is asked after the group is appended: writing it may meet a table that needs one.
        """
        tuning = self.tuning
        if self.pending and (
            not got_frames
            or self.pending_changes >= tuning.batch_changes
            or now - self.first_pending >= tuning.batch_seconds
            or stop
        ):
            yield self._take_group()
            self.last_status = now
        idle = not self.pending and assembler_idle
        if idle:
            yield from self._due_snapshots(self.server_end)
        if wants_discovery() or (idle and now - self.last_discovery >= tuning.discover_seconds):
            yield Discover()
            self.last_discovery = now
        if self.target is not None and idle and now >= self.retarget_at:
            yield Retarget()
        drained = (
            self.target is not None
            and idle
            and self.server_end >= max(self.target, self.want_end)  # a read waiting for the stream to move
            and not self.waiting
            and not self.reading
        )
        if idle and self.server_end - 1 > self.position and (drained or now - self.last_heartbeat >= tuning.heartbeat_seconds):
            yield Heartbeat(Lsn(self.server_end))
            self.last_heartbeat = self.last_status = now
        if drained or (stop and not self.pending):
            yield Finish(self.confirmed)
            return
        if not got_frames and (self.target is not None or self.waiting or self.server_end < self.want_end) and not self.asked:
            # ask where the server's WAL ends: a drain, a waiting snapshot or a read's end needs to know
            yield SendStatus(self.confirmed, reply=True)
            self.asked = True
            self.last_status = now
        elif now - self.last_status >= tuning.status_seconds:
            yield SendStatus(self.confirmed)
            self.last_status = now

    def retarget(self, flushed: int) -> None:
        """``once``: the server's flushed WAL position, read once the commits made before the start are flushed.

        The target is the WAL insert position at the start, which covers commits not yet flushed
        (``synchronous_commit = off``). The server flushes such a commit within three times
        ``wal_writer_delay``; after that the flush position covers every commit made before the start,
        and WAL past it holds no commit of interest (only records such as page pruning, which the server
        may leave unflushed for many seconds). Waiting for those would only delay the exit.
        """
        assert self.target is not None
        self.target = Lsn(min(self.target, flushed))
        self.retarget_at = float("inf")

    def group_durable(self, group: list[Tx]) -> SendStatus:
        """The log fsynced (or Kafka committed) ``group``: the slot may be confirmed up to its end."""
        last = group[-1]
        self.position = group_position(last)
        self.confirmed = Lsn(max(self.confirmed, last.end_lsn))
        return SendStatus(self.confirmed)

    def heartbeat_durable(self, end: Lsn) -> SendStatus:
        """The empty group of a :class:`Heartbeat` is in the log: every commit before ``end`` is held.

        A transaction whose commit record starts exactly at ``end`` may still come, so the log records
        ``end - 1``; the server is told ``end``, from where it resends anything not yet committed.
        """
        self.position = Lsn(end - 1)
        self.confirmed = Lsn(max(self.confirmed, end))
        return SendStatus(self.confirmed)

    def snapshot_durable(self, as_of: Lsn) -> None:
        """A snapshot's group at ``as_of`` is in the log (the confirmation waits for the next group or status)."""
        self.position = as_of

    def take_pending(self) -> list[Tx]:
        """The transactions waiting for a group, handed over (the session ends without confirming them)."""
        group, self.pending, self.pending_changes = self.pending, [], 0
        return group

    # -- internals ----------------------------------------------------------------------------------

    def _hold(self, tx: Tx, now: float) -> None:
        if not self.pending:
            self.first_pending = now
        self.pending.append(tx)
        self.pending_changes += tx.change_count

    def _take_group(self) -> AppendGroup[Tx]:
        return AppendGroup(self.take_pending())

    def _snapshot_due(self, reached: int) -> bool:
        return bool(self.waiting) and self.waiting[0].boundary <= reached

    def _due_snapshots(self, reached: int) -> Iterator[WriteSnapshot[Snap]]:
        while self._snapshot_due(reached):
            yield WriteSnapshot(self.waiting.pop(0))

    def _past_boundary(self, tx: Tx, now: float) -> Iterator[Command[Tx, Snap]]:
        """``tx`` commits at or after a waiting snapshot's boundary, so every transaction before the
        boundary is here: those go into a group, then the snapshot is written, then ``tx`` waits."""
        if self.pending:
            yield self._take_group()
        yield from self._due_snapshots(tx.commit_lsn)
        self._hold(tx, now)
