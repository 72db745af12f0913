"""Prerequisite checks of the source database, and idempotent creation of publication and slot.

Each failed check is one :class:`Check` whose ``message`` says what is wrong and how to fix it; the
set-up command prints one line per failure. Checks only read the catalog; :func:`ensure_publication`
and :func:`ensure_slot` are the only writers and do nothing when their object already exists.

Tables are judged as the publication covers them, or would cover them once created (:mod:`cdc.capture.coverage`),
so that ``cdc setup`` never creates a publication that makes the application's updates or deletes fail.
:func:`capture_problems` is the part of these checks ``cdc capture`` repeats before it makes a slot.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import psycopg
from psycopg import sql

from cdc.capture.coverage import Connection, coverage, entry_name, publication_exists, sql_name, table_list_problems
from cdc.capture.errors import PrerequisiteError, SourceError, connection_failure
from cdc.capture.standby import in_recovery, nudging_primary
from cdc.capture.transport import ReplicationConnection
from cdc.config.settings import Settings
from cdc.setup.capture_rules import Checked, apply_masks, apply_rules, check_rules, published_masks
from cdc.setup.failover import failover_problems, failover_wanted, primary_facts, standby_facts, synchronized_standby_slots
from cdc.setup.publication_rule_checks import generated_column_problems, rule_problems
from cdc.setup.standby_source import standby_problems, writable_url

if TYPE_CHECKING:
    from derived_views import SourceTable
    from derived_views.definitions import ViewDefinitions


@dataclass(frozen=True)
class Check:
    """The outcome of one check."""

    name: str
    ok: bool
    message: str
    #: a passed check whose ``message`` is still worth reading (a consequence the user should know)
    warning: bool = False


def _connect(url: str) -> psycopg.Connection[tuple[object, ...]]:
    try:
        return psycopg.connect(url, autocommit=True, connect_timeout=10)
    except psycopg.OperationalError as exc:
        raise SourceError(f"cannot connect to the source database: {connection_failure(exc)}; check CDC_DATABASE_URL") from None


def run_checks(settings: Settings) -> list[Check]:
    """Every prerequisite of capture, in a fixed order."""
    checks: list[Check] = []
    with _connect(settings.database_url) as conn:
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
        checks.append(_views_file_check(conn, settings))
        if not standby:  # a slot on a standby is no failover slot
            checks.extend(_failover_checks(conn, settings))
    if settings.uses_kafka:
        checks.append(_kafka_check(settings))
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


def _kafka_check(settings: Settings) -> Check:
    """The log's Kafka brokers answer within 5 s."""
    import dataclasses

    from log_store.errors import LogStoreError
    from log_store.kafka.log import KafkaLog

    try:
        KafkaLog.open(dataclasses.replace(settings.kafka_settings(), timeout_s=5.0)).close()
    except LogStoreError as exc:
        return Check("kafka log", False, str(exc))
    return Check("kafka log", True, "")


#: Columns whose values PostgreSQL may store out of line (TOAST): varlena types whose storage is not plain.
_OUT_OF_LINE = """
    SELECT a.attname FROM pg_attribute a
    WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped AND a.attlen = -1 AND a.attstorage IN ('x', 'e')
    ORDER BY a.attnum
"""


def _kafka_toast_check(conn: Connection, name: str, oid: int) -> Check | None:
    """On Kafka, a table whose updates may leave TOAST values out is better off sending whole old rows.

    pgoutput leaves an unchanged out-of-line value out of an update. The embedded log keeps such an
    update as a partial row that its compaction folds onto the key's earlier row; Kafka's compaction
    cannot, so capture reads the key's row back from Kafka to write the update whole (exact, but a read
    per such update). Under ``REPLICA IDENTITY FULL`` the server sends the whole old row, values included.
    """
    identity = conn.execute("SELECT relreplident FROM pg_class WHERE oid = %s", (oid,)).fetchone()
    if identity is None or identity[0] == "f":
        return None
    columns = [str(row[0]) for row in conn.execute(_OUT_OF_LINE, (oid,)).fetchall()]
    if not columns:
        return None
    return Check(
        f"table {name} on Kafka",
        True,
        f"updates that leave {', '.join(columns)} unchanged omit their values when they are stored out of "
        "line (TOAST); Kafka's compaction cannot fold such partial rows as the embedded log's does, so "
        "capture reads each such row back from Kafka to write it whole, which slows it down; run "
        f"ALTER TABLE {name} REPLICA IDENTITY FULL so that every update carries them (it writes whole old "
        "rows to the WAL)",
        warning=True,
    )


def _views_file_check(conn: Connection, settings: Settings) -> Check:
    """The views file is well formed and its views read only tables capture will read, through columns
    and keys they have and the publication publishes (derived_views.definitions, derived_views.views.composite,
    derived_views.views.published_rules)."""
    from derived_views import checked
    from derived_views.definitions import load
    from derived_views.errors import ViewsFileError

    try:
        definitions = load(settings.views_file)
        covered = coverage(conn, settings.publication, settings.tables).tables
        published = _published_columns(_source_tables(conn, covered), conn, settings.publication)
        checked(definitions, published)
        problem = _outbox_problem(definitions, published)
    except ViewsFileError as exc:
        return Check("views file", False, str(exc))
    if problem:
        return Check("views file", False, problem)
    return Check("views file", True, "")


def _outbox_problem(definitions: ViewDefinitions, published: dict[str, SourceTable]) -> str:
    """Why an outbox table the views file declares cannot be routed (not published, a part's column
    missing), or empty: capture would otherwise stop at its first change (:mod:`cdc.capture.outbox_table`)."""
    for name, table in definitions.outbox.items():
        source = published.get(name)
        where = f"{definitions.source}: [outbox.{name}]"
        if source is None:
            return f"{where}: {name} is not a table the publication covers; add it to the publication (and CDC_TABLES)"
        parts = {"id": table.id, "aggregatetype": table.aggregatetype, "aggregateid": table.aggregateid}
        parts |= {"type": table.type, "payload": table.payload}
        missing = [f"{part} = {column!r}" for part, column in parts.items() if column not in source.columns]
        if missing:
            return (
                f"{where}: {', '.join(missing)}: no such published column of {name} (its columns: "
                f"{', '.join(source.columns)}); name the columns that hold each part"
            )
    return ""


_COLUMNS_SQL = """
SELECT a.attname, t.typname,
       coalesce(a.attnum = ANY (pk.conkey), false) AS in_key
FROM pg_attribute a
JOIN pg_type t ON t.oid = a.atttypid
LEFT JOIN pg_constraint pk ON pk.conrelid = a.attrelid AND pk.contype = 'p'
WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum
"""


def _source_tables(conn: Connection, tables: list[tuple[str, str]]) -> dict[str, SourceTable]:
    """What the views file may name of each covered table: its columns' types and its primary key."""
    from derived_views import SourceTable  # noqa: F811 - at run time too
    from log_store.topic_names import log_name

    found = {}
    for schema, table in tables:
        name = '"' + schema.replace('"', '""') + '"."' + table.replace('"', '""') + '"'
        rows = conn.execute(_COLUMNS_SQL, (name,)).fetchall()
        if not rows:
            continue  # not a table (yet): the CDC_TABLES check names it
        found[f"{schema}.{table}"] = SourceTable(
            f"{schema}.{table}",
            log_name(schema, table),
            {str(row[0]): str(row[1]) for row in rows},
            tuple(str(row[0]) for row in rows if row[2]),
        )
    return found


def _published_columns(tables: dict[str, SourceTable], conn: Connection, publication: str) -> dict[str, SourceTable]:
    """``tables`` with only the columns the publication's column lists publish: a view can never hold another."""
    import dataclasses

    from derived_views import published_rules

    rules = published_rules(conn, publication)  # type: ignore[arg-type]
    out = dict(tables)
    for (schema, table), rule in rules.items():
        name = f"{schema}.{table}"
        if name in out and rule.column_list is not None:
            source = out[name]
            out[name] = dataclasses.replace(source, columns={c: t for c, t in source.columns.items() if rule.publishes(c)})
    return out


#: Pointed to by the problems ``cdc capture`` finds, which ``cdc setup --check-only`` finds with the rest.
_SEE_SETUP = "`cdc setup --check-only` checks every prerequisite of capture"


def capture_problems(settings: Settings) -> list[str]:
    """What stops capture before it starts, each with setup's fix: wal_level, REPLICATION, publication, CDC_TABLES.

    Capture runs these before it touches the slot, so that a source it cannot capture leaves no slot
    behind holding WAL, and a ``CDC_TABLES`` entry that would capture nothing is refused instead of
    being silently empty.
    """
    with _connect(settings.database_url) as conn:
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
            toast = _kafka_toast_check(conn, name, int(oid))  # type: ignore[call-overload]
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
    with _connect(writable_url(settings)) as conn:
        checked = declared_rules(conn, settings)
        if checked.problems:
            raise PrerequisiteError(checked.problems)
        changed = apply_rules(conn, settings.publication, checked) if checked.clauses else []
        return changed + [name for name in apply_masks(conn, settings.publication, checked.masks) if name not in changed]


def ensure_publication(settings: Settings) -> bool:
    """Create the publication (over ``CDC_TABLES`` with the rules the views file declares, or all tables;
    on PostgreSQL 18 with ``publish_generated_columns = stored``) unless it exists; True if created. On
    the primary, when capture reads from a standby (:mod:`cdc.setup.standby_source`)."""
    with _connect(writable_url(settings)) as conn:
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
    with _connect(settings.database_url) as conn:
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
