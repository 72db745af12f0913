"""Whether the replication slot still continues the log, or changes were lost between them.

Capture confirms a position to the slot only after the log holds every transaction before it, and
the log's watermark position P then is the end of the last transaction's commit record minus one
(or the server's WAL end minus one, for a heartbeat), so the slot's ``confirmed_flush_lsn`` never
exceeds P + 1 for the slot this log was written from. A slot confirmed further was not: it was
created anew (``cdc setup`` after the slot was lost or dropped) or advanced by another client, and the
transactions committed between P and its position were never streamed into the log. Streaming from
it would leave that gap for good; capture reads every table again instead (truncate markers supersede
what the log holds, see :mod:`cdc.capture.initial_snapshot`).

**Across a promotion** (a failover slot, :mod:`cdc.setup.failover`) the slot capture resumes from is the
standby's synced copy, and the log's commit-LSN recognition of what it already holds still holds:

* the copy is confirmed at or before the primary's slot (the sync copies positions the primary's slot
  had), which never passed P + 1: so it continues the log (no gap is reported) and resends at most
  transactions the log holds, each skipped by its commit LSN <= P;
* every transaction in the log is in the new primary's WAL at the same LSN: the primary's
  ``synchronized_standby_slots`` keeps logical walsenders from sending a transaction before the
  standby has flushed its WAL, and a promotion replays all the WAL the standby flushed; the standby's
  WAL up to there is the primary's, byte for byte;
* the new timeline begins where that WAL ends, so every transaction committed after the promotion has
  a commit LSN above everything the log holds, and streams in commit order after it.

A transaction the primary committed but the standby never received is lost by the promotion, from
the source as from the log: capture never had it. A slot the promotion lost (14 to 16, or a slot not
synced yet) is missing on the new primary: capture stops with one line, and the slot ``cdc setup``
then creates is confirmed past P + 1, so the tables are read again as above.
"""

from __future__ import annotations

import logging

import psycopg

from cdc.capture.errors import SlotError, SourceError, connection_failure
from cdc.capture.lsn import Lsn

log = logging.getLogger("cdc.capture")


def slot_confirmed(url: str, slot: str) -> Lsn | None:
    """The slot's ``confirmed_flush_lsn``; ``None`` when there is no such slot (or it has none yet)."""
    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
            row = conn.execute(
                "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", (slot,)
            ).fetchone()
    except psycopg.OperationalError as exc:
        raise SourceError(f"cannot connect to the source database: {connection_failure(exc)}; check CDC_DATABASE_URL") from None
    if row is None or row[0] is None:
        return None
    return Lsn.parse(str(row[0]))


def gap_after(position: Lsn, confirmed: Lsn | None) -> bool:
    """Whether a slot confirmed at ``confirmed`` skipped transactions after the log's ``position``.

    Positions capture writes are one below a record boundary (WAL records start 8-byte aligned), so they
    end in 7 modulo 8. A position on a boundary is a commit LSN written by an earlier capture version,
    which confirmed the slot at the end of that commit record, somewhere past the position: no gap can
    be told from that, so none is assumed (the next group writes a position of the current form).
    """
    if position == 0 or confirmed is None or position % 8 == 0:
        return False
    return confirmed > position + 1


def slot_skipped_ahead(url: str, slot: str, position: Lsn) -> bool:
    """Whether ``slot`` does not continue a log at ``position`` (said in a warning): every table is to be read again."""
    confirmed = slot_confirmed(url, slot)
    if not gap_after(position, confirmed):
        return False
    log.warning(
        "replication slot %s is confirmed at %s but the log holds transactions only up to %s: the slot was "
        "recreated or advanced by another client, and what committed in between never reached the log; "
        "every captured table is read again, superseding the log's rows",
        slot,
        confirmed,
        Lsn(position + 1),
    )
    return True


def slot_lost(url: str, slot: str) -> str | None:
    """Why the log cannot go on from ``slot``, said as the end of a sentence: it is missing, or it was
    invalidated (its WAL removed past ``max_slot_wal_keep_size``, or a conflict on a standby); ``None``
    when it can."""
    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
            row = conn.execute("SELECT to_jsonb(s) FROM pg_replication_slots s WHERE slot_name = %s", (slot,)).fetchone()
    except psycopg.OperationalError as exc:
        raise SourceError(f"cannot connect to the source database: {connection_failure(exc)}; check CDC_DATABASE_URL") from None
    if row is None:
        return "is missing"
    facts: dict[str, object] = row[0]
    # invalidation_reason from 17 on, conflicting on 16 (a standby's slot), wal_status on every version
    reason = facts.get("invalidation_reason") or ("conflict on the standby" if facts.get("conflicting") else None)
    if reason is None and facts.get("wal_status") == "lost":
        reason = "wal_status lost: WAL it needed was removed, past max_slot_wal_keep_size"
    return None if reason is None else f"was invalidated ({reason})"


def require_continuity(url: str, slot: str, position: Lsn) -> None:
    """Refuse to stream from a slot recreated or advanced elsewhere while capture reconnected."""
    confirmed = slot_confirmed(url, slot)
    if gap_after(position, confirmed):
        raise SlotError(
            f"replication slot {slot} was recreated or advanced elsewhere while capture "
            f"reconnected (confirmed at {confirmed}, the log holds transactions up to {position}); "
            "start capture again: it reads every captured table again, superseding the log's rows"
        )


def drop_idle_slot(url: str, slot: str) -> None:
    """Drop ``slot`` before a first snapshot makes it anew; a slot another process streams from is an error."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone()
        if row is None:
            return
        if row[0] is not None:
            raise SlotError(f"replication slot {slot} is in use by PID {row[0]}; stop the other capture first")
        conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))


def idle_slot_position(url: str, slot: str) -> Lsn | None:
    """The ``confirmed_flush_lsn`` of ``slot`` when nobody streams from it; ``None`` when there is no such
    logical slot (or it has no position yet); a slot another process streams from is an error."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT active_pid, confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", (slot,)
        ).fetchone()
    if row is None:
        return None
    if row[0] is not None:
        raise SlotError(f"replication slot {slot} is in use by PID {row[0]}; stop the other capture first")
    return None if row[1] is None else Lsn.parse(str(row[1]))
