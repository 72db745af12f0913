"""The checks that the views file and a log in Kafka call for: the views file is well formed and reads
only tables, columns and keys the publication publishes, with each outbox table it declares routable;
with the log in Kafka, its brokers answer, and a table whose updates may leave out-of-line (TOAST)
values out is advised to send whole old rows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cdc.capture.coverage import Connection, coverage
from cdc.config.settings import Settings
from cdc.setup.check import Check

if TYPE_CHECKING:
    from derived_views import SourceTable
    from derived_views.definitions import ViewDefinitions


def kafka_check(settings: Settings) -> Check:
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


def kafka_toast_check(conn: Connection, name: str, oid: int) -> Check | None:
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


def views_file_check(conn: Connection, settings: Settings) -> Check:
    """The views file is well formed and its views read only tables capture will read, through columns
    and keys they have and the publication publishes (derived_views.definitions, derived_views.views.composite,
    derived_views.runs.published_rules)."""
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
