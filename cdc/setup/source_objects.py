"""The objects ``cdc setup`` makes on the source, idempotently: the publication (with the capture rules and
masks the views file declares, :mod:`cdc.setup.capture_rules`) and the replication slot. Each does
nothing when its object already exists; they run only once every check passed
(:mod:`cdc.setup.source_checks`).
"""

from __future__ import annotations

import psycopg
from psycopg import sql

from cdc.capture.coverage import Connection, entry_name
from cdc.capture.errors import PrerequisiteError, SourceError, connection_failure
from cdc.capture.standby import in_recovery, nudging_primary
from cdc.capture.transport import ReplicationConnection
from cdc.config.settings import Settings
from cdc.setup.capture_rules import Checked, apply_masks, apply_rules, check_rules
from cdc.setup.failover import failover_wanted, primary_facts, synchronized_standby_slots
from cdc.setup.standby_source import writable_url


def connect(url: str) -> psycopg.Connection[tuple[object, ...]]:
    """An autocommit connection to the source for set-up; one that cannot be made is a :class:`SourceError`."""
    try:
        return psycopg.connect(url, autocommit=True, connect_timeout=10)
    except psycopg.OperationalError as exc:
        raise SourceError(f"cannot connect to the source database: {connection_failure(exc)}; check CDC_DATABASE_URL") from None


def declared_rules(conn: Connection, settings: Settings) -> Checked:
    """The views file's capture rules checked against the publication as it is or will be created
    (:mod:`cdc.setup.capture_rules`); none when the file declares none or cannot be read (the views file
    check says why)."""
    from derived_views.definitions import load
    from derived_views.errors import ViewsFileError

    try:
        definitions = load(settings.views_file)
    except ViewsFileError:
        return Checked({}, [])
    if not definitions.capture:
        return Checked({}, [])
    source = definitions.source
    filtered = any(r.columns is not None or r.exclude is not None or r.where is not None for r in definitions.capture.values())
    row = conn.execute(
        "SELECT puballtables OR EXISTS (SELECT 1 FROM pg_publication_namespace pn WHERE pn.pnpubid = p.oid) "
        "FROM pg_publication p WHERE pubname = %s"
        if int(conn.info.server_version) >= 150000
        else "SELECT puballtables FROM pg_publication WHERE pubname = %s",
        (settings.publication,),
    ).fetchone()
    if row is not None and row[0] and filtered:
        return Checked(
            {},
            [
                f"{source}: [capture] rules need a publication naming its tables one by one, and {settings.publication} "
                "publishes all tables or whole schemas (which take no column lists or row filters); drop it and run "
                "`cdc setup` with CDC_TABLES set, or remove the rules"
            ],
        )
    if row is None and not settings.tables and filtered:
        return Checked(
            {},
            [
                f"{source}: [capture] rules need CDC_TABLES: without it `cdc setup` creates the publication FOR ALL "
                "TABLES, which takes no column lists or row filters; set CDC_TABLES to the tables to capture"
            ],
        )
    if row is None and settings.tables:
        tables = list(settings.tables)
    elif row is None:  # FOR ALL TABLES, once created
        tables = [
            str(r[0])
            for r in conn.execute(
                "SELECT n.nspname || '.' || c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE c.relkind IN ('r', 'p') AND n.nspname NOT IN ('pg_catalog', 'information_schema')"
            ).fetchall()
        ]
    else:
        tables = [
            str(r[0])
            for r in conn.execute(
                "SELECT schemaname || '.' || tablename FROM pg_publication_tables WHERE pubname = %s",
                (settings.publication,),
            ).fetchall()
        ]
    return check_rules(conn, definitions.capture, tables, source, mask_key=settings.mask_key_bytes)


def apply_declared_rules(settings: Settings) -> list[str]:
    """Give the existing publication's tables the rules the views file declares (see
    :func:`cdc.setup.capture_rules.apply_rules`); the tables changed. On the primary, when capture reads from a
    standby (:mod:`cdc.setup.standby_source`)."""
    with connect(writable_url(settings)) as conn:
        checked = declared_rules(conn, settings)
        if checked.problems:
            raise PrerequisiteError(checked.problems)
        changed = apply_rules(conn, settings.publication, checked) if checked.clauses else []
        return changed + [name for name in apply_masks(conn, settings.publication, checked.masks) if name not in changed]


def ensure_publication(settings: Settings) -> bool:
    """Create the publication (over ``CDC_TABLES`` with the rules the views file declares, or all tables;
    on PostgreSQL 18 with ``publish_generated_columns = stored``) unless it exists; True if created. On
    the primary, when capture reads from a standby (:mod:`cdc.setup.standby_source`)."""
    with connect(writable_url(settings)) as conn:
        if conn.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (settings.publication,)).fetchone():
            return False
        checked = declared_rules(conn, settings)
        if checked.problems:
            raise PrerequisiteError(checked.problems)
        if settings.tables:
            targets: sql.Composable = sql.SQL("FOR TABLE {}").format(
                sql.SQL(", ").join(
                    checked.clauses[name][0].entry() if name in checked.clauses else sql.Identifier(*entry_name(name))
                    for name in settings.tables
                )
            )
        else:
            targets = sql.SQL("FOR ALL TABLES")
        # PostgreSQL 18 publishes stored generated columns when asked (capture carries them to the views
        # like any column); unpublished, one in a replica identity would make it refuse updates and deletes
        generated = ", publish_generated_columns = stored" if conn.info.server_version >= 180000 else ""
        try:
            conn.execute(
                sql.SQL("CREATE PUBLICATION {} {} WITH (publish_via_partition_root = true{})").format(
                    sql.Identifier(settings.publication), targets, sql.SQL(generated)
                )
            )
        except psycopg.Error as exc:
            raise SourceError(
                f"cannot create publication {settings.publication}: {str(exc).strip().splitlines()[0]}; "
                "create it as the tables' owner or a superuser"
            ) from None
        apply_masks(conn, settings.publication, checked.masks)
        return True


def ensure_slot(settings: Settings) -> bool:
    """Create the logical slot (pgoutput) unless it exists; True if created.

    A slot created here has no snapshot; the first ``cdc capture`` replaces it by one created with an
    exported snapshot, which is what gives the initial snapshot its consistent point. When the slot is
    to be a failover slot (:mod:`cdc.setup.failover`), it is created as one, and an existing slot that is not
    one is made one (``ALTER_REPLICATION_SLOT``, 17+).
    """
    with connect(settings.database_url) as conn:
        standby = in_recovery(conn)  # the slot is made on the standby capture reads from (cdc.capture.standby)
        failover = not standby and failover_wanted(
            settings.slot_failover, conn.info.server_version, synchronized_standby_slots(conn), bool(settings.standby_url)
        )
        row = conn.execute("SELECT plugin, slot_type FROM pg_replication_slots WHERE slot_name = %s", (settings.slot,)).fetchone()
        if row is not None:
            if row[0] != "pgoutput":
                raise SourceError(
                    f"replication slot {settings.slot} exists with plugin {row[0]}, not pgoutput; "
                    "drop it or choose another CDC_SLOT"
                )
            if failover and primary_facts(conn, settings.slot).slot_failover is False:
                with ReplicationConnection(settings.database_url) as repl:
                    repl.command(f'ALTER_REPLICATION_SLOT "{settings.slot}" (FAILOVER true)')
            return False
        try:
            if failover:
                conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput', failover => true)", (settings.slot,))
            else:
                with nudging_primary(settings.primary_url if standby else ""):
                    conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (settings.slot,))
        except psycopg.Error as exc:
            raise SourceError(f"cannot create replication slot {settings.slot}: {str(exc).strip().splitlines()[0]}") from None
        return True
