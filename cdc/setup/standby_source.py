"""Setting up capture from a hot standby (:mod:`cdc.capture.standby` says how capture reads from one and why
it is exact): what setup and capture check first, and where what must be written goes.

``CDC_DATABASE_URL`` names the standby, ``CDC_PRIMARY_URL`` its primary; on 14 and 15, which cannot decode
on a standby, both commands refuse in one line.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import psycopg

from cdc.capture.errors import SourceError, connection_failure
from cdc.capture.standby import in_recovery

if TYPE_CHECKING:
    from cdc.config.settings import Settings

#: the oldest PostgreSQL that decodes on a standby
OLDEST_STANDBY = 160000


def standby_problems(conn: psycopg.Connection[tuple[object, ...]], settings: Settings) -> list[tuple[str, str]]:
    """What keeps capture from the standby ``conn`` reaches, as (check name, message with its fix)."""
    version = conn.info.server_version
    if version < OLDEST_STANDBY:
        return [
            (
                "standby",
                f"CDC_DATABASE_URL names a hot standby of PostgreSQL {version // 10000}, which cannot decode on a "
                "standby (16 and later can); point CDC_DATABASE_URL at the primary",
            )
        ]
    problems: list[tuple[str, str]] = []
    row = conn.execute("SHOW hot_standby_feedback").fetchone()
    if not row or row[0] != "on":
        problems.append(
            (
                "hot_standby_feedback",
                "hot_standby_feedback is off on the standby CDC_DATABASE_URL names: the primary's VACUUM may remove "
                "catalog rows its slot needs, which invalidates the slot; set hot_standby_feedback = on there and reload",
            )
        )
    if not settings.primary_url:
        problems.append(
            (
                "CDC_PRIMARY_URL",
                "CDC_DATABASE_URL names a hot standby and CDC_PRIMARY_URL is not set; set it to the primary's URL "
                "(setup creates the publication there, and capture asks it to log what the standby waits for)",
            )
        )
        return problems
    try:
        with psycopg.connect(settings.primary_url, autocommit=True, connect_timeout=10) as primary:
            if in_recovery(primary):
                problems.append(("CDC_PRIMARY_URL", "CDC_PRIMARY_URL names a standby too; set it to the primary"))
            else:
                level = primary.execute("SHOW wal_level").fetchone()
                if not level or level[0] != "logical":
                    problems.append(
                        (
                            "primary wal_level",
                            f"wal_level is {level[0] if level else '?'} on the primary, decoding on its standby needs "
                            "logical; set wal_level = logical on the primary and restart it",
                        )
                    )
    except psycopg.OperationalError as exc:
        problems.append(("CDC_PRIMARY_URL", f"cannot connect to the primary: {connection_failure(exc)}; check CDC_PRIMARY_URL"))
    return problems


def writable_url(settings: Settings) -> str:
    """The URL DDL and messages go to: ``CDC_PRIMARY_URL`` while ``CDC_DATABASE_URL`` names a standby,
    else ``CDC_DATABASE_URL`` (a standby promoted since is the primary)."""
    if not settings.primary_url:
        return settings.database_url
    try:
        with psycopg.connect(settings.database_url, autocommit=True, connect_timeout=10) as conn:
            return settings.primary_url if in_recovery(conn) else settings.database_url
    except psycopg.OperationalError as exc:
        raise SourceError(f"cannot connect to the source database: {connection_failure(exc)}; check CDC_DATABASE_URL") from None
