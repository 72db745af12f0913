"""Whether the replication slot still continues the log, or changes were lost between them.

Capture confirms a position to the slot only after the log holds every transaction before it, and
the log's watermark position P then is the end of the last transaction's commit record minus one
(or the server's WAL end minus one, for a heartbeat), so the slot's ``confirmed_flush_lsn`` never
exceeds P + 1 for the slot this log was written from. A slot confirmed further was not: it was
created anew (``cdc setup`` after the slot was lost or dropped) or advanced by another client, and the
transactions committed between P and its position were never streamed into the log. Streaming from
it would leave that gap for good; capture takes a new snapshot instead (its truncate markers supersede
what the log holds, see :mod:`cdc.coordinator`).
"""

from __future__ import annotations

import psycopg

from cdc.errors import SourceError
from cdc.lsn import Lsn


def slot_confirmed(url: str, slot: str) -> Lsn | None:
    """The slot's ``confirmed_flush_lsn``; ``None`` when there is no such slot (or it has none yet)."""
    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
            row = conn.execute(
                "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", (slot,)
            ).fetchone()
    except psycopg.OperationalError as exc:
        raise SourceError(
            f"cannot connect to the source database: {str(exc).strip().splitlines()[0]}; check CDC_DATABASE_URL"
        ) from None
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
