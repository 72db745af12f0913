"""How ``cdc verify`` names a source table in its reads: as capture reads it, so both see the same rows.

A table that other tables inherit from (``INHERITS``, plain inheritance) is read with ``ONLY``: PostgreSQL
publishes each child as a table of its own, and the parent's changes are its own rows alone. A
partitioned table is read as it is: published via its root, its rows are those of its leaf partitions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import psycopg


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def relation_sql(conn: psycopg.Connection, schema: str, table: str) -> str:
    """``schema.table`` quoted for a ``FROM`` clause: ``ONLY`` unless the table is partitioned."""
    name = f"{_quoted(schema)}.{_quoted(table)}"
    row = conn.execute("SELECT relkind = 'p' FROM pg_class WHERE oid = to_regclass(%s)", (name,)).fetchone()
    return name if row and row[0] else f"ONLY {name}"
