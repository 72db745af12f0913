"""Masked columns (``mask`` in ``[capture."<schema>.<table>"]``): capture writes them hashed, replaced or
truncated, in snapshot and stream alike, before-images included, and no byte of a clear value reaches a
file under the data directory. A hash is the same for the same value wherever it is read, so masked
columns still join; a mask changed while capture runs applies from exactly the position of the change."""

from __future__ import annotations

import hashlib
import hmac
import threading
from pathlib import Path

import orjson
import psycopg
import pytest

from cdc.config.settings import Settings
from cdc.run.coordinator import Capture
from log_store.errors import LogStoreError
from tests.cdc.capture.test_publication_rules import files_holding, secret
from tests.cdc.helpers import execute, read_topic, replay, run_cdc, settings_for, slot_names, wait_for

pytestmark = pytest.mark.pg

KEY = "a mask key that is long enough"
TABLES = "public.customers,public.orders"
VIEWS = """
[capture."public.customers"]
mask = { email = "hash", phone = { fixed = "***" }, name = { truncate = 3 }, born = "hash" }

[capture."public.orders"]
mask = { email = "hash" }
"""


def hashed(text: str) -> str:
    return hmac.new(KEY.encode(), text.encode(), hashlib.sha256).hexdigest()


def _tables(url: str) -> None:
    execute(
        url,
        "CREATE TABLE customers (id int PRIMARY KEY, email text, phone text, name text, born date, bio text)",
        "ALTER TABLE customers REPLICA IDENTITY FULL",  # before-images carry every column, masked ones too
        "CREATE TABLE orders (id int PRIMARY KEY, email text, total numeric)",
    )
    for n in range(1, 5):
        _insert_customer(url, n)
    execute(url, f"INSERT INTO orders VALUES (1, '{secret('email', 1)}', 10.5), (2, NULL, 3)")


def _insert_customer(url: str, n: int, *, born: str = "2001-02-03") -> None:
    execute(
        url,
        f"INSERT INTO customers VALUES ({n}, '{secret('email', n)}', '{secret('phone', n)}', "
        f"'{secret('name', n)}', '{born}', 'bio {n}')",
    )


def _masked(url: str) -> dict[int, dict[str, object]]:
    """``customers`` as capture must write it, computed from the source."""
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT id, email, phone, name, born::text, bio FROM customers").fetchall()
    return {
        int(r[0]): {
            "id": r[0],
            "email": None if r[1] is None else hashed(str(r[1])),
            "phone": None if r[2] is None else "***",
            "name": None if r[3] is None else str(r[3])[:3],
            "born": None if r[4] is None else hashed(str(r[4])),
            "bio": r[5],
        }
        for r in rows
    }


def _replayed(data_dir: Path, table: str = "customers") -> dict[int, dict[str, object]]:
    return {int(row["id"]): row for row in replay(data_dir, f"cdc.public.{table}").values()}  # type: ignore[call-overload]


def _streamed(data_dir: Path) -> dict[int, dict[str, object]] | None:
    """``customers`` as the log holds it, or None before its topic exists."""
    try:
        return _replayed(data_dir)
    except (FileNotFoundError, LogStoreError):
        return None


def _clear_values(url: str) -> list[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT email, phone, name FROM customers UNION ALL SELECT email, NULL, NULL FROM orders").fetchall()
    return sorted({str(v) for row in rows for v in row if v is not None})


def _setup(url: str, data_dir: Path, views: Path, **extra: str) -> None:
    result = run_cdc(url, data_dir, "setup", views_file=str(views), tables=TABLES, mask_key=KEY, **extra)
    assert result.returncode == 0, result.stdout + result.stderr


def _masked_tables(url: str, data_dir: Path) -> tuple[Path, Settings]:
    """The tables, the views file declaring their masks, setup done; the views file and capture's settings."""
    _tables(url)
    views = data_dir / "views.toml"
    views.write_text(VIEWS)
    _setup(url, data_dir, views)
    return views, settings_for(url, data_dir, views_file=str(views), tables=TABLES.split(","), mask_key=KEY)


def test_masked_columns_are_written_masked_in_snapshot_and_stream(pg_url: str, tmp_path: Path) -> None:
    views, settings = _masked_tables(pg_url, tmp_path)
    Capture(settings, once=True).run()
    assert _replayed(tmp_path) == _masked(pg_url)

    # the stream: inserts (one with a customer's email again), updates of masked and clear columns, an
    # update leaving a TOASTed value unchanged, deletes (whose before-images hold every column)
    _insert_customer(pg_url, 5, born="1999-12-31")
    execute(
        pg_url,
        f"INSERT INTO orders VALUES (3, '{secret('email', 2)}', 1)",
        f"UPDATE customers SET email = '{secret('email', 105)}', phone = NULL WHERE id = 1",
        "UPDATE customers SET bio = repeat('long biography ', 5000) WHERE id = 2",
        f"UPDATE customers SET name = '{secret('renamed', 2)}' WHERE id = 2",
        "DELETE FROM customers WHERE id = 3",
    )
    Capture(settings, once=True).run()
    assert _replayed(tmp_path) == _masked(pg_url)
    orders = _replayed(tmp_path, "orders")
    customers = _replayed(tmp_path)
    # the same value masks the same in snapshot (order 1, customer 1 before) and stream (order 3): they join
    assert orders[1]["email"] == hashed(secret("email", 1)) and orders[2]["email"] is None
    assert orders[3]["email"] == customers[2]["email"] == hashed(secret("email", 2))

    deletes = [orjson.loads(r.value) for r in read_topic(tmp_path, "cdc.public.customers") if r.value]
    (before,) = [v["before"] for v in deletes if v["op"] == "d"]
    assert before["email"] == hashed(secret("email", 3)) and before["phone"] == "***" and before["name"] == secret("name", 3)[:3]

    schema = next(
        orjson.loads(r.value)
        for r in reversed(read_topic(tmp_path, "cdc.__schemas"))
        if r.key == orjson.dumps("public.customers") and r.value
    )
    described = {c["name"]: (c["type"], c.get("mask")) for c in schema["columns"]}
    assert described == {
        "id": ("int4", None),
        "email": ("text", "hash"),
        "phone": ("text", "fixed"),
        "name": ("text", "truncate"),
        "born": ("text", "hash"),
        "bio": ("text", None),
    }
    clear = [*_clear_values(pg_url), secret("email", 3), secret("phone", 3), secret("name", 3), secret("email", 1)]
    assert files_holding(tmp_path, clear) == {}
    assert files_holding(tmp_path, [hashed(secret("email", 2))]) != {}  # the search finds what is there


def test_a_mask_changed_while_capture_streams_applies_from_its_position(pg_url: str, tmp_path: Path) -> None:
    """``cdc setup`` announces changed masks in the WAL: a running capture masks every change after it,
    without waiting to notice the publication's comment, and then reads the table again under them."""
    views, settings = _masked_tables(pg_url, tmp_path)
    running = Capture(settings)
    thread = threading.Thread(target=running.run, name="capture-under-test", daemon=True)
    thread.start()
    try:
        wait_for(lambda: _streamed(tmp_path) == _masked(pg_url), what="the masked snapshot")
        execute(pg_url, f"UPDATE customers SET bio = '{secret('bio', 1)}' WHERE id = 1")  # clear: bio is not masked yet
        wait_for(lambda: _replayed(tmp_path)[1]["bio"] == secret("bio", 1), what="the clear bio")
        views.write_text(VIEWS.replace('born = "hash" }', 'born = "hash", bio = "hash" }'))
        _setup(pg_url, tmp_path, views)
        execute(pg_url, f"UPDATE customers SET bio = '{secret('bio', 2)}' WHERE id = 2")
        masked = {n: {**row, "bio": hashed(str(row["bio"]))} for n, row in _masked(pg_url).items()}
        wait_for(lambda: _replayed(tmp_path) == masked, what="every bio masked")
    finally:
        running.stop.set()
        thread.join(timeout=60)
    assert not thread.is_alive()
    assert files_holding(tmp_path, [secret("bio", 2)]) == {}
    assert files_holding(tmp_path, [secret("bio", 1)]) != {}  # written before the change; superseded by the re-read


def test_bad_masks_get_one_error_each_and_capture_needs_the_key(pg_url: str, tmp_path: Path) -> None:
    _tables(pg_url)
    views = tmp_path / "views.toml"
    views.write_text(
        '[capture."public.customers"]\nmask = { id = "hash", nope = { fixed = "x" } }\n'
        '[capture."public.orders"]\nmask = { email = "hash" }\n'
    )
    result = run_cdc(pg_url, tmp_path, "setup", views_file=str(views), tables=TABLES)
    assert result.returncode == 3, result.stdout + result.stderr
    errors = result.stderr.strip().splitlines()
    assert len(errors) == 2, errors
    assert "nope is not a column of public.customers" in errors[0]
    assert "hash masks need CDC_MASK_KEY" in errors[1]
    views.write_text('[capture."public.customers"]\nmask = { id = { truncate = 2 } }\n')
    result = run_cdc(pg_url, tmp_path, "setup", views_file=str(views), tables=TABLES)
    assert result.returncode == 3 and "mask on key column id" in result.stderr, result.stderr
    views.write_text('[capture."public.customers"]\nexclude = ["email"]\nmask = { email = "hash" }\n')
    result = run_cdc(pg_url, tmp_path, "setup", views_file=str(views), tables=TABLES, mask_key=KEY)
    assert result.returncode != 0 and "a column is either left out or masked" in result.stderr, result.stderr
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT pubname FROM pg_publication").fetchall() == []
    assert slot_names(pg_url) == []

    views.write_text(VIEWS)
    _setup(pg_url, tmp_path, views)
    result = run_cdc(pg_url, tmp_path, "capture", "--once", views_file=str(views), tables=TABLES)
    assert result.returncode != 0
    (error,) = result.stderr.strip().splitlines()
    assert "CDC_MASK_KEY is not set" in error and "public.customers.email" in error, error
    assert not (tmp_path / "log").exists() or files_holding(tmp_path, _clear_values(pg_url)) == {}


def test_masks_alone_work_on_postgresql_14_and_column_rules_are_refused_there(tmp_path: Path) -> None:
    """PostgreSQL 14 has no column lists or row filters, but masks need neither."""
    from tests.fix_pg import local_server

    server = local_server(14)
    url = server.start()
    try:
        _tables(url)
        views = tmp_path / "views.toml"
        views.write_text(VIEWS.replace('mask = { email = "hash" }', 'mask = { email = "hash" }\nwhere = "total > 1"'))
        result = run_cdc(url, tmp_path, "setup", views_file=str(views), tables=TABLES, mask_key=KEY)
        assert result.returncode == 3, result.stdout + result.stderr
        assert "`columns`, `exclude` and `where` need PostgreSQL 15 or later" in result.stderr, result.stderr
        views.write_text(VIEWS)
        _setup(url, tmp_path, views)
        settings = settings_for(url, tmp_path, views_file=str(views), tables=TABLES.split(","), mask_key=KEY)
        Capture(settings, once=True).run()
        _insert_customer(url, 5)
        Capture(settings, once=True).run()
        assert _replayed(tmp_path) == _masked(url)
        assert files_holding(tmp_path, _clear_values(url)) == {}
    finally:
        server.stop()


@pytest.mark.kafka
def test_kafka_receives_masked_values_only(pg_url: str, tmp_path: Path, kafka_bootstrap: str, kafka_prefix: str) -> None:
    """Into Kafka, snapshot and stream: neither a record of the prefix's topics nor a broker file holds a
    clear value of a masked column."""
    import glob
    import os
    import tempfile

    _tables(pg_url)
    views = tmp_path / "views.toml"
    views.write_text(VIEWS)
    _setup(pg_url, tmp_path, views)
    settings = settings_for(
        pg_url, tmp_path, views_file=str(views), tables=TABLES.split(","), mask_key=KEY,
        log=f"kafka://{kafka_bootstrap}", topic_prefix=kafka_prefix,
    )  # fmt: skip
    Capture(settings, once=True).run()
    _insert_customer(pg_url, 5)
    execute(pg_url, f"UPDATE customers SET email = '{secret('email', 105)}' WHERE id = 1", "DELETE FROM customers WHERE id = 2")
    Capture(settings, once=True).run()
    topic = f"{kafka_prefix}.public.customers"
    assert {int(row["id"]): row for row in replay(settings, topic).values()} == _masked(pg_url)  # type: ignore[call-overload]
    records = [r for name in (topic, f"{kafka_prefix}.public.orders") for r in read_topic(settings, name)]
    written = b"\n".join((r.key or b"") + b"\n" + (r.value or b"") for r in records)
    clear = [*_clear_values(pg_url), secret("email", 1), secret("email", 2), secret("phone", 2), secret("name", 2)]
    assert hashed(secret("email", 2)).encode() in written  # the search finds what is there
    assert [value for value in clear if value.encode() in written] == []
    broker_files = [Path(d) for d in glob.glob(f"{tempfile.gettempdir()}/cdc-kafka-*/data/{kafka_prefix}*")]
    assert broker_files or os.environ.get("CDC_TEST_KAFKA"), "the broker's files of the prefix's topics were not found"
    for directory in broker_files:
        assert files_holding(directory, clear) == {}


def test_lag_names_a_table_whose_masks_changed_until_capture_read_it_again(pg_url: str, tmp_path: Path) -> None:
    views, settings = _masked_tables(pg_url, tmp_path)
    Capture(settings, once=True).run()

    def read_again() -> tuple[list[str], list[str]]:
        result = run_cdc(pg_url, tmp_path, "lag", "--json", views_file=str(views), tables=TABLES, mask_key=KEY)
        assert result.returncode == 0, result.stdout + result.stderr
        report = orjson.loads(result.stdout)
        return report["log"]["read_again"], [w for w in report["warnings"] if "masks changed" in w]

    assert read_again() == ([], [])
    views.write_text(VIEWS.replace('mask = { email = "hash" }', 'mask = { email = "hash", total = { fixed = "0" } }'))
    _setup(pg_url, tmp_path, views)
    tables, warnings = read_again()
    assert tables == ["public.orders"] and len(warnings) == 1 and warnings[0].startswith("public.orders: "), warnings
    assert Capture(settings, once=True).run().tables_added == 1
    assert read_again() == ([], [])
    assert {row["total"] for row in _replayed(tmp_path, "orders").values()} == {"0"}
