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


class ReceivedXids:
    """The IDs of the transactions the stream received that a new snapshot might not see yet.

    A read's boundary B is the stream's reach: every transaction committing before B was received, and
    the read drops its changes as the snapshot's. PostgreSQL writes a commit record before it makes the
    transaction visible (a moment, or as long as a synchronous standby takes to answer), so a snapshot
    taken after the stream received a transaction may still not see it; such a snapshot is refused
    (:func:`~cdc.capture.table_snapshots.take_snapshot`). IDs below a snapshot's ``xmin`` are seen by
    every later snapshot and are forgotten.
    """

    def __init__(self) -> None:
        self._xids: set[int] = set()

    def add(self, xid: int) -> None:
        """The stream received the committed transaction ``xid``."""
        self._xids.add(xid)

    def unseen_by(self, snapshot: SnapshotXids) -> int:
        """How many received transactions ``snapshot`` does not see (those it sees for sure are forgotten)."""
        self._xids = {xid for xid in self._xids if snapshot.full(xid) >= snapshot.xmin}
        return sum(not snapshot.sees(xid) for xid in self._xids)

    def __bool__(self) -> bool:
        return bool(self._xids)
