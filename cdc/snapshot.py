"""Reading the included tables inside the slot's exported snapshot, as text rows via COPY.

Consistency rule: the slot is created with ``SNAPSHOT 'export'`` and every table is read in one
REPEATABLE READ transaction that imports that snapshot. The snapshot sees exactly the transactions
that committed before the slot's consistent point, and the slot streams exactly those that commit
after it, so snapshot plus stream have no gap and no overlap. That is why streaming must start at the
consistent point and nowhere else. The snapshot transaction must be open before the replication
connection that exported the snapshot runs another command or closes.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import psycopg
from psycopg import sql

from cdc.catalog import SESSION_OPTIONS
from cdc.errors import SourceError
from cdc.pgoutput.messages import Tuple
from cdc.tables import TableShape

_ESCAPE = re.compile(rb"\\(?:([0-7]{1,3})|x([0-9A-Fa-f]{1,2})|(.))", re.DOTALL)
_SIMPLE = {b"b": b"\b", b"f": b"\f", b"n": b"\n", b"r": b"\r", b"t": b"\t", b"v": b"\v"}


def _unescape_match(match: re.Match[bytes]) -> bytes:
    octal, hexa, other = match.groups()
    if octal is not None:
        return bytes([int(octal, 8) & 0xFF])
    if hexa is not None:
        return bytes([int(hexa, 16)])
    return _SIMPLE.get(other, other)


def parse_copy_line(line: bytes) -> Tuple:
    """One line of ``COPY ... TO STDOUT`` text format (no trailing newline) -> text values."""
    values: list[str | None] = []
    for field in line.split(b"\t"):
        if field == b"\\N":
            values.append(None)
        elif b"\\" in field:
            values.append(_ESCAPE.sub(_unescape_match, field).decode("utf-8"))
        else:
            values.append(field.decode("utf-8"))
    return tuple(values)


class SnapshotReader:
    """One read-only REPEATABLE READ transaction importing ``snapshot_name``; close when done."""

    def __init__(self, url: str, snapshot_name: str) -> None:
        try:
            self._conn = psycopg.connect(url, options=SESSION_OPTIONS)
        except psycopg.OperationalError as exc:
            raise SourceError(f"cannot connect for the snapshot: {str(exc).strip().splitlines()[0]}") from None
        self._conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        self._conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshot_name)))
        row = self._conn.execute("SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint").fetchone()
        self.xmin = int(row[0]) if row else 0

    def estimate(self, relid: int) -> int:
        """Estimated row count (pg_class.reltuples summed over partitions), for progress only."""
        row = self._conn.execute(
            "SELECT COALESCE(sum(GREATEST(c.reltuples, 0)), 0)::bigint FROM pg_partition_tree(%s) t "
            "JOIN pg_class c ON c.oid = t.relid",
            (relid,),
        ).fetchone()
        return int(row[0]) if row else 0

    def rows(self, shape: TableShape) -> Iterator[Tuple]:
        """Every row of the table (a partitioned table: every partition), columns in shape order."""
        query = sql.SQL("COPY (SELECT {} FROM {}) TO STDOUT").format(
            sql.SQL(", ").join(sql.Identifier(name) for name in shape.names),
            sql.Identifier(shape.schema, shape.table),
        )
        with self._conn.cursor() as cursor, cursor.copy(query) as copy:
            for block in copy:
                data = bytes(block)
                if data.count(b"\n") <= 1:
                    yield parse_copy_line(data.rstrip(b"\n"))
                else:
                    for line in data.rstrip(b"\n").split(b"\n"):
                        yield parse_copy_line(line)

    def close(self) -> None:
        try:
            self._conn.rollback()
        finally:
            self._conn.close()
