r"""Reading the included tables inside the slot's exported snapshot, a column at a time.

Consistency rule: the slot is created with ``SNAPSHOT 'export'`` and every table is read in
REPEATABLE READ transactions that import that snapshot (a few sessions, each importing the same
snapshot, so that the server reads several chunks at once; all of them see exactly the same rows).
The snapshot sees exactly the transactions that committed before the slot's consistent point, and the
slot streams exactly those that commit after it, so snapshot plus stream have no gap and no overlap.
That is why streaming must start at the consistent point and nowhere else. The snapshot transactions
must be open before the replication connection that exported the snapshot runs another command or
closes. Each block range is read by exactly one session, and chunks are handed on in range order.

Rows are read in chunks of physical block ranges (``ctid >= '(a,0)' AND ctid < '(b,0)'``, a TID range
scan; the last range is open-ended, so rows in blocks added later are still read). For each chunk the
server returns one row: per column the text forms of the chunk's rows joined by newlines, and the row
count (:mod:`cdc.capture.snapshot_chunks`: the queries, and the row turned into Arrow columns). Python
turns each column into JSON with the stream's own encoders (:mod:`cdc.capture.arrow_fragments`), so a row
reads the same whichever path carried it, and the reads go to the log as columns
(:class:`~log_store.ProducerColumns`): no Python object per row on the common types. Server and client
work is a few C-level passes per column: about as much as ``COPY`` of the table. Fetching, converting and
writing chunks overlap (see :meth:`SnapshotReader.column_chunks`); the chunks still reach the log in range
order.
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Callable, Generator, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import closing
from functools import partial
from typing import TypeVar, cast

import psycopg
import pyarrow as pa
from psycopg import sql
from psycopg.types.string import ByteaBinaryLoader

from cdc.capture.catalog import RELATION_STATE, SESSION_OPTIONS
from cdc.capture.errors import SourceError
from cdc.capture.reads.read_conditions import SEARCH_PATH_OPTION
from cdc.capture.snapshot_chunks import ColumnQuery, chunk_columns, column_query, keyset_query, last_key
from cdc.capture.tables import TableShape

#: The table itself, or the leaf partitions of a partitioned table (parameters: relid three times).
_LEAVES = (
    "SELECT oid AS relid FROM pg_class WHERE oid = %s AND relkind <> 'p' "
    "UNION ALL SELECT relid FROM pg_partition_tree(%s) WHERE isleaf AND relid <> %s"
)

T = TypeVar("T")
#: Builds what a chunk becomes from ``(first, count, keys, after)`` (see :meth:`SnapshotReader.column_chunks`).
ChunkBuilder = Callable[[int, int, "pa.Array | None", "list[pa.Array | pa.Scalar]"], T]
#: Rows a snapshot chunk holds by default (fewer when they are long, see :data:`CHUNK_BYTES`).
CHUNK_ROWS = 20_000
#: Threads turning chunks into columns; how many built chunks may wait for the caller (one more waits
#: with the feeder for room), and fetched ones per session: enough to keep the server and the converters
#: busy while the caller writes, about 40 MB of envelopes at :data:`CHUNK_ROWS` rows a chunk. Measured
#: on a 1M-row table: chunks of 20,000 rows with 6 waiting read 1.21-1.31M rows/s, chunks of 10,000
#: with 12 waiting 1.0-1.15M.
CONVERTERS, AHEAD, FETCHED = 2, 6, 4
#: Built chunks of a read by key (:meth:`SnapshotReader.keyset_chunks`) that may wait for the caller.
KEYSET_AHEAD = 4
#: Stored bytes (heap and TOAST) a snapshot chunk reads at most, by the table's statistics.
CHUNK_BYTES = 8 << 20


def _hand_over(results: queue.Queue[T], item: T, stop: threading.Event) -> bool:
    """Put ``item`` into ``results`` once there is room; ``False`` when ``stop`` was set first."""
    while not stop.is_set():
        try:
            results.put(item, timeout=0.2)
            return True
        except queue.Full:
            continue
    return False


def _taken(results: queue.Queue[T], producer: threading.Thread) -> T:
    """The next item of ``results``, waiting while ``producer`` runs; raises once it ended without one."""
    while True:
        try:
            return results.get(timeout=0.2)
        except queue.Empty:
            if not producer.is_alive() and results.empty():
                raise RuntimeError(f"{producer.name} ended without handing over the rest of the snapshot") from None


def _built(shape: TableShape, row: Sequence[object], build: ChunkBuilder[T], first: int, count: int) -> T:
    return build(first, count, *chunk_columns(shape, row))


def _fetched_row(conn: psycopg.Connection[tuple[object, ...]], query: sql.Composed) -> Sequence[object]:
    """The one result row of a chunk query on ``conn``, its texts as the server sends them (bytes)."""
    try:
        with conn.cursor(binary=True) as cursor:
            cursor.adapters.register_loader("text", ByteaBinaryLoader)
            row = cursor.execute(query).fetchone()
    except psycopg.Error as exc:
        raise SourceError(f"snapshot query failed: {str(exc).strip().splitlines()[0]}") from exc
    assert row is not None
    return row


def _keyset_built(
    shape: TableShape, row: Sequence[object], key_columns: list[int], build: ChunkBuilder[T], first: int, count: int
) -> tuple[T, tuple[str, ...]]:
    """A keyset chunk's result row built, with its last row's key texts."""
    return build(first, count, *chunk_columns(shape, row)), last_key(row, key_columns)


class SnapshotReader:
    """Read-only REPEATABLE READ transactions importing ``snapshot_name``; close when done.

    ``connections`` sessions import the same exported snapshot (so they all see exactly the same
    rows) and the table's block ranges are spread over them: the server reads several chunks at once,
    on as many cores, while Python appends. Construct it while the replication
    connection that exported the snapshot is still open and idle; a session that cannot be opened
    beyond the first only lowers the parallelism.
    """

    def __init__(self, url: str, snapshot_name: str, connections: int = 2) -> None:
        self._conn = self._open(url, snapshot_name)
        row = self._conn.execute("SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint").fetchone()
        self.xmin = int(row[0]) if row else 0  # type: ignore[call-overload]
        self._helpers: list[psycopg.Connection[tuple[object, ...]]] = []
        for _ in range(connections - 1):
            try:
                self._helpers.append(self._open(url, snapshot_name))
            except (SourceError, psycopg.Error):
                break  # e.g. max_connections reached: read with the sessions already open

    @staticmethod
    def _open(url: str, snapshot_name: str) -> psycopg.Connection[tuple[object, ...]]:
        try:
            # search_path: a partial read's condition resolves in pg_catalog alone (cdc.capture.reads.read_conditions);
            # every query of a read names its tables in full and calls built-ins only
            conn = psycopg.connect(url, options=f"{SESSION_OPTIONS} {SEARCH_PATH_OPTION}", client_encoding="UTF8")
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

    @property
    def pids(self) -> list[int]:
        """The server processes of the snapshot's sessions (what another session's lock may wait for)."""
        return [conn.info.backend_pid for conn in [self._conn, *self._helpers]]

    def hold(self, shape: TableShape, now: Callable[[], list[tuple[object, ...]]], lock_timeout_ms: int) -> str | None:
        """Lock the table (``ACCESS SHARE``, its partitions too) in every session for the rest of the
        snapshot, so that no rewrite, ``TRUNCATE`` or change of its columns commits while it is read;
        ``None`` once it is held, else why it cannot be read in this snapshot (nothing is then held).

        A lock that cannot be had within ``lock_timeout_ms`` (another session holds or waits for a
        stronger one: DDL) is one reason; a table whose columns or file node (:data:`RELATION_STATE`)
        differ between the snapshot and ``now()`` (the state on a fresh connection, asked once the lock
        is held) the other: a rewrite or ``TRUNCATE`` committed since the snapshot makes the table look
        empty to it (PostgreSQL's documented exception to MVCC), and a change of its columns would give
        rows of a shape the snapshot never held. The lock timeout stays for the snapshot's later
        queries, so none of them waits long for a lock either."""
        sessions = [self._conn, *self._helpers]
        table = sql.Identifier(shape.schema, shape.table)
        try:
            for conn in sessions:
                conn.execute("SAVEPOINT cdc_hold")
            for conn in sessions:
                conn.execute("SELECT set_config('lock_timeout', %s, true)", (f"{lock_timeout_ms}ms",))
                conn.execute(sql.SQL("LOCK TABLE {} IN ACCESS SHARE MODE").format(table))
            then = self._conn.execute(RELATION_STATE, (shape.relid, shape.relid)).fetchall()
            why = None if then == now() else "its columns or storage changed since the snapshot"
        except psycopg.errors.LockNotAvailable:
            why = "another session holds or waits for a lock on it"
        except psycopg.Error as exc:
            raise SourceError(f"cannot lock {shape.qualified} for its read: {str(exc).strip().splitlines()[0]}") from exc
        try:
            for conn in sessions:
                conn.execute("ROLLBACK TO SAVEPOINT cdc_hold" if why else "RELEASE SAVEPOINT cdc_hold")
        except psycopg.Error as exc:
            raise SourceError(f"cannot lock {shape.qualified} for its read: {str(exc).strip().splitlines()[0]}") from exc
        return why

    def _row(self, query: str, params: tuple[object, ...]) -> tuple[object, ...] | None:
        """The first row of a catalog query in the snapshot's first session; a lost connection (a server
        restart) is a :class:`SourceError`, which capture reconnects after."""
        try:
            return self._conn.execute(query, params).fetchone()  # type: ignore[arg-type]
        except psycopg.Error as exc:
            raise SourceError(f"a snapshot's catalog query failed: {str(exc).strip().splitlines()[0]}") from exc

    def partitioned(self, relid: int) -> bool:
        """Whether the table is partitioned (read through its root, see :func:`~cdc.capture.snapshot_chunks.relation`)."""
        row = self._row("SELECT relkind = 'p' FROM pg_class WHERE oid = %s", (relid,))
        return bool(row and row[0])

    def estimate(self, relid: int) -> int:
        """Estimated row count (pg_class.reltuples summed over partitions), for progress only."""
        row = self._row(
            f"SELECT COALESCE(sum(GREATEST(c.reltuples, 0)), 0)::bigint FROM ({_LEAVES}) t JOIN pg_class c ON c.oid = t.relid",
            (relid, relid, relid),
        )
        return int(row[0]) if row else 0  # type: ignore[call-overload]

    def blocks(self, relid: int) -> tuple[int, float, float]:
        """(heap blocks of the largest leaf partition, estimated rows per block, stored bytes per heap block
        with the rows' TOAST data) of a table; an estimate is 0 when unknown."""
        row = self._row(
            "SELECT COALESCE(max(pg_relation_size(t.relid)), 0) / current_setting('block_size')::bigint, "
            "COALESCE(sum(GREATEST(c.reltuples, 0)) / NULLIF(sum(c.relpages), 0), 0)::float8, "
            "COALESCE(sum(pg_table_size(t.relid))::float8 / NULLIF(sum(pg_relation_size(t.relid)) "
            "/ current_setting('block_size')::bigint, 0), 0)::float8 "
            f"FROM ({_LEAVES}) t JOIN pg_class c ON c.oid = t.relid",
            (relid, relid, relid),
        )
        return (int(row[0]), float(row[1]), float(row[2])) if row else (0, 0.0, 0.0)  # type: ignore[call-overload, arg-type]

    def rows_within(self, relid: int, chunk_rows: int, chunk_bytes: int | None = None) -> int:
        """``chunk_rows``, fewer when the table's rows are long: about ``chunk_bytes`` (default
        :data:`CHUNK_BYTES`) of stored data (TOAST included) per chunk, as :meth:`column_chunks` bounds
        its block ranges (unknown sizes, before the table was ever analysed, bound nothing)."""
        _, per_block, block_bytes = self.blocks(relid)
        if per_block > 0 and block_bytes > 0:
            chunk_rows = min(chunk_rows, int((chunk_bytes or CHUNK_BYTES) * per_block / block_bytes))
        return max(1, chunk_rows)

    def column_chunks(
        self,
        shape: TableShape,
        build: ChunkBuilder[T],
        chunk_rows: int = CHUNK_ROWS,
        chunk_bytes: int | None = None,
        *,
        row_filter: str | None = None,
    ) -> Iterator[T]:
        """Every row of the table, a block range per chunk, as ``build(first, count, keys, after)`` of
        each non-empty chunk (``first``: the table's rows in the chunks before it; ``keys``: an Arrow
        array of key JSON, ``None`` for a keyless table; ``after``: the pieces of the ``after`` JSON,
        see :func:`~cdc.capture.snapshot_chunks.chunk_columns`), in range order.

        A chunk holds about ``chunk_rows`` rows, fewer when the table's rows are long: about
        ``chunk_bytes`` (default :data:`CHUNK_BYTES`) of stored data (TOAST included) per chunk, so
        that wide rows neither exceed the server's limit on one aggregated value (1 GB) nor hold much
        memory on either side. A partitioned table is read through its root: each block range is read
        from every partition. ``row_filter``: the publication's row filter of the table (see
        :func:`~cdc.capture.snapshot_chunks.column_query`); the columns read are the shape's, which holds the published ones only.

        Chunks are fetched by one thread per session (at most :data:`FETCHED` wait per session), then
        turned into columns and built on one of :data:`CONVERTERS` threads, to which a feeder thread
        hands them as they arrive (at most :data:`AHEAD` wait for the caller, and one more with the
        feeder): the Arrow kernels release the GIL, so the server reads, chunks are converted and the
        caller writes earlier ones all at once, and the caller gets the first chunk as soon as it is
        built. Should the feeder end without a word (it hands over every outcome, so it should not),
        the caller raises instead of waiting for ever.
        """
        plan = column_query(shape, row_filter, partitioned=self.partitioned(shape.relid))
        ranges = self._block_ranges(shape, chunk_rows, chunk_bytes or CHUNK_BYTES)
        stop = threading.Event()
        # built chunks in range order, then None; or the exception that ended the reading
        ahead: queue.Queue[Future[T] | BaseException | None] = queue.Queue(maxsize=AHEAD)
        with ThreadPoolExecutor(CONVERTERS, thread_name_prefix="snapshot-convert") as pool:

            def feed() -> None:
                first = 0
                try:
                    with closing(self._prefetched(plan, ranges)) as rows:
                        for row in rows:
                            count = int(cast(int, row[-1])) if row is not None else 0
                            if count:
                                future = pool.submit(_built, shape, cast("Sequence[object]", row), build, first, count)
                                if not _hand_over(ahead, future, stop):
                                    future.cancel()
                                    return
                                first += count
                    _hand_over(ahead, None, stop)
                except BaseException as exc:  # noqa: BLE001 - handed to the caller below
                    _hand_over(ahead, exc, stop)

            yield from _drained(ahead, threading.Thread(target=feed, name="snapshot-feed", daemon=True), stop)

    def keyset_chunks(
        self,
        shape: TableShape,
        build: ChunkBuilder[T],
        keys: tuple[str, ...],
        after: tuple[str, ...] | None,
        first: int,
        limit: int,
        *,
        row_filter: str | None = None,
    ) -> Generator[tuple[T, tuple[str, ...]], None, None]:
        """The chunks of at most ``limit`` rows past the key ``after``
        (:func:`~cdc.capture.snapshot_chunks.keyset_query`), in key order, each as ``build(first, count, keys,
        after)`` (``first`` counts on from the argument) with its last row's key texts; the last chunk is the
        first one not full.

        Read ahead of the caller, on every session of the snapshot at once: each session fetches the
        chunk after the last one asked for, from the last key known, passing over the rows of the chunks
        still being fetched (``OFFSET``; the sessions all see the same snapshot, and the key orders its
        rows the same for each); chunks are turned into columns on one of :data:`CONVERTERS` threads
        while the caller writes earlier ones, and at most :data:`KEYSET_AHEAD` built chunks wait for it.
        Each session runs one statement at a time (psycopg's connection lock), so reads sharing a
        snapshot share its sessions. Closing the iterator (or an error) ends its threads before it
        returns, so the sessions are free for the snapshot's end (a read giving way to DDL waits for the
        chunks being fetched, one per session); the chunks fetched ahead are dropped.

        Measured on a 1M-row table (``bench/capture_reread.py``, two sessions, two cores shared with
        other work): the read itself took 0.9-1.5 s where one chunk at a time on the capture thread took
        2.0-3.3 s (``COPY`` of the table to /dev/null: 0.45 s); what is left is the server's work per
        chunk (``timestamptz`` output about a third of it) and the log's append, each about half a second.
        """
        sessions = [self._conn, *self._helpers]
        query_of = partial(keyset_query, shape, keys, row_filter=row_filter, partitioned=self.partitioned(shape.relid))
        names = [column.name for column in shape.columns]
        key_columns = [names.index(key) for key in keys]
        stop = threading.Event()
        ahead: queue.Queue[Future[tuple[T, tuple[str, ...]]] | BaseException | None] = queue.Queue(maxsize=KEYSET_AHEAD)
        with (
            ThreadPoolExecutor(len(sessions), thread_name_prefix="snapshot-keyset") as fetchers,
            ThreadPoolExecutor(CONVERTERS, thread_name_prefix="snapshot-convert") as pool,
        ):

            def feed() -> None:
                last, rows = after, first
                # (session, chunk query result) in key order; the oldest is taken first, and its session
                # then fetches the chunk past the last one asked for, counting from the key just learnt
                fetching: deque[tuple[psycopg.Connection[tuple[object, ...]], Future[Sequence[object]]]] = deque()
                try:
                    for index, conn in enumerate(sessions):
                        query = query_of(last, limit, skip=index * limit)
                        fetching.append((conn, fetchers.submit(_fetched_row, conn, query)))
                    while not stop.is_set():
                        conn, fetched = fetching.popleft()
                        row = fetched.result()
                        count = int(cast(int, row[-1]))
                        if count:
                            future = pool.submit(_keyset_built, shape, row, key_columns, build, rows, count)
                            if not _hand_over(ahead, future, stop):
                                future.cancel()
                                return
                            rows += count
                            last = last_key(row, key_columns)
                        if count < limit:
                            _hand_over(ahead, None, stop)
                            return
                        query = query_of(last, limit, skip=len(fetching) * limit)
                        fetching.append((conn, fetchers.submit(_fetched_row, conn, query)))
                except BaseException as exc:  # noqa: BLE001 - handed to the caller below
                    _hand_over(ahead, exc, stop)

            yield from _drained(ahead, threading.Thread(target=feed, name="snapshot-keyset-feed", daemon=True), stop)

    def _block_ranges(self, shape: TableShape, chunk_rows: int, chunk_bytes: int) -> list[tuple[int, int | None]]:
        """The table's block ranges of about ``chunk_rows`` rows and at most about ``chunk_bytes`` each,
        the last one open-ended, so that no block past the counted ones is missed."""
        blocks, per_block, block_bytes = self.blocks(shape.relid)
        step = int(chunk_rows / per_block) if per_block > 0 else 64
        if block_bytes > 0:
            step = min(step, int(chunk_bytes / block_bytes))
        step = max(1, step)
        ranges: list[tuple[int, int | None]] = [(first, first + step) for first in range(0, blocks, step)]
        return ranges[:-1] + [(ranges[-1][0], None)] if ranges else [(0, None)]

    def _prefetched(
        self, plan: ColumnQuery, ranges: list[tuple[int, int | None]]
    ) -> Generator[Sequence[object] | None, None, None]:
        """Chunk results in range order; range ``i`` is fetched by session ``i % sessions`` in a thread of its own."""
        sessions = [self._conn, *self._helpers]
        queues: list[queue.Queue[tuple[Sequence[object] | None, BaseException | None]]] = [
            queue.Queue(maxsize=FETCHED) for _ in sessions
        ]
        stop = threading.Event()

        def fetch(
            conn: psycopg.Connection[tuple[object, ...]],
            mine: list[tuple[int, int | None]],
            results: queue.Queue[tuple[Sequence[object] | None, BaseException | None]],
        ) -> None:
            try:
                with conn.cursor(binary=True) as cursor:
                    # the chunk's texts as the server sends them (UTF-8, see _open): bytes, never decoded
                    cursor.adapters.register_loader("text", ByteaBinaryLoader)
                    for first, end in mine:
                        if stop.is_set():
                            return
                        _hand_over(results, (cursor.execute(plan.chunk(first, end)).fetchone(), None), stop)
            except BaseException as exc:  # noqa: BLE001 - handed to the consumer below
                _hand_over(results, (None, exc), stop)

        workers = [
            threading.Thread(
                target=fetch,
                args=(conn, ranges[index :: len(sessions)], queues[index]),
                name=f"snapshot-fetch-{index}",
                daemon=True,
            )
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


def _drained(
    ahead: queue.Queue[Future[T] | BaseException | None], feeder: threading.Thread, stop: threading.Event
) -> Iterator[T]:
    """The built chunks ``feeder`` (started here) hands over through ``ahead``, in order, until its ``None``
    (an exception it hands over is raised); at the end, however it comes, ``feeder`` is stopped and
    waited for, and the chunks still waiting are cancelled."""
    feeder.start()
    try:
        while (item := _taken(ahead, feeder)) is not None:
            if isinstance(item, BaseException):
                raise item
            yield item.result()
    finally:
        stop.set()
        feeder.join()
        _cancel_waiting(ahead)


def _cancel_waiting(ahead: queue.Queue[Future[T] | BaseException | None]) -> None:
    """Cancel the conversions still waiting in ``ahead`` (the caller stopped reading)."""
    while not ahead.empty():
        left = ahead.get_nowait()
        if isinstance(left, Future):
            left.cancel()
