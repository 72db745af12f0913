"""The read scheduler's decisions, without I/O: room, turns, renewals, giving way, a read's end, stopping.

:class:`SchedulerCore` is told what the reads under way are (:class:`ReadFacts`, one per read, in the order
they began), what the stream reached and what time it is, and answers with decisions that its shell,
:class:`cdc.capture.reads.scheduler.ReadScheduler`, carries out with the reads' files, snapshots and the
log. It reads no socket, clock, catalog or file: time is an argument, so the rules below are tested with
plain values over random interleavings (``tests/cdc/capture/reads/test_scheduler_core.py``):

* **Room.** ``concurrency`` less the reads under way and the tables whose snapshot waits for the stream
  may begin (:meth:`SchedulerCore.room`); a table waiting for its turn makes a discovery due only while
  there is room (:meth:`SchedulerCore.wants_discovery`).
* **Turns.** Only the first ``concurrency`` reads under way take chunks, one per pass, each in turn
  (:meth:`SchedulerCore.next_chunk`); a read not handed in :class:`ReadFacts` gets none.
* **Renewals.** A read by key that has a durable key to go on from and whose snapshot is
  ``renew_seconds`` old (time input) stops and goes on from a new snapshot (:meth:`SchedulerCore.renewals`);
  a read by block ranges, one with nothing durable yet, and one whose last part waits for the stream keep
  theirs. A partial read renewed writes its held changes and goes on as a new one.
* **Giving way.** At most every ``lock_check_seconds`` (:meth:`SchedulerCore.lock_check_due`) the shell
  looks for sessions waiting for a lock a read's snapshot holds; each such read not finishing stops
  (:meth:`SchedulerCore.give_way`).
* **Stopping.** How a read stops (:meth:`SchedulerCore.stop`): a partial read writes its held changes and
  goes on as a new one (parked when its session ended); a read with a durable key is suspended and goes on
  past it; one without starts over (:class:`StartOver`), or, when its session ended, simply ends (the next
  discovery finds its table again).
* **A read's end follows the stream.** Its last rows may be written only once the stream received every
  transaction committing before the end of WAL its snapshot saw, and each of them is past the group
  writer (:meth:`SchedulerCore.stream_reached`); meanwhile the server is asked to flush its WAL at most
  once a second, after half a second of waiting.
* **Starting over.** A truncate or a change of a whole read's columns starts it over; a partial read in
  another shape stops once the group is written (:meth:`SchedulerCore.reshaped`, :meth:`SchedulerCore.truncated`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cdc.capture.lsn import Lsn

#: how long a read's end waits for the stream before the server is asked to flush its WAL, in seconds
NUDGE_AFTER = 0.5
#: the shortest time between two such requests, in seconds
NUDGE_EVERY = 1.0


@dataclass(frozen=True)
class ReadFacts:
    """What the core needs of one read under way (the shell's :class:`~cdc.capture.reads.online_read.OnlineRead`)."""

    #: the shell's handle of the read, handed back in decisions
    read: int
    #: a partial read (``cdc snapshot --where``)
    partial: bool
    #: it has a durable key to go on from (a read by key with a progress record)
    resumable: bool
    #: its last part is read and waits for the stream
    finishing: bool
    #: it is starting over: its files go once the group being written is done
    abandoned: bool
    #: when its snapshot was taken, on the shell's monotonic clock
    started: float


@dataclass(frozen=True)
class Suspend:
    """Stop the read, keep its held changes and progress; it goes on past its last durable key from a new snapshot."""

    read: int


@dataclass(frozen=True)
class StopPartial:
    """Stop the partial read: its held changes go to the log (now, or with ``park`` first thing in the next
    session) and it goes on as a new partial read past its last durable key."""

    read: int
    park: bool = False


@dataclass(frozen=True)
class StartOver:
    """The read starts over from a new snapshot: the gate drops its table's changes until then."""

    read: int


@dataclass(frozen=True)
class End:
    """Forget the read (its holding file goes); the next discovery finds its table again."""

    read: int


#: how a read stops
Stop = Suspend | StopPartial | StartOver | End


@dataclass(frozen=True)
class Reached:
    """Whether a read's last rows may be written now, and what the shell does meanwhile."""

    #: the stream received, and wrote or held, every transaction the read's snapshot sees
    done: bool
    #: ask the server where its WAL ends until the stream is there (``None``: nothing to ask)
    want_end: Lsn | None = None
    #: ask the server to flush its WAL now
    nudge: bool = False


class SchedulerCore:
    """The reads' scheduling state: whose turn it is, when locks are next looked for, when the server was
    last asked to flush its WAL, and what makes a discovery due. Plain values in, decisions out."""

    def __init__(self, concurrency: int, renew_seconds: float, lock_check_seconds: float) -> None:
        self.concurrency = concurrency
        self.renew_seconds = renew_seconds
        self.lock_check_seconds = lock_check_seconds
        #: a table's columns changed in the stream, or a read was asked for, since the last discovery
        self.shape_changed = False
        #: a read stopped, or waits for a new snapshot: discover (take its new snapshot) next
        self.resume_due = False
        self._turn = 0  # the read whose chunk came last, among the first ``concurrency``
        self._next_lock_check = 0.0
        self._next_nudge = 0.0
        self._waiting_since: float | None = None  # since when a read's end waits for the stream

    def room(self, reading: int, waiting: int) -> int:
        """How many more reads may begin: ``concurrency`` less the ``reading`` under way and the ``waiting``
        tables whose snapshot waits for the stream (negative when over)."""
        return self.concurrency - reading - waiting

    def wants_discovery(self, wanted: bool, reading: int, waiting: int) -> bool:
        """Whether a discovery is due now: tables waiting for their turn (``wanted``) while there is room,
        a changed shape or a request, or a read waiting for a new snapshot."""
        return (wanted and self.room(reading, waiting) > 0) or self.shape_changed or self.resume_due

    def discovered(self) -> None:
        """A discovery was carried out: what made it due is met by it."""
        self.shape_changed = self.resume_due = False

    def lock_check_due(self, now: float) -> bool:
        """Whether the shell looks for sessions waiting for a read's locks at ``now`` (at most every
        ``lock_check_seconds``; a ``True`` starts the next interval)."""
        if now < self._next_lock_check:
            return False
        self._next_lock_check = now + self.lock_check_seconds
        return True

    def give_way(self, reads: Sequence[ReadFacts], blocking: set[int]) -> list[Stop]:
        """How each read whose snapshot holds a lock another session waits for stops (``blocking``: their
        handles). A read whose last part waits for the stream keeps its snapshot: it ends within a moment."""
        return [self.stop(read) for read in reads if read.read in blocking and not read.finishing]

    def renewals(self, reads: Sequence[ReadFacts], now: float) -> list[Stop]:
        """How each read by key stops whose snapshot is ``renew_seconds`` old at ``now``, with a durable key to
        go on from and not finishing: it goes on from a new snapshot (so none is held much longer than that
        and a chunk). A read by block ranges, or one with nothing durable yet, keeps its snapshot."""
        return [
            self.stop(read)
            for read in reads
            if read.resumable and not read.finishing and now - read.started >= self.renew_seconds
        ]

    def stop(self, read: ReadFacts, *, session_ended: bool = False) -> Stop:
        """How ``read`` stops when it must give way (a lock, a renewal, a lost session): a partial read goes
        on as a new one; a read by key with a durable key is suspended; any other starts over (or, when
        its session ended, ends: the next session's discovery reads its table from a new snapshot)."""
        if read.partial:
            self.resume_due = True
            return StopPartial(read.read, park=session_ended)
        if not read.resumable and session_ended:
            return End(read.read)
        self.resume_due = True
        return StartOver(read.read) if not read.resumable else Suspend(read.read)

    def next_chunk(self, reads: Sequence[ReadFacts]) -> int | None:
        """The read whose chunk comes next: the first ``concurrency`` reads take turns (``None``: no read)."""
        running = reads[: self.concurrency]
        if not running:
            return None
        self._turn = (self._turn + 1) % len(running)
        return running[self._turn].read

    def stream_reached(self, end: Lsn, server_end: int, pending: bool, now: float) -> Reached:
        """Whether a read's last rows may be written at ``now``: the stream received every transaction
        committing before ``end`` (the WAL's end when its snapshot was taken: ``server_end >= end``) and
        none of them waits to be appended (``pending``)."""
        if server_end >= end:
            self._waiting_since = None
            return Reached(done=not pending)
        if self._waiting_since is None:
            self._waiting_since = now
        nudge = now - self._waiting_since >= NUDGE_AFTER and self.nudge_due(now)
        return Reached(done=False, want_end=end, nudge=nudge)

    def nudge_due(self, now: float) -> bool:
        """Whether the server may be asked to flush its WAL at ``now`` (at most once a second)."""
        if now < self._next_nudge:
            return False
        self._next_nudge = now + NUDGE_EVERY
        return True

    def reshaped(self, reads: Sequence[ReadFacts]) -> tuple[list[int], list[int]]:
        """Reads whose table's columns changed in the stream to another shape than theirs: (partial reads
        that stop once the group is written, whole reads that start over now)."""
        self.shape_changed = True
        live = [read for read in reads if not read.abandoned]
        return [read.read for read in live if read.partial], [read.read for read in live if not read.partial]

    def truncated(self, reads: Sequence[ReadFacts]) -> list[int]:
        """Of the reads whose table a group truncated, those that start over (whole reads not already
        starting over: rows read before and after a ``TRUNCATE`` cannot stand beside one truncate marker;
        a partial read's held changes carry the truncate)."""
        return [read.read for read in reads if not read.partial and not read.abandoned]
