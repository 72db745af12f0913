"""Failover slots: whether capture's slot is made to survive a promotion, and what ``cdc setup`` checks for it.

PostgreSQL 17 copies a logical slot created with ``FAILOVER true`` to a physical standby (the standby's
slot sync worker, ``sync_replication_slots = on``), and the primary's ``synchronized_standby_slots``
keeps every logical walsender from sending a transaction before the standbys named there have its
WAL. After a promotion the standby's copy of the slot is what capture resumes from: it is confirmed at
or before the primary's (the sync copies positions the primary's slot had), and every transaction it
could resend is in the new primary's WAL. Why nothing is then written twice or out of order is told in
:mod:`cdc.capture.slot_continuity`.

``CDC_SLOT_FAILOVER`` picks the mode:

* ``auto`` (the default): failover on for PostgreSQL 17 and later when a standby is configured, that is
  when the primary's ``synchronized_standby_slots`` names one or ``CDC_STANDBY_URL`` is set; off otherwise;
* ``true``: always on; on 14 to 16, which have no failover slots, one error says so;
* ``false``: off. After a failover the slot is then missing on the new primary: capture stops with one
  line, and ``cdc setup`` + capture re-read the tables (:mod:`cdc.capture.slot_continuity`).

The message logic (:func:`failover_problems`) is pure: the facts are read by :func:`primary_facts` and
:func:`standby_facts`.
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg
from psycopg.conninfo import conninfo_to_dict

from cdc.capture.errors import SourceError, connection_failure
from cdc.capture.standby import in_recovery
from cdc.config.settings import Settings
from cdc.errors import ConfigError

#: The first PostgreSQL with failover slots.
FAILOVER_SERVER = 170000


def _major(server_version: int) -> str:
    return f"{server_version // 10000}.{server_version % 10000}"


def failover_wanted(mode: str, server_version: int, synchronized_standby_slots: str, standby_configured: bool) -> bool:
    """Whether capture's slot is created with ``FAILOVER true`` (see the module docstring for the modes).

    Raises :class:`ConfigError` for ``true`` on a server older than 17.
    """
    if mode == "false":
        return False
    if server_version < FAILOVER_SERVER:
        if mode == "true":
            raise ConfigError(
                f"CDC_SLOT_FAILOVER=true needs PostgreSQL 17 or newer (failover slots), the server is "
                f"{_major(server_version)}; set CDC_SLOT_FAILOVER=auto or false (after a failover capture then stops "
                "and `cdc setup` + capture re-read the tables), or upgrade the server"
            )
        return False
    return mode == "true" or bool(synchronized_standby_slots.strip()) or standby_configured


@dataclass(frozen=True)
class PrimaryFacts:
    """What the primary says about failover."""

    server_version: int
    #: ``synchronized_standby_slots``, split ("" before 17)
    synchronized: tuple[str, ...]
    physical_slots: tuple[str, ...]
    #: the logical slot's ``failover`` flag; None when the slot does not exist yet
    slot_failover: bool | None


@dataclass(frozen=True)
class StandbyFacts:
    """What the standby (``CDC_STANDBY_URL``) says about slot sync."""

    in_recovery: bool
    sync_replication_slots: bool
    hot_standby_feedback: bool
    primary_slot_name: str
    conninfo_has_dbname: bool
    #: the slot is on the standby, synced and persistent (usable after a promotion); None when absent
    slot_synced: bool | None


def failover_problems(primary: PrimaryFacts, standby: StandbyFacts | None, slot: str, database: str) -> list[tuple[bool, str]]:
    """Each missing piece of failover readiness as (``fatal``, one line with its fix).

    ``fatal`` is False for what capture itself brings about (a slot not synced yet is synced once it
    exists and capture confirms a position).
    """
    found: list[tuple[bool, str]] = []
    physical = standby.primary_slot_name if standby is not None and standby.primary_slot_name else ""
    named = physical or (primary.physical_slots[0] if len(primary.physical_slots) == 1 else "<the standby's physical slot>")
    if not primary.synchronized:
        found.append(
            (
                True,
                "synchronized_standby_slots is empty on the primary, so the slot may confirm a transaction the standby "
                "lacks and a promotion would lose it from the source but not from the log; on the primary run "
                f"ALTER SYSTEM SET synchronized_standby_slots = '{named}'; SELECT pg_reload_conf()",
            )
        )
    else:
        for name in primary.synchronized:
            if name not in primary.physical_slots and name != "*":
                found.append(
                    (
                        True,
                        f"synchronized_standby_slots names {name}, which is no physical slot on the primary, so logical "
                        "walsenders wait for it for ever; on the primary run "
                        f"SELECT pg_create_physical_replication_slot('{name}') and give the standby primary_slot_name = '{name}'",
                    )
                )
        if physical and physical not in primary.synchronized:
            found.append(
                (
                    True,
                    f"synchronized_standby_slots ({', '.join(primary.synchronized)}) does not name the standby's slot "
                    f"{physical}; on the primary run ALTER SYSTEM SET synchronized_standby_slots = "
                    f"'{', '.join((*primary.synchronized, physical))}'; SELECT pg_reload_conf()",
                )
            )
    if standby is None:
        return found
    on_standby = "on the standby (CDC_STANDBY_URL) run"
    if not standby.in_recovery:
        found.append((True, "CDC_STANDBY_URL reaches a server that is not in recovery, not a standby; point it at the standby"))
        return found
    if not standby.sync_replication_slots:
        found.append(
            (
                True,
                "the standby does not sync failover slots (sync_replication_slots is off); "
                f"{on_standby} ALTER SYSTEM SET sync_replication_slots = on; SELECT pg_reload_conf()",
            )
        )
    if not standby.hot_standby_feedback:
        found.append(
            (
                True,
                "hot_standby_feedback is off on the standby, which slot sync needs (the primary must keep the rows "
                f"the synced slot still decodes); {on_standby} ALTER SYSTEM SET hot_standby_feedback = on; "
                "SELECT pg_reload_conf()",
            )
        )
    if not standby.primary_slot_name:
        found.append(
            (
                True,
                "the standby streams without a physical slot (primary_slot_name is empty), which slot sync needs; "
                f"{on_standby} ALTER SYSTEM SET primary_slot_name = '{named}'; SELECT pg_reload_conf() "
                f"(on the primary first: SELECT pg_create_physical_replication_slot('{named}') if it is missing)",
            )
        )
    if not standby.conninfo_has_dbname:
        found.append(
            (
                True,
                "the standby's primary_conninfo names no database, which slot sync needs; "
                f"{on_standby} ALTER SYSTEM SET primary_conninfo = '<its conninfo> dbname={database}'; "
                "SELECT pg_reload_conf()",
            )
        )
    if primary.slot_failover is False:
        found.append(
            (
                False,
                f"replication slot {slot} is no failover slot: `cdc setup` makes it one "
                f'(ALTER_REPLICATION_SLOT "{slot}" (FAILOVER true)), then the standby syncs it',
            )
        )
    elif primary.slot_failover and not standby.slot_synced:
        found.append(
            (
                False,
                f"replication slot {slot} is not synced to the standby yet (pg_replication_slots.synced, not "
                "temporary): a promotion now would lose it and capture would re-read the tables; it is synced "
                "once capture has confirmed a position and the standby has replayed it (on the standby, "
                "SELECT pg_sync_replication_slots() syncs at once when sync_replication_slots is off)",
            )
        )
    return found


def _connect(url: str, what: str) -> psycopg.Connection[tuple[object, ...]]:
    try:
        return psycopg.connect(url, autocommit=True, connect_timeout=10)
    except psycopg.OperationalError as exc:
        raise SourceError(f"cannot connect to the {what}: {connection_failure(exc)}; check CDC_{what.upper()}_URL") from None


def synchronized_standby_slots(conn: psycopg.Connection[tuple[object, ...]]) -> str:
    """The primary's ``synchronized_standby_slots`` ("" before PostgreSQL 17, which lacks it)."""
    if conn.info.server_version < FAILOVER_SERVER:
        return ""
    return str(conn.execute("SELECT current_setting('synchronized_standby_slots')").fetchone()[0])  # type: ignore[index]


def primary_facts(conn: psycopg.Connection[tuple[object, ...]], slot: str) -> PrimaryFacts:
    """Read :class:`PrimaryFacts` over an open connection to the primary."""
    version = conn.info.server_version
    synchronized = tuple(name.strip() for name in synchronized_standby_slots(conn).split(",") if name.strip())
    physical = tuple(
        str(row[0]) for row in conn.execute("SELECT slot_name FROM pg_replication_slots WHERE slot_type = 'physical'").fetchall()
    )
    failover: bool | None = None
    if version >= FAILOVER_SERVER:
        row = conn.execute("SELECT failover FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone()
        failover = None if row is None else bool(row[0])
    return PrimaryFacts(version, synchronized, physical, failover)


def standby_facts(url: str, slot: str) -> StandbyFacts:
    """Read :class:`StandbyFacts` from the standby at ``url`` (``CDC_STANDBY_URL``)."""
    with _connect(url, "standby") as conn:

        def setting(name: str) -> str:
            return str(conn.execute("SELECT current_setting(%s, true)", (name,)).fetchone()[0] or "")  # type: ignore[index]

        in_recovery = bool(conn.execute("SELECT pg_is_in_recovery()").fetchone()[0])  # type: ignore[index]
        conninfo = setting("primary_conninfo")
        try:
            has_dbname = bool(conninfo_to_dict(conninfo).get("dbname")) if conninfo else False
        except psycopg.ProgrammingError:
            has_dbname = False
        synced: bool | None = None
        if conn.info.server_version >= FAILOVER_SERVER:
            row = conn.execute(
                "SELECT synced AND NOT temporary FROM pg_replication_slots WHERE slot_name = %s", (slot,)
            ).fetchone()
            synced = None if row is None else bool(row[0])
        return StandbyFacts(
            in_recovery=in_recovery,
            sync_replication_slots=setting("sync_replication_slots") == "on",
            hot_standby_feedback=setting("hot_standby_feedback") == "on",
            primary_slot_name=setting("primary_slot_name"),
            conninfo_has_dbname=has_dbname,
            slot_synced=synced,
        )


def slot_failover(settings: Settings) -> bool:
    """Whether capture's slot is a failover slot on the server ``CDC_DATABASE_URL`` reaches (:func:`failover_wanted`)."""
    with _connect(settings.database_url, "database") as conn:
        if in_recovery(conn):
            return False  # a slot made on a standby cannot be a failover slot (cdc.capture.standby)
        return failover_wanted(
            settings.slot_failover, conn.info.server_version, synchronized_standby_slots(conn), bool(settings.standby_url)
        )
