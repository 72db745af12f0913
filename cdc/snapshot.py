"""Reading the included tables inside the slot's exported snapshot, as JSON text built by the server.

Consistency rule: the slot is created with ``SNAPSHOT 'export'`` and every table is read in
REPEATABLE READ transactions that import that snapshot (a few sessions, each importing the same
snapshot, so that the server builds several chunks at once; all of them see exactly the same rows).
The snapshot sees exactly the transactions that committed before the slot's consistent point, and the
slot streams exactly those that commit after it, so snapshot plus stream have no gap and no overlap.
That is why streaming must start at the consistent point and nowhere else. The snapshot transactions
must be open before the replication connection that exported the snapshot runs another command or
closes. Each block range is read by exactly one session, and chunks are handed on in range order.

Rows are read in chunks of physical block ranges (``ctid >= '(a,0)' AND ctid < '(b,0)'``, a TID range
scan; the last range is open-ended, so rows in blocks added later are still read). For each chunk the
server returns one text value: per row the key JSON, a tab, the ``after`` JSON, rows joined by newlines.
Per-column SQL expressions, chosen by type (:func:`json_expression`), produce exactly the JSON values
:mod:`cdc.values` produces for streamed changes; the few types without such an expression are sent as
their text form and converted in Python by the same converter the stream uses. JSON text never holds a
raw tab or newline (both are escaped inside strings), so the chunk splits unambiguously.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import orjson

import psycopg
from psycopg import sql
from psycopg.types.string import ByteaBinaryLoader

from cdc.catalog import SESSION_OPTIONS
from cdc.errors import SourceError
from cdc.tables import ColumnShape, TableShape

#: The table itself, or the leaf partitions of a partitioned table (parameters: relid three times).
_LEAVES = ("SELECT oid AS relid FROM pg_class WHERE oid = %s AND relkind <> 'p' "
           "UNION ALL SELECT relid FROM pg_partition_tree(%s) WHERE isleaf AND relid <> %s")
#: Key column types whose server-made JSON is byte-identical to what orjson writes for the stream (the
#: key bytes choose the partition and identify the row to compaction, so they must match exactly).
_EXACT_KEY_TYPES = frozenset({"int2", "int4", "int8", "oid", "numeric", "uuid", "text", "varchar", "bpchar",
                              "name", "bool", "bytea", "date", "timestamp", "timestamptz"})
#: Array element types whose ``to_json`` rendering equals what :mod:`cdc.values` makes of the array text.
_JSON_ARRAY_ELEMENTS = frozenset({"int2", "int4", "int8", "float4", "float8", "bool", "text", "varchar",
                                  "bpchar", "name", "uuid"})
_NUMBER = "{c}::text"
_TO_JSON = "to_json({c})::text"
_TEXT_STRING = "to_json({c}::text)::text"
_QUOTED = "'\"' || {c}::text || '\"'"
_OUTPUT_STRING = "CASE WHEN {c} IS NULL THEN NULL ELSE to_json(format('%s', {c}))::text END"
_EXPRESSIONS: dict[str, str] = {
    "int2": _NUMBER, "int4": _NUMBER, "int8": _NUMBER, "oid": _NUMBER,
    "float4": _TO_JSON, "float8": _TO_JSON, "bool": _TO_JSON,
    "numeric": _QUOTED, "uuid": _QUOTED,
    "text": _TO_JSON, "varchar": _TO_JSON, "bpchar": _TO_JSON, "name": _TO_JSON, "citext": _TO_JSON,
    "json": _TEXT_STRING, "jsonb": _TEXT_STRING, "date": _TEXT_STRING, "time": _TEXT_STRING,
    "interval": _TEXT_STRING, "money": _TEXT_STRING, "macaddr": _TEXT_STRING, "bit": _TEXT_STRING,
    "varbit": _TEXT_STRING, "xml": _TEXT_STRING,
    "bytea": "'\"' || translate(encode({c}, 'base64'), E'\\n', '') || '\"'",
    "timestamp": "CASE WHEN {c} >= '0001-01-01' AND {c} < 'infinity' "
                 "THEN '\"' || replace({c}::text, ' ', 'T') || '\"' ELSE to_json({c}::text)::text END",
    "timestamptz": "CASE WHEN {c} >= '0001-01-01 00:00:00+00' AND {c} < 'infinity' "
                   "THEN '\"' || replace(left({c}::text, -3), ' ', 'T') || 'Z\"' ELSE to_json({c}::text)::text END",
    "timetz": "to_json(regexp_replace({c}::text, '([+-][0-9]{{2}})$', '\\1:00'))::text",
}


def json_expression(column: ColumnShape) -> tuple[sql.Composed, bool]:
    """SQL giving the column's JSON value as text (NULL for SQL NULL), and whether Python must convert it.

    The second item is true for the few types (arrays of most element types) whose JSON the server
    cannot produce exactly: the expression then yields the value's text form as a JSON string, to be
    passed through the column's :mod:`cdc.values` converter.
    """
    name = column.type_name
    template = _EXPRESSIONS.get(name)
    python = False
    if template is None and name.startswith("_"):
        template, python = (_TO_JSON, False) if name[1:] in _JSON_ARRAY_ELEMENTS else (_TEXT_STRING, True)
    if template is None:
        template = _OUTPUT_STRING  # enums, inet, cidr, "char", unknown types: the output function's text
    return sql.SQL(template).format(c=sql.Identifier(column.name)), python


@dataclass(frozen=True)
class JsonQuery:
    """The per-chunk query of one table and how to finish its rows in Python."""

    select: sql.Composed
    keyed: bool
    python_columns: tuple[int, ...]  # indexes of columns whose JSON Python converts

    def chunk(self, first: int, end: int | None) -> sql.Composed:
        """The query over blocks ``[first, end)`` (``end`` None: every block from ``first`` on).

        Sent without parameters, so a ``%`` in the expressions is literal.
        """
        where = sql.SQL(" WHERE ctid >= {}::tid").format(sql.Literal(f"({first},0)"))
        if end is not None:
            where = sql.SQL("{} AND ctid < {}::tid").format(where, sql.Literal(f"({end},0)"))
        return sql.Composed([self.select, where])


def json_query(shape: TableShape) -> JsonQuery:
    """The chunk queries of ``shape``: one SQL expression per row, key and ``after`` JSON."""
    parts: list[sql.Composable] = []
    python: list[int] = []
    for index, column in enumerate(shape.columns):
        expression, needs_python = json_expression(column)
        if needs_python:
            python.append(index)
        opener = "{" if index == 0 else ","
        parts.append(sql.Literal(opener + orjson.dumps(column.name).decode() + ":"))
        parts.append(sql.SQL("COALESCE({}, 'null')").format(expression))
    parts.append(sql.Literal("}"))
    after = sql.SQL(" || ").join(parts)
    keys = sorted((c for c in shape.columns if c.key), key=lambda c: c.name)
    exact_keys = all(c.type_name in _EXACT_KEY_TYPES for c in keys)
    if keys and exact_keys and not python:
        key_parts: list[sql.Composable] = []
        for index, column in enumerate(keys):
            opener = "{" if index == 0 else ","
            key_parts.append(sql.Literal(opener + orjson.dumps(column.name).decode() + ":"))
            key_parts.append(sql.SQL("COALESCE({}, 'null')").format(json_expression(column)[0]))
        key_parts.append(sql.Literal("}"))
        row = sql.SQL("{} || E'\\t' || {}").format(sql.SQL(" || ").join(key_parts), after)
    else:
        row = after
    select = sql.SQL("SELECT string_agg({row}, E'\\n') FROM {table}").format(
        row=row, table=sql.Identifier(shape.schema, shape.table))
    return JsonQuery(select, bool(keys) and exact_keys and not python, tuple(python))


class SnapshotReader:
    """Read-only REPEATABLE READ transactions importing ``snapshot_name``; close when done.

    ``connections`` sessions import the same exported snapshot (so they all see exactly the same
    rows) and the table's block ranges are spread over them: the server builds the JSON of several
    chunks at once, on as many cores, while Python appends. Construct it while the replication
    connection that exported the snapshot is still open and idle; a session that cannot be opened
    beyond the first only lowers the parallelism.
    """

    def __init__(self, url: str, snapshot_name: str, connections: int = 2) -> None:
        self._conn = self._open(url, snapshot_name)
        row = self._conn.execute("SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint").fetchone()
        self.xmin = int(row[0]) if row else 0
        self._helpers: list[psycopg.Connection[tuple[object, ...]]] = []
        for _ in range(connections - 1):
            try:
                self._helpers.append(self._open(url, snapshot_name))
            except (SourceError, psycopg.Error):
                break  # e.g. max_connections reached: read with the sessions already open

    @staticmethod
    def _open(url: str, snapshot_name: str) -> psycopg.Connection[tuple[object, ...]]:
        try:
            conn = psycopg.connect(url, options=SESSION_OPTIONS, client_encoding="UTF8")
        except psycopg.OperationalError as exc:
            raise SourceError(f"cannot connect for the snapshot: {str(exc).strip().splitlines()[0]}") from None
        try:
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshot_name)))
        except psycopg.Error as exc:
            conn.close()
            raise SourceError(
                f"cannot import the exported snapshot {snapshot_name}: {str(exc).strip().splitlines()[0]}; "
                "the slot's snapshot is valid only while the connection that created it is open: retry capture"
            ) from None
        return conn

    def estimate(self, relid: int) -> int:
        """Estimated row count (pg_class.reltuples summed over partitions), for progress only."""
        row = self._conn.execute(
            f"SELECT COALESCE(sum(GREATEST(c.reltuples, 0)), 0)::bigint FROM ({_LEAVES}) t "
            "JOIN pg_class c ON c.oid = t.relid",
            (relid, relid, relid),
        ).fetchone()
        return int(row[0]) if row else 0

    def blocks(self, relid: int) -> tuple[int, float]:
        """(heap blocks of the largest leaf partition, estimated rows per block) of a table."""
        row = self._conn.execute(
            "SELECT COALESCE(max(pg_relation_size(t.relid)), 0) / current_setting('block_size')::bigint, "
            "COALESCE(sum(GREATEST(c.reltuples, 0)) / NULLIF(sum(c.relpages), 0), 0)::float8 "
            f"FROM ({_LEAVES}) t JOIN pg_class c ON c.oid = t.relid",
            (relid, relid, relid),
        ).fetchone()
        return (int(row[0]), float(row[1])) if row else (0, 0.0)  # type: ignore[call-overload]

    def json_chunks(
        self, shape: TableShape, chunk_rows: int = 10_000
    ) -> Iterator[tuple[list[bytes | None], list[bytes]]]:
        """Every row of the table as key JSON and ``after`` JSON (two lists per chunk), a block range per chunk.

        A partitioned table is read through its root: each block range is read from every partition.
        Chunks are fetched by one thread per session while the caller works on the current one (at
        most two chunks wait per session), so the server builds JSON while Python builds events.
        """
        plan = json_query(shape)
        blocks, per_block = self.blocks(shape.relid)
        step = max(1, int(chunk_rows / per_block)) if per_block > 0 else 64
        ranges: list[tuple[int, int | None]] = [(first, first + step) for first in range(0, blocks, step)]
        ranges = ranges[:-1] + [(ranges[-1][0], None)] if ranges else [(0, None)]
        for data in self._prefetched(plan, ranges):
            if data:
                yield _split_chunk(shape, plan, data)

    def _prefetched(self, plan: JsonQuery, ranges: list[tuple[int, int | None]]) -> Iterator[bytes | None]:
        """Chunk results in range order; range ``i`` is fetched by session ``i % sessions`` in a thread of its own."""
        sessions = [self._conn, *self._helpers]
        queues: list[queue.Queue[tuple[bytes | None, BaseException | None]]] = [
            queue.Queue(maxsize=2) for _ in sessions]
        stop = threading.Event()

        def hand_over(results: queue.Queue[tuple[bytes | None, BaseException | None]],
                      item: tuple[bytes | None, BaseException | None]) -> None:
            while not stop.is_set():
                try:
                    results.put(item, timeout=0.2)
                    return
                except queue.Full:
                    continue

        def fetch(conn: psycopg.Connection[tuple[object, ...]], mine: list[tuple[int, int | None]],
                  results: queue.Queue[tuple[bytes | None, BaseException | None]]) -> None:
            try:
                with conn.cursor(binary=True) as cursor:
                    # the chunk's text as the server sends it (UTF-8, see _open): bytes, never decoded
                    cursor.adapters.register_loader("text", ByteaBinaryLoader)
                    for first, end in mine:
                        if stop.is_set():
                            return
                        row = cursor.execute(plan.chunk(first, end)).fetchone()
                        hand_over(results, (bytes(row[0]) if row is not None and row[0] is not None else None, None))
            except BaseException as exc:  # noqa: BLE001 - handed to the consumer below
                hand_over(results, (None, exc))

        workers = [
            threading.Thread(target=fetch, args=(conn, ranges[index :: len(sessions)], queues[index]),
                             name=f"snapshot-fetch-{index}", daemon=True)
            for index, conn in enumerate(sessions)
        ]
        for worker in workers:
            worker.start()
        try:
            for index in range(len(ranges)):
                data, error = queues[index % len(sessions)].get()
                if error is not None:
                    if isinstance(error, psycopg.Error):
                        raise SourceError(f"snapshot query failed: {str(error).strip().splitlines()[0]}") from error
                    raise error
                yield data
        finally:
            stop.set()
            for worker in workers:
                worker.join()

    def close(self) -> None:
        for conn in [*self._helpers, self._conn]:
            try:
                conn.rollback()
            except psycopg.Error:
                pass
            finally:
                conn.close()


def _split_chunk(shape: TableShape, plan: JsonQuery, data: bytes) -> tuple[list[bytes | None], list[bytes]]:
    """The keys and ``after`` values of one chunk; Python finishes the columns the server could not."""
    if plan.keyed:
        parts = data.replace(b"\n", b"\t").split(b"\t")
        return parts[0::2], parts[1::2]  # type: ignore[return-value]
    afters = data.split(b"\n")
    names = [c.name for c in shape.columns]
    keys = sorted(c.name for c in shape.columns if c.key)
    converters = [(names[i], shape.converters[i]) for i in plan.python_columns]
    out_keys: list[bytes | None] = []
    out_afters: list[bytes] = []
    for after in afters:
        if converters:
            row = orjson.loads(after)
            for name, convert in converters:
                if row[name] is not None:
                    row[name] = convert(row[name])
            after = orjson.dumps(row)
        else:
            row = orjson.loads(after) if keys else None
        out_keys.append(orjson.dumps({k: row[k] for k in keys}, option=orjson.OPT_SORT_KEYS) if keys and row else None)
        out_afters.append(after)
    return out_keys, out_afters
