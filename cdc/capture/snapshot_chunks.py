r"""A snapshot chunk's query, and its one result row turned into Arrow columns.

For each chunk the server returns one row: per column one text value, the text forms of the chunk's rows
joined by newlines (the output function's text, as pgoutput sends it; escaped where the type's text can
hold a newline or a backslash, ``\N`` for NULL), and the row count. All aggregates of one query see the
rows in the same order. A chunk is a block range (:meth:`ColumnQuery.chunk`) or, for a read by key, the
next rows past a key (:func:`keyset_query`). :func:`chunk_columns` splits each column into an Arrow array
and turns it into JSON with the stream's own encoders (:mod:`cdc.capture.arrow_fragments`), so a row reads
the same whichever path carried it; :func:`last_key` reads where a read by key goes on from.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import cast

import pyarrow as pa
import pyarrow.compute as pc
from psycopg import sql

from cdc.capture import arrow_fragments
from cdc.capture.errors import SourceError
from cdc.capture.tables import ColumnShape, TableShape

#: Types whose ``::text`` cast is their output function and whose text never holds a backslash or a
#: newline: sent as they are.
_PLAIN = frozenset(
    {"int2", "int4", "int8", "oid", "numeric", "float4", "float8", "uuid", "date", "time", "timetz", "timestamp", "timestamptz"}
)
#: Types whose ``::text`` cast is their output function, escaped (others go through ``format('%s')``,
#: which calls the output function: ``bool::text`` is ``true`` where the output is ``t``, ``bpchar::text``
#: drops trailing blanks, ``inet::text`` adds the netmask).
_CAST = _PLAIN | {"text", "varchar", "json", "jsonb"}
#: The text a NULL is sent as (an escaped value never equals it: its backslashes are doubled).
_NULL_TEXT = b"\\N"


def text_expression(column: ColumnShape) -> sql.Composed:
    """SQL giving the column's text form as pgoutput sends it, escaped so that it holds no newline
    (``\\`` for a backslash, ``\\n`` for a newline), ``\\N`` for NULL."""
    name = sql.Identifier(column.name)
    # format() makes '' of a NULL: only non-null values are formatted
    text = (
        sql.SQL("{}::text") if column.type_name in _CAST else sql.SQL("CASE WHEN {0} IS NOT NULL THEN format('%s', {0}) END")
    ).format(name)
    if column.type_name not in _PLAIN:
        text = sql.SQL("replace(replace({}, '\\', '\\\\'), E'\\n', '\\n')").format(text)
    return sql.SQL("COALESCE({}, '\\N')").format(text)


@dataclass(frozen=True)
class ColumnQuery:
    """The per-chunk query of one table: per column its rows' texts joined by newlines, then the row count."""

    select: sql.Composed
    #: The publication's row filter (``None``: every row), as the server printed it from its catalog.
    row_filter: str | None = None

    def chunk(self, first: int, end: int | None) -> sql.Composed:
        """The query over blocks ``[first, end)`` (``end`` None: every block from ``first`` on), of the
        rows the row filter passes.

        Sent without parameters, so a ``%`` in the expressions is literal.
        """
        where = sql.SQL(" WHERE ctid >= {}::tid").format(sql.Literal(f"({first},0)"))
        if end is not None:
            where = sql.SQL("{} AND ctid < {}::tid").format(where, sql.Literal(f"({end},0)"))
        if self.row_filter is not None:
            # a filter is a boolean expression over the table's own columns, which PostgreSQL checked
            # when the publication was made (no subqueries, no user-defined functions)
            where = sql.SQL("{} AND ({})").format(where, sql.SQL(self.row_filter))  # type: ignore[arg-type]
        return sql.Composed([self.select, where])


def relation(shape: TableShape, *, partitioned: bool = False) -> sql.Composable:
    """The table as every read names it: ``ONLY`` the table itself, so that a parent by plain inheritance
    (``INHERITS``) yields its own rows and none of its children's, as pgoutput publishes them (each
    child is a table of its own); a partitioned table (``partitioned``) as it is, so that its rows are
    read from its leaf partitions, as a table published via its root publishes them."""
    name = sql.Identifier(shape.schema, shape.table)
    return name if partitioned else sql.SQL("ONLY {}").format(name)


def column_query(shape: TableShape, row_filter: str | None = None, *, partitioned: bool = False) -> ColumnQuery:
    """The chunk queries of ``shape``: one ``string_agg`` per column (all aggregates of one query see the
    rows in the same order) and ``count(*)``, over the rows ``row_filter`` passes (the publication's,
    so that a snapshot holds exactly the rows the stream would send; a NULL result excludes a row, as
    it does for pgoutput), of :func:`relation`."""
    aggregates = [sql.SQL("string_agg({}, E'\\n')").format(text_expression(c)) for c in shape.columns]
    select = sql.SQL("SELECT {} FROM {}").format(
        sql.SQL(", ").join([*aggregates, sql.SQL("count(*)")]), relation(shape, partitioned=partitioned)
    )
    return ColumnQuery(select, row_filter)


#: Key column types a read beside the stream pages through by key (keyset pagination), and whose order
#: Python knows as PostgreSQL does (so that a read can resume after its last durable key).
KEYSET_TYPES = frozenset({"int2", "int4", "int8", "uuid"})


def keyset_query(
    shape: TableShape,
    keys: tuple[str, ...],
    after: tuple[str, ...] | None,
    limit: int,
    row_filter: str | None = None,
    *,
    skip: int = 0,
    partitioned: bool = False,
) -> sql.Composed:
    """The query of the next ``limit`` rows of ``shape`` by primary key ``keys`` (index order) past the key
    ``after`` (its columns' texts; ``None``: from the first row) of :func:`relation`, among those ``row_filter`` passes: the
    aggregates of :func:`column_query` over them (:func:`last_key` reads the last row's key from them). ``skip``: the
    rows past ``after`` to pass over first (``OFFSET``), so that several sessions read consecutive chunks
    from one known key at once.

    ``(a, b) > (x, y) ORDER BY a, b LIMIT n`` is a range scan of the key's index, a composite key's
    included. The rows reach the aggregates in the subquery's order (as PostgreSQL's documentation
    says a sorted subquery's rows do); the last key is taken from the same order."""
    types = {column.name: column.type_name for column in shape.columns}
    names = sql.SQL(", ").join(sql.Identifier(key) for key in keys)
    conditions: list[sql.Composable] = []
    if after is not None:
        bounds = sql.SQL(", ").join(
            sql.SQL("{}::{}").format(sql.Literal(text), sql.Identifier(types[key])) for key, text in zip(keys, after, strict=True)
        )
        conditions.append(sql.SQL("({}) > ({})").format(names, bounds))
    if row_filter is not None:
        conditions.append(sql.SQL("({})").format(sql.SQL(row_filter)))  # type: ignore[arg-type]
    where = sql.SQL(" WHERE {}").format(sql.SQL(" AND ").join(conditions)) if conditions else sql.SQL("")
    inner = sql.SQL("SELECT {} FROM {}{} ORDER BY {} LIMIT {} OFFSET {}").format(
        sql.SQL(", ").join(sql.Identifier(c.name) for c in shape.columns),
        relation(shape, partitioned=partitioned),
        where,
        names,
        sql.Literal(limit),
        sql.Literal(skip),
    )
    aggregates = [sql.SQL("string_agg({}, E'\\n')").format(text_expression(c)) for c in shape.columns]
    return sql.SQL("SELECT {} FROM ({}) AS chunk").format(sql.SQL(", ").join([*aggregates, sql.SQL("count(*)")]), inner)


def chunk_columns(shape: TableShape, row: Sequence[object]) -> tuple[pa.Array | None, list[pa.Array | pa.Scalar]]:
    """The keys (``None`` for a keyless table) of one chunk's result row as an Arrow ``large_binary``
    array, and the pieces that :func:`~cdc.capture.arrow_fragments.join` makes its ``after`` objects of; JSON byte
    for byte as the stream's (see :mod:`cdc.capture.arrow_fragments`)."""
    count = int(cast(int, row[-1]))
    codec = shape.codec
    parts: list[list[pa.Array | pa.Scalar]] = []
    for index, column in enumerate(shape.columns):
        data = cast("bytes | None", row[index])
        texts = _split(data, count, column)
        # NULL is sent as \N and a value's own backslashes are doubled: a column's data without any
        # backslash (found with one memchr) has neither a NULL nor an escape to undo
        backslash = data is not None and b"\\" in data
        nulls = pc.equal(texts, arrow_fragments.literal(_NULL_TEXT)) if backslash else None
        if nulls is not None and not nulls.true_count:
            nulls = None
        if backslash and column.type_name not in _PLAIN:
            texts = _unescaped(texts, nulls)
        parts.append(arrow_fragments.fragments(texts, nulls, codec.fragmenters[index]))
    after = arrow_fragments.object_pieces(codec.prefixes, parts)
    if not codec.sorted_keys:
        return None, after
    keys = arrow_fragments.join(
        arrow_fragments.object_pieces([codec.prefixes[i] for i in codec.sorted_keys], [parts[i] for i in codec.sorted_keys]),
        count,
    )
    return keys, after


def _split(data: bytes | None, count: int, column: ColumnShape) -> pa.Array:
    """One column's newline-joined texts as an array of ``count`` rows."""
    if data is None:
        texts = pa.array([], arrow_fragments.BYTES)
    else:
        texts = pc.split_pattern(pa.array([data], arrow_fragments.BYTES), b"\n").flatten()
    if len(texts) != count:
        raise SourceError(f"the snapshot read {len(texts)} values of column {column.name} for {count} rows; retry capture")
    return texts


def _unescaped(texts: pa.Array, nulls: pa.Array | None) -> pa.Array:
    """Texts with the server's escapes undone (only rows holding a backslash need it; ``nulls``: the
    NULL rows, when there are any)."""
    escaped = pc.match_substring(texts, b"\\")
    if nulls is not None:
        escaped = pc.and_not(escaped, nulls)
    if not escaped.true_count:
        return texts
    return arrow_fragments.replaced_rows(texts, escaped, texts, partial(_ESCAPE.sub, _unescape))


_ESCAPE = re.compile(rb"\\(.)", re.DOTALL)


def _unescape(match: re.Match[bytes]) -> bytes:
    return b"\n" if match[1] == b"n" else match[1]


def last_key(row: Sequence[object], key_columns: list[int]) -> tuple[str, ...]:
    """The key texts of the last row of a non-empty chunk's result row (:func:`keyset_query`): the last
    line of each key column's texts (a key type's text, see :data:`KEYSET_TYPES`, is sent as it is and
    holds no newline)."""
    texts = [bytes(cast(bytes, row[index])) for index in key_columns]
    return tuple(text[text.rfind(b"\n") + 1 :].decode() for text in texts)
