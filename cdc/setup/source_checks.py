"""Prerequisite checks of the source database (:func:`run_checks`), before ``cdc setup`` creates anything.

Each failed check is one :class:`~cdc.setup.check.Check` whose ``message`` says what is wrong and how to
fix it; the set-up command prints one line per failure. Checks only read the catalog; the publication and
the slot are created afterwards by :mod:`cdc.setup.source_objects`, and the checks the views file and a
log in Kafka call for are :mod:`cdc.setup.views_and_kafka_checks`'s.

Tables are judged as the publication covers them, or would cover them once created (:mod:`cdc.capture.coverage`),
so that ``cdc setup`` never creates a publication that makes the application's updates or deletes fail.
:func:`capture_problems` is the part of these checks ``cdc capture`` repeats before it makes a slot.
"""

from __future__ import annotations

import psycopg

from cdc.capture.coverage import Connection, coverage, publication_exists, sql_name, table_list_problems
from cdc.capture.standby import in_recovery
from cdc.config.settings import Settings
from cdc.setup.capture_rules import published_masks
from cdc.setup.check import Check
from cdc.setup.failover import failover_problems, failover_wanted, primary_facts, standby_facts, synchronized_standby_slots
from cdc.setup.publication_rule_checks import generated_column_problems, rule_problems
from cdc.setup.source_objects import connect, declared_rules
from cdc.setup.standby_source import standby_problems
from cdc.setup.views_and_kafka_checks import kafka_check, kafka_toast_check, views_file_check


def run_checks(settings: Settings) -> list[Check]:
    """Every prerequisite of capture, in a fixed order."""
    checks: list[Check] = []
    with connect(settings.database_url) as conn:
        standby = in_recovery(conn)
        checks.append(server_version_check(conn.info.server_version))
        checks.extend(Check(name, False, message) for name, message in (standby_problems(conn, settings) if standby else []))
        checks.append(_wal_level_check(conn))
        checks.append(_replication_check(conn))
        slots_max = int(conn.execute("SHOW max_replication_slots").fetchone()[0])  # type: ignore[index, call-overload, arg-type]
        slots_used = int(conn.execute("SELECT count(*) FROM pg_replication_slots").fetchone()[0])  # type: ignore[index, call-overload, arg-type]
        slot = conn.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s", (settings.slot,)).fetchone()
        # capture's own slot and WAL sender (a table read beside the stream needs neither:
        # cdc.capture.table_snapshots)
        slots_needed = 0 if slot is not None else 1
        checks.append(
            Check(
                "max_replication_slots",
                slots_used + slots_needed <= slots_max,
                f"{max(0, slots_max - slots_used)} of {slots_max} replication slots are free, capture needs "
                f"{slots_needed} (its slot); raise max_replication_slots or drop an unused slot",
            )
        )
        senders_max = int(conn.execute("SHOW max_wal_senders").fetchone()[0])  # type: ignore[index, call-overload, arg-type]
        senders_used = int(conn.execute("SELECT count(*) FROM pg_stat_replication").fetchone()[0])  # type: ignore[index, call-overload, arg-type]
        senders_needed = 0 if slot is not None and slot[0] else 1  # a running capture already holds one
        checks.append(
            Check(
                "max_wal_senders",
                senders_used + senders_needed <= senders_max,
                f"{max(0, senders_max - senders_used)} of {senders_max} WAL senders are free, capture needs "
                f"{senders_needed} (its stream); raise max_wal_senders and restart PostgreSQL",
            )
        )
        checks.extend(_publication_checks(conn, settings))
        checks.extend(Check("publication rules", False, problem) for problem in rule_problems(conn, settings.publication))
        checks.extend(Check("capture rules", False, problem) for problem in declared_rules(conn, settings).problems)
        checks.extend(
            Check("CDC_TABLES", False, problem) for problem in table_list_problems(conn, settings.publication, settings.tables)
        )
        checks.extend(_table_checks(conn, settings))
        checks.append(views_file_check(conn, settings))
        if not standby:  # a slot on a standby is no failover slot
            checks.extend(_failover_checks(conn, settings))
    if settings.uses_kafka:
        checks.append(kafka_check(settings))
    return checks


def _failover_checks(conn: psycopg.Connection[tuple[object, ...]], settings: Settings) -> list[Check]:
    """When the slot is a failover slot (:mod:`cdc.setup.failover`): the primary's and, given ``CDC_STANDBY_URL``,
    the standby's settings slot sync needs, one check per missing piece. ``CDC_SLOT_FAILOVER=true`` on a
    server older than 17 raises its :class:`~cdc.errors.ConfigError`."""
    version = conn.info.server_version
    if not failover_wanted(settings.slot_failover, version, synchronized_standby_slots(conn), bool(settings.standby_url)):
        return []
    standby = standby_facts(settings.standby_url, settings.slot) if settings.standby_url else None
    problems = failover_problems(primary_facts(conn, settings.slot), standby, settings.slot, conn.info.dbname)
    if not problems:
        return [Check("failover", True, "")]
    return [Check("failover", not fatal, message, warning=not fatal) for fatal, message in problems]


#: Pointed to by the problems ``cdc capture`` finds, which ``cdc setup --check-only`` finds with the rest.
_SEE_SETUP = "`cdc setup --check-only` checks every prerequisite of capture"


def capture_problems(settings: Settings) -> list[str]:
    """What stops capture before it starts, each with setup's fix: wal_level, REPLICATION, publication, CDC_TABLES.

    Capture runs these before it touches the slot, so that a source it cannot capture leaves no slot
    behind holding WAL, and a ``CDC_TABLES`` entry that would capture nothing is refused instead of
    being silently empty.
    """
    with connect(settings.database_url) as conn:
        first = (server_version_check(conn.info.server_version), _wal_level_check(conn), _replication_check(conn))
        problems = [f"{check.message}; {_SEE_SETUP}" for check in first if not check.ok]
        standby = [message for _, message in standby_problems(conn, settings)] if in_recovery(conn) else []
        if standby:  # the source itself is wrong: what else is missing is told once it is right
            return problems + standby
        if not publication_exists(conn, settings.publication):
            problems.append(
                f"publication {settings.publication} does not exist; run `cdc setup` to create it (it first checks "
                "every table it would publish), or set CDC_PUBLICATION to the publication to capture"
            )
        problems.extend(
            f"{problem}; {_SEE_SETUP}" for problem in table_list_problems(conn, settings.publication, settings.tables)
        )
        problems.extend(f"{problem}; {_SEE_SETUP}" for problem in rule_problems(conn, settings.publication))
        hashed = sorted(
            f"{table}.{column}"
            for table, masks in published_masks(conn, settings.publication).items()
            for column, mask in masks.items()
            if mask.kind == "hash"
        )
        if hashed and not settings.mask_key_bytes:
            problems.append(
                f"the publication masks {', '.join(hashed)} with a keyed hash and CDC_MASK_KEY is not set; set it to "
                "the key `cdc setup` was given (capture writes nothing unmasked)"
            )
    return problems


#: The oldest PostgreSQL capture reads: 14 brought pgoutput's protocol version 2, which streams a large
#: transaction before its commit instead of spilling it to the server's disk, and capture asks for it.
OLDEST_SERVER = 140000


def server_version_check(server_version: int) -> Check:
    """The server is PostgreSQL 14 or newer (``server_version`` as ``server_version_num``, e.g. 150004)."""
    major, rest = divmod(server_version, 10000)
    shown = f"{major}.{rest}" if major >= 10 else f"{major}.{rest // 100}.{rest % 100}"  # 9.6.24 was 90624
    return Check(
        "server version",
        server_version >= OLDEST_SERVER,
        f"the server is PostgreSQL {shown}; capture needs 14 or newer (pgoutput's protocol version 2); "
        "upgrade the server (pg_upgrade) to a supported version, 14 to 18",
    )


def _wal_level_check(conn: Connection) -> Check:
    wal_level = str(conn.execute("SHOW wal_level").fetchone()[0])  # type: ignore[index]
    return Check(
        "wal_level",
        wal_level == "logical",
        f"wal_level is {wal_level}, logical decoding needs logical; set wal_level = logical "
        "in postgresql.conf (or ALTER SYSTEM SET wal_level = logical) and restart PostgreSQL",
    )


def _replication_check(conn: Connection) -> Check:
    role = conn.execute("SELECT current_user, rolreplication, rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()
    assert role is not None
    return Check(
        "replication privilege",
        bool(role[1] or role[2]),
        f"role {role[0]} lacks the REPLICATION privilege; run ALTER ROLE {role[0]} REPLICATION as a superuser",
    )


_ACTIONS = ("insert", "update", "delete", "truncate")


def _publication_checks(conn: psycopg.Connection[tuple[object, ...]], settings: Settings) -> list[Check]:
    """An existing publication publishes every action, and what PostgreSQL does not send is said.

    A publication that leaves out deletes or truncates would let removed rows live on in every view
    (and a re-inserted key meet its stale row). A ``TRUNCATE`` of one partition of a table published
    through its root is never replicated by PostgreSQL, whatever the publication says.
    """
    row = conn.execute(
        "SELECT pubinsert, pubupdate, pubdelete, pubtruncate, pubviaroot FROM pg_publication WHERE pubname = %s",
        (settings.publication,),
    ).fetchone()
    if row is None:
        return []  # cdc setup creates it with every action
    name = settings.publication
    missing = [action for action, published in zip(_ACTIONS, row[:4], strict=True) if not published]
    checks = [
        Check(
            "publication actions",
            not missing,
            f"publication {name} does not publish {', '.join(missing)}: those changes would never reach the log "
            f"and the views would keep removed or stale rows; run ALTER PUBLICATION {name} SET (publish = "
            "'insert, update, delete, truncate')",
        )
    ]
    roots = [
        str(r[0])
        for r in conn.execute(
            "SELECT t.schemaname || '.' || t.tablename FROM pg_publication_tables t "
            "JOIN pg_namespace n ON n.nspname = t.schemaname "
            "JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = t.tablename "
            "WHERE t.pubname = %s AND c.relkind = 'p' ORDER BY 1",
            (name,),
        ).fetchall()
    ]
    if roots and row[4]:
        checks.append(
            Check(
                "partition truncate",
                True,
                f"PostgreSQL does not replicate a TRUNCATE run on a single partition of {', '.join(roots)} (the "
                f"publication publishes through the root): truncate the root table or DELETE the partition's rows, "
                "otherwise the views keep those rows (`cdc verify` shows them; a new snapshot removes them)",
                warning=True,
            )
        )
    return checks


def _table_checks(conn: Connection, settings: Settings) -> list[Check]:
    """Every table the publication covers or would cover is readable and has a primary key or a replica identity.

    A ``CDC_TABLES`` entry that names no table is reported by :func:`cdc.capture.coverage.table_list_problems`.
    """
    checks: list[Check] = []
    covered = coverage(conn, settings.publication, list(settings.tables))
    for schema, table in covered.tables:
        name = sql_name((schema, table))
        row = conn.execute(
            "SELECT c.oid, has_table_privilege(c.oid, 'SELECT') FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relname = %s AND c.relkind IN ('r', 'p')",
            (schema, table),
        ).fetchone()
        if row is None:
            continue
        oid, readable = row
        checks.append(
            Check(
                f"table {name} readable",
                bool(readable),
                f"the role cannot read {name}; GRANT SELECT ON {name} TO the capture role (a table added "
                "to the publication later needs the same grant before capture can snapshot it: ALTER "
                "DEFAULT PRIVILEGES ... GRANT SELECT ON TABLES TO the capture role covers new tables)",
            )
        )
        checks.extend(_key_checks(conn, name, int(oid), covered.all_tables))  # type: ignore[call-overload]
        generated = generated_column_problems(conn, settings.publication, name, int(oid))  # type: ignore[call-overload]
        checks.extend(Check(f"table {name} generated columns", False, problem) for problem in generated)
        if settings.uses_kafka:
            toast = kafka_toast_check(conn, name, int(oid))  # type: ignore[call-overload]
            if toast is not None:
                checks.append(toast)
    return checks


#: Per relation: whether it has a primary key or a replica identity index, and its replica identity
#: (d default, n nothing, f full, i index). Partitioned tables are judged by their leaves, where PostgreSQL
#: checks the replica identity of an UPDATE or DELETE.
_IDENTITY = """
    SELECT n.nspname || '.' || c.relname, c.relreplident,
           EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND (i.indisprimary OR i.indisreplident))
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE c.oid = %(oid)s
       OR c.oid IN (SELECT relid FROM pg_partition_tree(%(oid)s) WHERE isleaf AND relid <> %(oid)s)
    ORDER BY c.oid <> %(oid)s, 1
"""


def _key_checks(conn: Connection, name: str, oid: int, all_tables: bool) -> list[Check]:
    """Whether updates and deletes of table ``name`` (of each partition under it) work once it is published.

    ``all_tables``: the publication does not exist yet and would be created ``FOR ALL TABLES``, so naming
    only the tables to capture in ``CDC_TABLES`` is a fix as well.
    """
    (_, identity, has_key), *leaves = conn.execute(_IDENTITY, {"oid": oid}).fetchall()
    if has_key:
        return [Check(f"table {name} key", True, "")]  # a partitioned table's primary key is every partition's
    judged = leaves or [(name, identity, has_key)]
    broken = [str(leaf) for leaf, leaf_identity, leaf_key in judged if not leaf_key and leaf_identity != "f"]
    if not broken:
        return [
            Check(
                f"table {name} key",
                True,
                f"table {name} has no primary key: with REPLICA IDENTITY FULL its updates and deletes are captured, "
                "but with a null key, so its topic is not compacted and the warehouse keeps it append-only (every "
                "inserted or updated row is added, deletes are not applied); to mirror it row for row add a primary "
                f"key, or ALTER TABLE {name} REPLICA IDENTITY USING INDEX on a unique index of NOT NULL columns",
                warning=True,
            )
        ]
    what = (
        "a publication FOR ALL TABLES would make the application's updates and deletes of it fail"
        if all_tables
        else "inserts are captured with a null key but updates and deletes fail on the source"
    )
    limit = "; or set CDC_TABLES to the tables to capture (setup then publishes only those)" if all_tables else ""
    return [
        Check(
            f"table {leaf} key",
            False,
            f"table {leaf if leaf == name else f'{leaf} (a partition of {name})'} has no primary key or replica "
            f"identity: {what}; add a primary key (or REPLICA IDENTITY USING INDEX on a unique index), or run "
            f"ALTER TABLE {leaf} REPLICA IDENTITY FULL to capture it append-only{limit}",
        )
        for leaf in broken
    ]
