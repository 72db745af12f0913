"""Reading the two sides of a table's comparison (:mod:`derived_views.runs.verify_tables`) as batches of rows.

The source is read in the verify's snapshot: through a server-side cursor (:func:`source_batches`, rows
of Python values), or through ``COPY ... TO STDOUT`` parsed by Arrow (:func:`copied_batches`, record
batches of text, read ahead in a thread of their own: :func:`read_ahead`), each masked column masked as
capture masks it. The view is read with ``deltalake`` at one table version (:func:`view_table`, Arrow
record batches aligned with the comparison's :class:`~derived_views.runs.verify_tables.Layout`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import pyarrow as pa

from derived_views.engine.delta_reads import open_table, stream_query
from derived_views.errors import MissingTableError
from derived_views.events.column_names import source_columns
from derived_views.runs.source_relation import relation_sql
from derived_views.runs.verify_tables import Batches, Layout, Row
from derived_views.runs.verify_values import copied, quote_identifier, select_list

if TYPE_CHECKING:
    import psycopg

    from derived_views.events.schema import TableSchema

_FETCH = 10_000
#: Bytes of ``COPY`` output parsed at once (:func:`copied_batches`).
_COPY_BLOCK = 8 << 20

_T = TypeVar("_T")


def source_batches(
    conn: psycopg.Connection,
    schema: TableSchema,
    row_filter: str | None = None,
    masks: Mapping[str, Callable[[str], str]] | None = None,
    *,
    as_text: bool = False,
) -> Iterator[list[Row]]:
    """The rows of a source table in :class:`Layout` order, batch by batch through a server-side cursor
    (those ``row_filter``, the publication's row filter as the server prints it, passes), each masked
    column's value masked as capture masks it: the mask of the text the type's output function writes
    (:mod:`event_format.masks`); ``as_text``: decimals, dates and instants as the server's text (Arrow
    parses a column of them at once, where psycopg makes a Python object of each)."""
    table = relation_sql(conn, schema.schema, schema.table)  # its own rows, not its children's
    where = f" WHERE ({row_filter})" if row_filter is not None else ""
    masked = [(i, masks[c.name]) for i, c in enumerate(schema.columns) if masks and c.name in masks]
    with conn.cursor(name="cdc_verify") as cursor:
        cursor.execute(f"SELECT {select_list(schema, masks or {}, as_text=as_text)} FROM {table}{where}")  # noqa: S608 - quoted names
        while batch := cursor.fetchmany(_FETCH):
            if masked:
                batch = [_masked(row, masked) for row in batch]
            yield batch


def copied_batches(
    conn: psycopg.Connection,
    schema: TableSchema,
    row_filter: str | None = None,
    masks: Mapping[str, Callable[[str], str]] | None = None,
) -> Batches | None:
    """The rows :func:`source_batches` reads (with ``as_text``), read through ``COPY ... TO STDOUT
    (FORMAT csv)`` and parsed by Arrow's CSV reader into record batches of text (:func:`copied`):
    no Python object for a value but a masked or a text one, for a read at the speed the server writes
    it. Each value's text hashes as the value :func:`source_batches` loads does
    (:mod:`derived_views.runs.verify_hashes`), so the buckets of the two reads agree. ``None`` when a
    column has no such text (an array of decimals, say): then the rows are read with :func:`source_batches`."""
    expressions = [copied(quote_identifier(c.name), c.type_name, masks is not None and c.name in masks) for c in schema.columns]
    if any(e is None for e in expressions):
        return None
    table = relation_sql(conn, schema.schema, schema.table)
    where = f" WHERE ({row_filter})" if row_filter is not None else ""
    sql = f"COPY (SELECT {', '.join(map(str, expressions))} FROM {table}{where}) TO STDOUT (FORMAT csv)"  # noqa: S608
    masked = [(i, masks[c.name]) for i, c in enumerate(schema.columns) if masks and c.name in masks]

    def blocks() -> Iterator[pa.RecordBatch]:
        block = bytearray()
        with conn.cursor().copy(sql) as copy:
            while row := copy.read():  # one row a message: a block ends where a row does
                block += row
                if len(block) >= _COPY_BLOCK:
                    yield from _parsed(block, len(schema.columns), masked)
                    block = bytearray()
        if block:
            yield from _parsed(block, len(schema.columns), masked)

    return lambda: read_ahead(blocks)


class _Failed:
    """An exception raised by :func:`read_ahead`'s producer, for its consumer to raise."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


_DONE = object()


def read_ahead(produce: Callable[[], Iterator[_T]], depth: int = 2) -> Iterator[_T]:
    """The items of ``produce()``, made in a thread of their own up to ``depth`` items ahead of the
    caller (the server writing a ``COPY`` and Arrow parsing it go on while the caller hashes); an
    exception there is raised here. A caller that stops early lets the thread end the read."""
    import queue
    import threading

    items: queue.Queue[Any] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def give(item: Any) -> bool:
        while not stop.is_set():
            try:
                items.put(item, timeout=0.5)
                return True
            except queue.Full:
                continue
        return False

    def run() -> None:
        try:
            for item in produce():
                if not give(item):
                    return
            give(_DONE)
        except BaseException as error:  # handed to the consumer, which raises it
            give(_Failed(error))

    thread = threading.Thread(target=run, name="cdc-verify-copy", daemon=True)
    thread.start()
    try:
        while (item := items.get()) is not _DONE:
            if isinstance(item, _Failed):
                raise item.error
            yield item
    finally:
        stop.set()
        thread.join()


def _parsed(block: bytearray, width: int, masked: list[tuple[int, Callable[[str], str]]]) -> Iterator[pa.RecordBatch]:
    """The rows of a block of ``COPY`` CSV as record batches of text (NULL where the field is empty and
    unquoted), masked columns masked."""
    import pyarrow.csv as csv

    names = [f"c{i}" for i in range(width)]
    table = csv.read_csv(
        pa.BufferReader(pa.py_buffer(block)),
        read_options=csv.ReadOptions(column_names=names),
        parse_options=csv.ParseOptions(newlines_in_values=True),
        convert_options=csv.ConvertOptions(
            column_types=dict.fromkeys(names, pa.string()),
            strings_can_be_null=True,
            quoted_strings_can_be_null=False,
            null_values=[""],
        ),
    )
    for i, mask in masked:
        values = [None if v is None else mask(v) for v in table.column(i).to_pylist()]
        table = table.set_column(i, names[i], pa.array(values, type=pa.string()))
    yield from table.combine_chunks().to_batches()  # one batch: its columns are hashed each at once


def _masked(row: Row, masked: list[tuple[int, Callable[[str], str]]]) -> Row:
    values = list(row)
    for i, mask in masked:
        if values[i] is not None:
            values[i] = mask(values[i])
    return tuple(values)


@dataclass
class ViewTable:
    """A view table read for a comparison: the source names of its columns, its row count (from its
    Delta log), and its rows in a :class:`Layout`'s order (NULL for a column it does not hold)."""

    columns: frozenset[str]
    rows: int
    batches: Callable[[], Iterator[Any]]
    """A new read of the rows, of the same table version each time, as Arrow record batches."""
    holding_values: Callable[[list[str]], list[str]]
    """Those of the given columns (source names) that hold a value other than NULL in the rows read."""
    types: list[Any]
    """The Arrow type of each column of the :class:`Layout` (``None``: the table does not hold it)."""


def view_table(path: str, view: str, layout: Layout, names: Iterable[str] = (), where: str = "") -> ViewTable:
    """The Delta table at ``path`` (the rows matching the SQL ``where``), its columns stored for
    ``names`` known by those names.

    Read with ``deltalake``, not Spark: a second reader of the table's files, the one every view table
    promises to open, and one that answers a small table in milliseconds where a Spark read plans a job."""
    from deltalake import DeltaTable

    if not DeltaTable.is_deltatable(path):
        raise MissingTableError(path, view)
    table = open_table(path)
    stored = [f.name for f in table.schema().fields]
    held = source_columns(names, stored)
    back = {column: name for name, column in held.items()}
    files = pa.table(table.get_add_actions(flatten=True))
    rows = sum(n or 0 for n in files.column("num_records").to_pylist()) if "num_records" in files.column_names else 0
    present = [name for name in layout.names if name in held]
    condition = f" WHERE {where}" if where else ""
    selected = ", ".join(quote_identifier(held[name]) for name in present) or "1"
    sql = f"SELECT {selected} FROM t{condition}"  # noqa: S608 - quoted names
    columns = frozenset(back.get(c, c) for c in stored)

    def holding_values(names: list[str]) -> list[str]:
        if not names:
            return []
        counts = ", ".join(f"count({quote_identifier(held.get(name, name))})" for name in names)
        found = stream_query(path, f"SELECT {counts} FROM t{condition}", table).read_all()  # noqa: S608 - quoted names
        return [name for i, name in enumerate(names) if found.column(i)[0].as_py()]

    schema = stream_query(path, sql, table).schema
    types = [schema.field(present.index(name)).type if name in held else None for name in layout.names]
    return ViewTable(columns, rows, lambda: _aligned(stream_query(path, sql, table), layout, present), holding_values, types)


def _aligned(reader: Iterable[Any], layout: Layout, present: list[str]) -> Iterator[pa.RecordBatch]:
    """The reader's batches with a column per column of ``layout`` (all NULL for one not ``present``)."""
    position = {name: i for i, name in enumerate(present)}
    names = [f"c{i}" for i in range(len(layout.names))]
    for batch in reader:
        if not batch.num_rows:
            continue
        columns = [batch.column(position[n]) if n in position else pa.nulls(batch.num_rows) for n in layout.names]
        yield pa.RecordBatch.from_arrays(columns, names=names)
