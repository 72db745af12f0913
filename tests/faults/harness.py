"""What the fault tests share: ``cdc`` subprocesses to kill, a write load on the reference schema, and
the comparison of the log with the source.

Everything here is real: the capture and sync commands run as their own process groups (so that
``kill -9`` reaches a sync's JVM and its Python workers too), the load writes through ordinary
connections, and the log is read back with the log store's reader.
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import orjson
import psycopg
import pytest
from psycopg import sql

from cdc.capture.lsn import Lsn
from cdc.config.log_backend import open_log
from cdc.config.settings import Settings
from log_store import LogStore
from tests.cdc.helpers import read_topic, replay

#: The ``cdc`` command of the environment running the tests.
CDC = str(Path(sys.executable).with_name("cdc"))

#: The reference tables and their primary keys (the event key's columns, sorted as the key sorts them).
KEYS: dict[str, tuple[str, ...]] = {
    "categories": ("id",),
    "customers": ("id",),
    "products": ("id",),
    "orders": ("id",),
    "order_items": ("line_no", "order_id"),
}


def cdc_env(url: str, data_dir: Path, **settings: str) -> dict[str, str]:
    """The environment of a ``cdc`` subprocess: this one's (``PYTHONPATH`` included) with only the given
    settings among ``CDC_*``."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith("CDC_") or name in ("CDC_PG_BINDIR", "CDC_SPARK_JARS_DIR")
    }
    env.update(CDC_DATABASE_URL=url, CDC_DATA_DIR=str(data_dir))
    env.update({f"CDC_{name.upper()}": value for name, value in settings.items()})
    return env


def run_cdc(env: dict[str, str], *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``cdc ARGS`` to its end."""
    return subprocess.run([CDC, *args], env=env, capture_output=True, text=True, timeout=timeout, cwd="/")


class CdcProcess:
    """One ``cdc`` command running in a process group of its own, its stderr kept in a file."""

    def __init__(self, env: dict[str, str], args: list[str], stderr: Path) -> None:
        self.args = args
        self.stderr_path = stderr
        self._stderr: IO[bytes] = open(stderr, "wb")  # noqa: SIM115 - closed in wait()
        self.started = time.monotonic()
        self.process = subprocess.Popen(
            [CDC, *args], env=env, stdout=subprocess.DEVNULL, stderr=self._stderr, start_new_session=True, cwd="/"
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def running(self) -> bool:
        return self.process.poll() is None

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def kill9(self) -> bool:
        """``kill -9`` of the whole group; whether it ended the command (rather than finding it ended)."""
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return self.wait() == -signal.SIGKILL

    def terminate(self, timeout: float = 120) -> int:
        """SIGTERM (finish the batch, confirm, exit) and the exit status."""
        self.process.send_signal(signal.SIGTERM)
        return self.wait(timeout)

    def wait(self, timeout: float = 120) -> int:
        try:
            return self.process.wait(timeout)
        finally:
            self._stderr.close()


class Running:
    """The loads and ``cdc`` processes a test started, stopped and killed when it ends however it ends."""

    def __init__(self) -> None:
        self.loads: list[Load] = []
        self.processes: list[CdcProcess] = []

    def load(self, url: str, seed: int, **options: Any) -> Load:
        load = Load(url, seed, **options)
        self.loads.append(load)
        load.start()
        return load

    def cdc(self, env: dict[str, str], args: list[str], stderr: Path) -> CdcProcess:
        process = CdcProcess(env, args, stderr)
        self.processes.append(process)
        return process

    def close(self) -> None:
        for process in self.processes:
            if process.running():
                process.kill9()
        for load in self.loads:
            load.stop.set()
        for load in self.loads:
            load.join(60)


#: Where a test's log is: the data directory of an embedded log, or settings naming a log of either backend.
Where = Path | Settings


def _prefix(where: Where) -> str:
    return where.topic_prefix if isinstance(where, Settings) else "cdc"


def watermark(where: Where) -> int | None:
    """The log's durable commit watermark as an LSN (None before the log has one)."""
    try:
        with open_log(where) if isinstance(where, Settings) else LogStore.open(where / "log") as log:
            latest = log.latest_watermark()
    except Exception:  # noqa: BLE001 - no log yet (the first capture has not created it)
        return None
    return int(latest.position, 16) if latest is not None else None


def first_reads_done(url: str, where: Where, publication: str = "cdc_publication") -> bool:
    """Whether every table ``publication`` publishes has been read into the log (a new log's first reads, or
    the reads again after a gap): the ledger holds its record, and no read of it is under way or asked for."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute("SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s", (publication,))
        published = {f"{schema}.{table}" for schema, table in rows.fetchall()}
    try:
        ledger = read_topic(where, f"{_prefix(where)}.__snapshots")
    except Exception:  # noqa: BLE001 - no log yet (the first capture has not created it)
        return False
    read: set[str] = set()
    open_marks: set[tuple[str, ...]] = set()  # ["read", table] progress and ["asked", table, where] notes
    for record in ledger:
        name = orjson.loads(record.key) if record.key else None
        if isinstance(name, str) and record.value is not None:
            read.add(name)
        elif isinstance(name, list) and name[0] in ("read", "asked"):
            (open_marks.add if record.value is not None else open_marks.discard)(tuple(map(str, name)))
    return bool(published) and published <= read - {mark[1] for mark in open_marks}


def wal_lsn(url: str) -> Lsn:
    """The server's current WAL write position."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
    assert row is not None
    return Lsn.parse(row[0])


def slot_confirmed(url: str, slot: str = "cdc_slot") -> Lsn | None:
    """The slot's confirmed_flush_lsn (None when the slot does not exist)."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone()
    return Lsn.parse(row[0]) if row and row[0] else None


def poll(condition: Callable[[], bool], timeout: float, what: str, every: float = 0.05) -> None:
    """Poll ``condition`` until it holds; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(every)


# -- the source and the log, in the events' value form -------------------------------------------------


def _column_expression(name: str, udt: str) -> sql.Composable:
    """A column in the form its change events hold it (docs/event-format.md), for ``jsonb_build_object``."""
    column = sql.Identifier(name)
    if udt in ("int2", "int4", "int8", "bool", "_text"):
        return column
    if udt == "timestamptz":  # the session runs in UTC: '2026-11-21 12:45:00.123456+00' -> '...T12:45:00.123456Z'
        return sql.SQL("regexp_replace({}::text, '^(\\S+) (\\S+)\\+00$', '\\1T\\2Z')").format(column)
    return sql.SQL("{}::text").format(column)  # numeric, jsonb, uuid, enum, text


def source_rows(url: str) -> dict[str, dict[bytes, dict[str, Any]]]:
    """Every row of the reference tables, read in one snapshot, keyed by its event key."""
    out: dict[str, dict[bytes, dict[str, Any]]] = {}
    with psycopg.connect(url, options="-c TimeZone=UTC") as conn:
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        for table, key in KEYS.items():
            columns = conn.execute(
                "SELECT column_name, udt_name FROM information_schema.columns WHERE table_schema = 'public' "
                "AND table_name = %s ORDER BY ordinal_position",
                (table,),
            ).fetchall()
            pairs = sql.SQL(", ").join(
                sql.SQL("{}, {}").format(sql.Literal(name), _column_expression(name, udt)) for name, udt in columns
            )
            query = sql.SQL("SELECT jsonb_build_object({}) FROM {}").format(pairs, sql.Identifier(table))
            rows = [row[0] for row in conn.execute(query).fetchall()]
            out[table] = {orjson.dumps({k: row[k] for k in key}, option=orjson.OPT_SORT_KEYS): row for row in rows}
    return out


def log_rows(where: Where) -> dict[str, dict[bytes, dict[str, Any]]]:
    """Every reference table as replaying its topic from offset 0 makes it (strict: an impossible history fails)."""
    return {table: replay(where, f"{_prefix(where)}.public.{table}") for table in KEYS}  # type: ignore[misc]


def truncate_markers(where: Where) -> dict[str, int]:
    """Per reference table, the truncate markers a snapshot wrote into its topic (one per partition each time)."""
    counts = {}
    for table in KEYS:
        values = (orjson.loads(r.value) for r in read_topic(where, f"{_prefix(where)}.public.{table}") if r.value is not None)
        counts[table] = sum(1 for v in values if v["op"] == "t" and v["source"]["snapshot"] == "true")
    return counts


@dataclass
class Comparison:
    """The log's tables against the source's."""

    compared: int = 0
    differences: list[str] = field(default_factory=list)

    def line(self) -> str:
        return f"rows compared {self.compared}, differences {len(self.differences)}"


def compare_log(url: str, where: Where) -> Comparison:
    """Replay every topic of the log and compare it with the source, row by row."""
    result = Comparison()
    source, log = source_rows(url), log_rows(where)
    for table in KEYS:
        expected, actual = source[table], log[table]
        result.compared += len(expected)
        for key in sorted(expected.keys() | actual.keys()):
            if key not in actual:
                result.differences.append(f"{table} {key.decode()}: missing from the log")
            elif key not in expected:
                result.differences.append(f"{table} {key.decode()}: in the log, not in the source")
            elif actual[key] != expected[key]:
                result.differences.append(f"{table} {key.decode()}: log {actual[key]} != source {expected[key]}")
    return result


# -- the views ------------------------------------------------------------------------------------------

_EQUALS = re.compile(r"warehouse equals the source: (\d+) rows compared as of LSN ([0-9A-F]{16})")


@dataclass(frozen=True)
class Verified:
    """What ``cdc verify warehouse`` reported, and the as-of LSN of every warehouse table."""

    compared: int
    as_of: str
    watermark: str
    tables: dict[str, str]

    def line(self) -> str:
        return f"cdc verify warehouse: {self.compared} rows compared, 0 differences, as of {self.as_of}"


def verify_warehouse(url: str, data_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Verified:
    """``cdc verify warehouse`` (which syncs first), run in this process so that it uses the test session's
    Spark (one Spark run, without starting another JVM): exit 0, and then every warehouse table is as of
    the log's latest watermark: it records that watermark, or it applied every event of its topic up to
    it (a table with no new event records the newer watermark beside its log, which a crash may lose)."""
    from cdc.cli import cli, run
    from cdc.commands import register
    from derived_views.runs.status import delta_tables, table_progress

    monkeypatch.setenv("CDC_DATABASE_URL", url)
    monkeypatch.setenv("CDC_DATA_DIR", str(data_dir))
    register(cli)
    capsys.readouterr()
    status = run(cli, ["verify", "warehouse"])
    out, err = capsys.readouterr()
    assert status == 0, f"cdc verify warehouse exited {status}:\n{out}\n{err}"
    found = _EQUALS.search(out)
    assert found, out
    with LogStore.open(data_dir / "log") as log:
        latest = log.latest_watermark()
    assert latest is not None
    tables: dict[str, str] = {}
    behind: dict[str, str] = {}
    for path in delta_tables(data_dir / "warehouse"):
        progress = table_progress(path)
        if progress is not None:
            tables[str(path.relative_to(data_dir))] = progress.position
            applied = bool(progress.offsets) and all(
                progress.next_offset(tp.topic, str(tp.partition)) >= end
                for tp, end in latest.end_offsets.items()
                if tp.topic in progress.offsets
            )
            if progress.position != latest.position and not applied:
                behind[str(path.relative_to(data_dir))] = progress.position
    assert len(tables) == 2 * len(KEYS), f"warehouse tables with progress: {sorted(tables)}"
    assert not behind, f"warehouse tables not as of the log's watermark {latest.position}: {behind}"
    return Verified(int(found.group(1)), found.group(2), latest.position, tables)


# -- the write load -------------------------------------------------------------------------------------


def seed(url: str, products: int = 1000, orders: int = 300) -> None:
    """Categories, customers, products, orders with three items each."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("INSERT INTO categories (name) VALUES ('Lighting'), ('Garden'), ('Kitchen'), ('Tools')")
        conn.execute(
            "INSERT INTO customers (email, name) SELECT 'c' || g || '@example.com', 'Customer ' || g "
            "FROM generate_series(1, 20) g"
        )
        conn.execute(
            "INSERT INTO products (category_id, name, description, price, attributes, tags) "
            "SELECT 1 + g %% 4, 'Product ' || g, 'about product ' || g, 10 + g * 0.25, "
            "jsonb_build_object('n', g, 'ok', g %% 2 = 0), ARRAY['t' || g %% 5, 'all'] FROM generate_series(1, %s) g",
            (products,),
        )
        conn.execute(
            "INSERT INTO orders (customer_id, status, total) SELECT 1 + g %% 20, 'pending', g FROM generate_series(1, %s) g",
            (orders,),
        )
        conn.execute(
            "INSERT INTO order_items (order_id, line_no, product_id, quantity, unit_price) "
            "SELECT o.id, l, 1 + (l * 37 + o.customer_id) %% %s, l, 9.95 "
            "FROM orders o, generate_series(1, 3) l",
            (products,),
        )


@dataclass(frozen=True)
class Written:
    """One transaction of the load: its id (as the events' ``source.txId``), the rows it wrote, and the
    WAL position before it began (its commit is later)."""

    xid: int
    rows: int
    before: Lsn


def transaction_differences(where: Where, load: Load) -> tuple[int, list[str]]:
    """Check the log transaction by transaction against what the load committed: nothing lost, nothing
    doubled, nothing partial. Every streamed event belongs to a transaction of the load, which has in the
    log exactly as many change events as it wrote rows. A transaction that began after the latest read's
    position must be there whole; one that began before may instead be in the reads: wholly (then it has
    no event) or in part (each table is read from a snapshot of its own, so a transaction that committed
    while one table's read was under way and after another's has the events of the second table only).
    Returns the transactions checked and the differences."""
    events: dict[int, int] = {}
    snapshot_point = 0
    for table in KEYS:
        for record in read_topic(where, f"{_prefix(where)}.public.{table}"):
            if record.value is None:
                continue  # a delete's tombstone
            source = orjson.loads(record.value)["source"]
            if source["snapshot"] != "false":
                snapshot_point = max(snapshot_point, int(source["lsn"]) + 1)
            else:
                events[source["txId"]] = events.get(source["txId"], 0) + 1
    differences = []
    known = {tx.xid: tx for tx in load.committed}
    uncertain = {tx.xid: tx for tx in load.uncertain}
    for xid, count in sorted(events.items()):
        tx = known.get(xid) or uncertain.get(xid)
        if tx is None:
            differences.append(f"transaction {xid}: {count} events in the log, but the load committed no such transaction")
        elif count > tx.rows or (count < tx.rows and tx.before >= max(snapshot_point, load.reads_end)):
            differences.append(f"transaction {xid}: {count} events in the log for {tx.rows} rows written")
    for tx in load.committed:
        if tx.xid not in events and tx.before >= max(snapshot_point, load.reads_end):
            differences.append(f"transaction {tx.xid} ({tx.rows} rows, begun after {tx.before}): missing from the log")
    return len(load.committed), differences


class LoadThread(threading.Thread):
    """A write load on a thread of its own (``_run``, until :attr:`stop` is set): an error ends it, and
    :meth:`finish` raises it."""

    stop: threading.Event
    error: BaseException | None

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # noqa: BLE001 - reported by finish()
            self.error = exc

    def _run(self) -> None:
        raise NotImplementedError

    def finish(self) -> None:
        """Stop writing; fail when the load itself failed."""
        self.stop.set()
        self.join(60)
        assert not self.is_alive(), "the write load did not stop"
        assert self.error is None, f"the write load failed: {self.error!r}"


class Load(LoadThread):
    """A steady write load on ``products``, ``orders`` and ``order_items``: small transactions of one to
    four statements (inserts, updates, deletes), about one every ``pace`` seconds, and every ``big_every``
    transactions (the first after 50) a large one of a few thousand rows. A lost connection (a server
    restart) is opened again; a transaction whose commit was cut off may or may not have happened (it is
    kept apart in :attr:`uncertain`).
    """

    def __init__(self, url: str, seed: int, *, big_every: int = 200, big_rows: int = 2000, pace: float = 0.02) -> None:
        super().__init__(name="load", daemon=True)
        self.url = url
        self.rng = random.Random(seed)
        self.big_every = big_every
        self.big_rows = big_rows
        self.pace = pace
        self.stop = threading.Event()
        self.transactions = 0
        self.big_transactions = 0
        self.rows = 0
        self.reconnects = 0
        self.error: BaseException | None = None
        self.last_commit = Lsn(0)
        #: every committed transaction that wrote rows, and those whose commit was cut off by a lost connection
        self.committed: list[Written] = []
        self.uncertain: list[Written] = []
        self._orders: list[str] = []
        self._max_product = 0
        #: the WAL position once a new log's first reads were all in it (:meth:`note_first_reads`): a
        #: transaction begun before may be in the reads in part (:func:`transaction_differences`)
        self.reads_end = 0

    def note_first_reads(self, where: Where) -> bool:
        """Whether a new log's first reads are all in it (:func:`first_reads_done`); the first time, the WAL
        position then is noted: every snapshot of those reads was taken before it."""
        if self.reads_end:
            return True
        if not first_reads_done(self.url, where):
            return False
        self.reads_end = wal_lsn(self.url)
        return True

    def line(self) -> str:
        return f"rows written {self.rows} in {self.transactions} transactions ({self.big_transactions} of {self.big_rows}+ rows)"

    def _connect(self) -> psycopg.Connection[Any]:
        deadline = time.monotonic() + 120
        while True:
            try:
                return psycopg.connect(self.url, autocommit=True, connect_timeout=5)
            except psycopg.OperationalError:
                if time.monotonic() > deadline or self.stop.is_set():
                    raise
                self.stop.wait(0.1)  # the server is restarting: try again

    def _run(self) -> None:
        conn = self._connect()
        try:
            self._orders = [str(row[0]) for row in conn.execute("SELECT id FROM orders").fetchall()]
            self._max_product = int(conn.execute("SELECT max(id) FROM products").fetchone()[0])  # type: ignore[index]
            while not self.stop.is_set():
                big = self.transactions % self.big_every == 50
                written: Written | None = None
                try:
                    with conn.transaction():
                        xid, before = conn.execute(  # type: ignore[misc]
                            "SELECT txid_current() % 4294967296, pg_current_wal_lsn()::text"
                        ).fetchone()
                        rows = self._big(conn) if big else sum(self._small(conn) for _ in range(self.rng.randint(1, 4)))
                        written = Written(int(xid), rows, Lsn.parse(before))
                    self.last_commit = Lsn.parse(conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0])  # type: ignore[index]
                except psycopg.OperationalError:
                    if written is not None:
                        self.uncertain.append(written)  # the connection was lost at the commit: it may have happened
                    conn.close()
                    self.reconnects += 1
                    conn = self._connect()
                    continue
                if rows:
                    self.committed.append(written)  # type: ignore[arg-type]
                self.transactions += 1
                self.big_transactions += bool(big)
                self.rows += rows
                self.stop.wait(self.pace)
        finally:
            conn.close()

    def _product(self) -> int:
        return self.rng.randint(1, self._max_product)

    def _order(self) -> str | None:
        return self.rng.choice(self._orders) if self._orders else None

    def _small(self, conn: psycopg.Connection[Any]) -> int:
        """One statement; the rows it wrote."""
        kind = self.rng.random()
        if kind < 0.15:
            row = conn.execute(
                "INSERT INTO products (category_id, name, description, price, attributes, tags) "
                "VALUES (%s, %s, %s, %s, jsonb_build_object('batch', %s), ARRAY['new']) RETURNING id",
                (
                    self.rng.randint(1, 4),
                    f"New {self.transactions}",
                    "fresh",
                    f"{self.rng.randint(100, 99999) / 100:.2f}",
                    self.transactions,
                ),
            ).fetchone()
            self._max_product = max(self._max_product, int(row[0]))  # type: ignore[index]
            return 1
        if kind < 0.35:
            return conn.execute(
                "UPDATE products SET price = price + 0.01, updated_at = now(), tags = tags || %s::text WHERE id = %s",
                (f"u{self.transactions % 7}", self._product()),
            ).rowcount
        if kind < 0.42:
            return conn.execute(
                "DELETE FROM products p WHERE id = %s AND NOT EXISTS (SELECT 1 FROM order_items i WHERE i.product_id = p.id)",
                (self._product(),),
            ).rowcount
        if kind < 0.57:
            row = conn.execute(
                "INSERT INTO orders (customer_id, total) VALUES (%s, %s) RETURNING id",
                (self.rng.randint(1, 20), self.rng.randint(1, 500)),
            ).fetchone()
            order = str(row[0])  # type: ignore[index]
            lines = self.rng.randint(1, 3)
            written = conn.execute(
                "INSERT INTO order_items (order_id, line_no, product_id, quantity, unit_price) "
                "SELECT %s, l, p.id, l, p.price FROM generate_series(1, %s) l "
                "JOIN LATERAL (SELECT id, price FROM products WHERE id >= %s ORDER BY id LIMIT 1) p ON true",
                (order, lines, self._product()),
            ).rowcount
            self._orders.append(order)
            return 1 + written
        if kind < 0.72:
            return conn.execute(
                "UPDATE orders SET status = %s, total = total + 1 WHERE id = %s",
                (self.rng.choice(["pending", "paid", "shipped", "cancelled"]), self._order()),
            ).rowcount
        if kind < 0.80:
            order = self._order()
            if order is None:
                return 0
            self._orders.remove(order)
            # its items go too (ON DELETE CASCADE): their deletes are in the same transaction
            items = conn.execute("SELECT count(*) FROM order_items WHERE order_id = %s", (order,)).fetchone()[0]  # type: ignore[index]
            return conn.execute("DELETE FROM orders WHERE id = %s", (order,)).rowcount + int(items)
        if kind < 0.93:
            return conn.execute(
                "UPDATE order_items SET quantity = quantity + 1 WHERE order_id = %s AND line_no = %s",
                (self._order(), self.rng.randint(1, 3)),
            ).rowcount
        return conn.execute(
            "DELETE FROM order_items WHERE order_id = %s AND line_no = %s", (self._order(), self.rng.randint(1, 3))
        ).rowcount

    def _big(self, conn: psycopg.Connection[Any]) -> int:
        """One large transaction: by turns, a burst of new orders with items, a price change over many
        products, and deletions of many items."""
        turn = self.big_transactions % 3
        n = self.big_rows
        if turn == 0:
            ids = [
                str(row[0])
                for row in conn.execute(
                    "INSERT INTO orders (customer_id, total) SELECT 1 + g %% 20, g FROM generate_series(1, %s) g RETURNING id",
                    (n // 2,),
                ).fetchall()
            ]
            items = conn.execute(
                "INSERT INTO order_items (order_id, line_no, product_id, quantity, unit_price) "
                "SELECT o, l, p.id, l, p.price FROM unnest(%s::uuid[]) o, generate_series(1, 2) l "
                "JOIN LATERAL (SELECT id, price FROM products ORDER BY id LIMIT 1) p ON true",
                (ids,),
            ).rowcount
            self._orders.extend(ids)
            return len(ids) + items
        if turn == 1:
            return conn.execute(
                "UPDATE products SET price = price * 1.01, updated_at = now() WHERE id IN "
                "(SELECT id FROM products ORDER BY id DESC LIMIT %s)",
                (n,),
            ).rowcount
        return conn.execute(
            "DELETE FROM order_items WHERE ctid IN (SELECT ctid FROM order_items WHERE line_no = 2 LIMIT %s)", (n,)
        ).rowcount
