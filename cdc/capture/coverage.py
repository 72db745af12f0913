"""Which tables a publication covers, or would cover once ``cdc setup`` creates it, and what CDC_TABLES misses.

A publication that publishes updates and deletes makes PostgreSQL refuse an ``UPDATE``/``DELETE`` on a
covered table that has neither a primary key nor a replica identity: the application's own writes
fail. So the tables are judged before the publication exists, from what it *would* cover: the
``CDC_TABLES`` list, or every table a ``FOR ALL TABLES`` publication takes in
(:func:`publishable_tables`).

A ``CDC_TABLES`` entry that names no table, or a table the publication does not publish, would make
capture read nothing of it without a word; :func:`table_list_problems` names each such entry with its
fix, for ``cdc setup`` and ``cdc capture`` alike.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import psycopg

Connection = psycopg.Connection[tuple[object, ...]]

#: Relations ``FOR ALL TABLES`` publishes, as PostgreSQL's ``is_publishable_class`` decides: ordinary and
#: partitioned tables that are permanent and not part of the system catalog (whose OIDs are all below
#: 16384, FirstNormalObjectId). Partitions are represented by their root (``publish_via_partition_root``).
_PUBLISHABLE = """
    SELECT n.nspname, c.relname
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE c.relkind IN ('r', 'p') AND c.relpersistence = 'p' AND NOT c.relispartition AND c.oid >= 16384
      AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname !~ '^pg_toast'
    ORDER BY 1, 2
"""

#: A table: (schema, table), the names as the catalog spells them. Never joined into ``schema.table``
#: text to be split again: a dot in either name would make it another table.
TableName = tuple[str, str]

#: Names SQL reads as written without quotes.
_BARE = re.compile(r"[a-z_][a-z0-9_$]*")


def sql_name(table: TableName) -> str:
    """``schema.table`` as SQL writes it, each name quoted when it needs quotes (for messages and fixes)."""
    return ".".join(name if _BARE.fullmatch(name) else '"' + name.replace('"', '""') + '"' for name in table)


def entry_name(entry: str) -> TableName:
    """A ``CDC_TABLES`` entry as (schema, table): the settings admit plain identifiers with one dot only."""
    schema, _, table = entry.partition(".")
    return schema, table


@dataclass(frozen=True)
class Coverage:
    """The tables to judge, and how the publication comes to cover them."""

    tables: list[TableName]
    #: the publication exists (otherwise ``cdc setup`` is about to create it)
    exists: bool
    #: the publication is, or would be, ``FOR ALL TABLES`` (``CDC_TABLES`` empty and no publication yet)
    all_tables: bool


def publication_exists(conn: Connection, publication: str) -> bool:
    """Whether the publication is in the catalog."""
    return conn.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (publication,)).fetchone() is not None


def published_tables(conn: Connection, publication: str) -> list[TableName]:
    """Every table the publication publishes (roots of partitions published via the root)."""
    rows = conn.execute(
        "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s ORDER BY 1, 2",
        (publication,),
    ).fetchall()
    return [(str(row[0]), str(row[1])) for row in rows]


def publishable_tables(conn: Connection) -> list[TableName]:
    """Every table a new ``FOR ALL TABLES`` publication would publish."""
    return [(str(row[0]), str(row[1])) for row in conn.execute(_PUBLISHABLE).fetchall()]


def coverage(conn: Connection, publication: str, tables: list[str]) -> Coverage:
    """The tables capture reads: ``tables`` (CDC_TABLES) when set, else all the publication covers or would cover."""
    exists = publication_exists(conn, publication)
    if tables:
        return Coverage([entry_name(entry) for entry in tables], exists, all_tables=False)
    if exists:
        return Coverage(published_tables(conn, publication), exists, all_tables=False)
    return Coverage(publishable_tables(conn), exists, all_tables=True)


def table_list_problems(conn: Connection, publication: str, tables: list[str]) -> list[str]:
    """One message per ``CDC_TABLES`` entry that capture would read nothing of, with its fix.

    An entry must name an ordinary or partitioned table; when the publication exists it must also
    publish it under that name (a partition published through its root is captured as the root).
    """
    if not tables:
        return []
    exists = publication_exists(conn, publication)
    published = set(published_tables(conn, publication)) if exists else set()
    problems: list[str] = []
    for name in tables:
        schema, table = entry_name(name)
        row = conn.execute(
            "SELECT c.relispartition, rn.nspname, r.relname "
            "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "LEFT JOIN pg_class r ON r.oid = pg_partition_root(c.oid) "
            "LEFT JOIN pg_namespace rn ON rn.oid = r.relnamespace "
            "WHERE n.nspname = %s AND c.relname = %s AND c.relkind IN ('r', 'p')",
            (schema, table),
        ).fetchone()
        if row is None:
            problems.append(
                f"CDC_TABLES names {name}, which is not a table of this database: capture would read nothing of "
                "it; correct the entry (schema.table, spelled as in the catalog) or create the table"
            )
        elif exists and (schema, table) not in published:
            root = sql_name((str(row[1]), str(row[2])))
            if row[0] and (row[1], row[2]) in published:
                problems.append(
                    f"CDC_TABLES names {name}, which publication {publication} publishes through its root {root}: "
                    f"its changes arrive as {root}'s, so capture would read nothing under {name}; name {root} in "
                    "CDC_TABLES instead"
                )
            else:
                problems.append(
                    f"CDC_TABLES names {name}, which publication {publication} does not publish: capture would "
                    f"read none of its changes; run ALTER PUBLICATION {publication} ADD TABLE {name}, or remove "
                    "it from CDC_TABLES"
                )
    return problems
