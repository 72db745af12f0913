"""Capture from a hot standby (PostgreSQL 16 and later, which decode on a standby): why it is exact, and
the nudges the primary is sent.

``CDC_DATABASE_URL`` names the standby: the slot, the stream and every read are there, so the primary
serves no decoding and no snapshot. What must be written goes to ``CDC_PRIMARY_URL``, used for nothing
else: ``cdc setup``'s publication and rules, ``cdc snapshot``'s requests (logical messages), and two
nudges capture sends so that the standby does not wait for the primary's next write —
``pg_log_standby_snapshot()`` while a slot is made (a slot on a standby becomes consistent at the next
running-transactions record it replays; the primary logs one only every 15 s, and only when busy), and
a transaction that takes an ID when a read waits for the stream to reach a position (the primary then
flushes its WAL; the standby receives and replays it).

Why it is exact as from the primary: the standby replays the primary's WAL byte for byte, so a commit
has the same LSN on both, and the stream's positions, the log's watermark and the slot's confirmed
position mean on the standby what they mean on the primary. A read's snapshot on the standby sees
exactly the transactions whose commit records the standby replayed before it, all of them before the
standby's replay position, which stands in for the primary's WAL end wherever capture asks for it
(:meth:`cdc.capture.catalog.Catalog.wal_insert_position`, :func:`cdc.capture.table_snapshots.take_snapshot`).
``hot_standby_feedback`` keeps the primary's VACUUM from removing catalog rows the slot still needs (or
the standby would invalidate the slot), and rows a read's snapshot still sees.

A promotion of that standby keeps capture going: the slot is on it, and from then on it is the
primary, where the writes go (a write the standby refuses is sent to ``CDC_PRIMARY_URL`` only while it
is in recovery). On 14 and 15 a standby cannot decode: setup and capture refuse it in one line.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg

#: seconds between two running-transactions records asked of the primary while a standby's slot is made
NUDGE_SECONDS = 0.2


def in_recovery(conn: psycopg.Connection[tuple[object, ...]]) -> bool:
    """Whether ``conn``'s server is a standby (in recovery)."""
    row = conn.execute("SELECT pg_is_in_recovery()").fetchone()
    return bool(row and row[0])


@contextmanager
def nudging_primary(primary_url: str) -> Iterator[None]:
    """While the body makes a slot on a standby: ask the primary (``primary_url``; empty: nothing) for a
    running-transactions record every :data:`NUDGE_SECONDS`, so the slot becomes consistent at once.
    A primary that cannot be reached only makes the wait longer."""
    if not primary_url:
        yield
        return
    done = threading.Event()

    def nudge() -> None:
        try:
            with psycopg.connect(primary_url, autocommit=True, connect_timeout=10) as primary:
                while not done.is_set():
                    primary.execute("SELECT pg_log_standby_snapshot()")
                    done.wait(NUDGE_SECONDS)
        except psycopg.Error:
            return

    thread = threading.Thread(target=nudge, name="standby-nudge", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(5)
