"""Source → log: the replication slot's position against the server's WAL (:func:`measure_source`), for
``cdc lag`` and the slot's gauges.

The age of the oldest unconfirmed change is the commit time of the
first transaction after the slot's confirmed position, read by peeking the slot when no capture process
holds it; while capture streams, PostgreSQL's own ``flush_lag`` of the walsender stands in for it.
"""

from __future__ import annotations

import shutil
import struct
import time
from pathlib import Path
from typing import Any

import psycopg

from cdc.capture.errors import SourceError, connection_failure
from cdc.capture.lsn import Lsn
from cdc.capture.transport.framing import PG_EPOCH_OFFSET_US
from cdc.config.redact import redact_url
from cdc.config.settings import Settings
from cdc.observe.lag_report import SourceLag
from cdc.setup.failover import FAILOVER_SERVER, standby_facts


def _size_setting(conn: psycopg.Connection[Any], name: str) -> int | None:
    """A size GUC in bytes (``-1`` -> None, meaning unlimited)."""
    row = conn.execute("SELECT setting::bigint, unit FROM pg_settings WHERE name = %s", (name,)).fetchone()
    if row is None or row[0] < 0:
        return None
    units = {"B": 1, "kB": 1024, "8kB": 8192, "MB": 1 << 20, "GB": 1 << 30}
    return int(row[0]) * units.get(row[1] or "B", 1)


def _oldest_unconfirmed_age(conn: psycopg.Connection[Any], slot: str, publication: str) -> float | None:
    """Seconds since the commit of the first transaction the slot has not confirmed (0: nothing pending).

    Peeking decodes without consuming: the slot's position does not move.
    """
    row = conn.execute(
        "SELECT data FROM pg_logical_slot_peek_binary_changes(%s, NULL, 1, "
        "'proto_version', '1', 'publication_names', %s) LIMIT 1",
        (slot, publication),
    ).fetchone()
    if row is None:
        return 0.0  # the WAL behind the slot holds no change of a published table
    data = bytes(row[0])
    if data[:1] != b"B" or len(data) < 21:
        return None
    _final_lsn, commit_us, _xid = struct.unpack_from(">QqI", data, 1)
    return max(0.0, time.time() - (commit_us + PG_EPOCH_OFFSET_US) / 1_000_000)


def measure_source(settings: Settings, *, peek: bool = True, connect_timeout: int = 10) -> SourceLag:
    """Query the slot; a source that cannot be reached raises :class:`SourceError`.

    ``peek``: while no capture holds the slot, find the age of its oldest unconfirmed change by decoding
    from it (:func:`_oldest_unconfirmed_age`). That decodes the WAL from the slot's restart position, so a
    caller asking often (a metrics scrape) passes ``False`` and the age is left unknown.
    """
    lag = SourceLag(slot=settings.slot, exists=False)
    try:
        conn = psycopg.connect(settings.database_url, autocommit=True, connect_timeout=connect_timeout)
    except psycopg.OperationalError as exc:
        reason = connection_failure(exc)
        raise SourceError(
            f"cannot reach the source {settings.safe_database_url()}: {redact_url(reason)}; check CDC_DATABASE_URL"
        ) from None
    with conn:
        lag.server = f"{conn.info.host}:{conn.info.port}"
        in_recovery, position = conn.execute(  # a standby has no current WAL position: what it replayed stands in
            "SELECT pg_is_in_recovery(), (CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() "
            "ELSE pg_current_wal_lsn() END)::text"
        ).fetchone()  # type: ignore[misc]
        lag.role = "standby" if in_recovery else "primary"
        current = Lsn.parse(position or "0/0")
        lag.current_lsn = str(current)
        if conn.info.server_version >= FAILOVER_SERVER:
            flag = conn.execute("SELECT failover FROM pg_replication_slots WHERE slot_name = %s", (settings.slot,)).fetchone()
            lag.failover = None if flag is None else bool(flag[0])
        if settings.standby_url:
            standby = standby_facts(settings.standby_url, settings.slot)  # after a promotion it is no standby
            lag.synced_on_standby = bool(standby.slot_synced) if standby.in_recovery else None
        lag.max_slot_wal_keep_size_bytes = _size_setting(conn, "max_slot_wal_keep_size")
        row = conn.execute(
            "SELECT active, wal_status, safe_wal_size, confirmed_flush_lsn::text, restart_lsn::text, age(catalog_xmin) "
            "FROM pg_replication_slots WHERE slot_name = %s",
            (settings.slot,),
        ).fetchone()
        if row is None:
            return lag
        active, wal_status, safe_wal_size, confirmed, restart, xmin_age = row
        lag.exists, lag.active, lag.wal_status = True, bool(active), wal_status
        lag.catalog_xmin_age = int(xmin_age) if xmin_age is not None else None
        lag.safe_wal_size_bytes = int(safe_wal_size) if safe_wal_size is not None else None
        if confirmed:
            lag.confirmed_flush_lsn = confirmed
            lag.wal_bytes_behind = max(0, current - Lsn.parse(confirmed))
        if restart:
            lag.retained_wal_bytes = max(0, current - Lsn.parse(restart))
        if peek and lag.wal_bytes_behind and not lag.active and wal_status != "lost":
            try:
                lag.oldest_unconfirmed_age_seconds = _oldest_unconfirmed_age(conn, settings.slot, settings.publication)
            except psycopg.Error:
                lag.oldest_unconfirmed_age_seconds = None
        elif lag.active:
            flush_lag = conn.execute(
                "SELECT extract(epoch FROM r.flush_lag) FROM pg_stat_replication r "
                "JOIN pg_replication_slots s ON s.active_pid = r.pid WHERE s.slot_name = %s",
                (settings.slot,),
            ).fetchone()
            if flush_lag and flush_lag[0] is not None and lag.wal_bytes_behind:
                lag.oldest_unconfirmed_age_seconds = float(flush_lag[0])
        if lag.wal_bytes_behind == 0:
            lag.oldest_unconfirmed_age_seconds = 0.0
        lag.free_disk_bytes = _source_free_disk(conn)
    return lag


def _source_free_disk(conn: psycopg.Connection[Any]) -> int | None:
    """Free bytes on the source's data directory when it is on this machine and visible to us."""
    try:
        row = conn.execute("SELECT current_setting('data_directory')").fetchone()
    except psycopg.Error:
        return None
    if not row or not Path(row[0]).exists():
        return None
    try:
        return shutil.disk_usage(row[0]).free
    except OSError:
        return None
