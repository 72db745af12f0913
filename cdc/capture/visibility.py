"""Which committed transactions a snapshot sees, told from the snapshot's ``pg_current_snapshot()`` text.

A read beside the stream takes plain REPEATABLE READ snapshots (no replication slot), so no LSN splits
the transactions it sees from those it does not: one that committed just after the snapshot can have
its commit record before a transaction the snapshot sees, and one whose commit record is written may
still be invisible for a moment (the server makes it visible after the commit record, after a
synchronous standby answers when there is one). What the snapshot sees is decided by transaction IDs
alone: a committed transaction is visible exactly when its ID is below ``xmin``, or below ``xmax`` and
not among the IDs in progress (``xip``). The stream tells every transaction's top-level ID (pgoutput's
``BEGIN``), so each change is judged exactly against each snapshot.

The stream's IDs are 32-bit; the snapshot's are 64-bit (epoch and ID). An ID is placed in the epoch
that puts it nearest below ``xmax``: a transaction the stream sends now is far younger than 2^31
transactions, which PostgreSQL's wraparound protection guarantees (an ID just past an epoch's end, of a
transaction that began after the snapshot, is placed in the next epoch).
"""

from __future__ import annotations

from dataclasses import dataclass

_WRAP = 1 << 32


@dataclass(frozen=True, slots=True)
class SnapshotXids:
    """A snapshot's ``xmin``, ``xmax`` and the IDs in progress between them (64-bit, as PostgreSQL gives them)."""

    xmin: int
    xmax: int
    xip: frozenset[int] = frozenset()

    @classmethod
    def parse(cls, text: str) -> SnapshotXids:
        """From ``pg_current_snapshot()::text``: ``xmin:xmax:xip,xip,...``."""
        xmin, xmax, xip = text.split(":")
        return cls(int(xmin), int(xmax), frozenset(int(x) for x in xip.split(",") if x))

    def text(self) -> str:
        """The ``pg_current_snapshot()`` text form (:meth:`parse` reads it back)."""
        return f"{self.xmin}:{self.xmax}:{','.join(str(x) for x in sorted(self.xip))}"

    def full(self, xid: int) -> int:
        """The 64-bit ID of the stream's 32-bit ``xid``."""
        full = (self.xmax & ~(_WRAP - 1)) | (xid & (_WRAP - 1))
        if full >= self.xmax + (_WRAP >> 1):
            return full - _WRAP
        return full + _WRAP if full < self.xmax - (_WRAP >> 1) else full

    def sees(self, xid: int) -> bool:
        """Whether the snapshot sees the committed transaction ``xid`` (32-bit, as the stream sends it)."""
        full = self.full(xid)
        return full < self.xmin or (full < self.xmax and full not in self.xip)


#: how many IDs :class:`ReceivedXids` takes in past those it kept at its last pruning before it asks to be pruned
FORGET_AFTER = 10_000


class ReceivedXids:
    """The IDs of the transactions the stream received that a new snapshot might not see yet.

    A read's boundary B is the stream's reach: every transaction committing before B was received, and
    the read drops its changes as the snapshot's. PostgreSQL writes a commit record before it makes the
    transaction visible (a moment, or as long as a synchronous standby takes to answer), so a snapshot
    taken after the stream received a transaction may still not see it; such a snapshot is refused
    (:func:`~cdc.capture.table_snapshots.take_snapshot`). IDs below a snapshot's ``xmin`` are seen by
    every later snapshot and are forgotten.

    Bounded (promise 11): the stream adds every transaction's ID, and a snapshot for a read may not be
    taken for months, so the set alone would grow by each one (an int and its slot: about 25 MB an hour
    at 100 transactions a second, capture's memory climbing steadily under a steady load). Once
    :attr:`due` (it took :data:`FORGET_AFTER` IDs past those left at its last pruning), discovery prunes
    it with a snapshot of the server taken now (:meth:`forget_seen`): a committed transaction a snapshot
    sees is seen by every later snapshot of that server, so only the few not visible yet stay. Counting
    from what was left keeps a set that cannot shrink (commits a synchronous standby holds back) from
    asking on every pass.
    """

    def __init__(self, forget_after: int = FORGET_AFTER) -> None:
        self._xids: set[int] = set()
        self._forget_after = forget_after
        self._kept = 0  # how many IDs the last pruning left

    def add(self, xid: int) -> None:
        """The stream received the committed transaction ``xid``."""
        self._xids.add(xid)

    @property
    def due(self) -> bool:
        """Whether the set grew enough since its last pruning to be pruned (:meth:`forget_seen`)."""
        return len(self._xids) >= self._kept + self._forget_after

    def forget_seen(self, snapshot: SnapshotXids) -> None:
        """Forget the IDs ``snapshot`` (the server's, taken after each of them was received) sees."""
        self._xids = {xid for xid in self._xids if not snapshot.sees(xid)}
        self._kept = len(self._xids)

    def unseen_by(self, snapshot: SnapshotXids) -> int:
        """How many received transactions ``snapshot`` does not see (those it sees for sure are forgotten)."""
        self._xids = {xid for xid in self._xids if snapshot.full(xid) >= snapshot.xmin}
        self._kept = len(self._xids)
        return sum(not snapshot.sees(xid) for xid in self._xids)

    def __len__(self) -> int:
        return len(self._xids)

    def __bool__(self) -> bool:
        return bool(self._xids)
