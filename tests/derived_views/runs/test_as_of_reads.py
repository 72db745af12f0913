"""Reading view tables as of one LSN: ``cdc views as-of``, ``versions_as_of``, ``cdc search``/``cdc cache get
--as-of``, through real parts (PostgreSQL, capture, sync in Spark, Delta read with ``deltalake``).

``orders`` and ``order_items`` are written in transactions spread over three sync steps, some touching
one table only, one step syncing the warehouse alone, and the source's rows are read at the LSN
``pg_current_wal_lsn()`` gives after each: every table read at the version ``cdc views as-of`` names
equals the source at that LSN, and ``latest`` is the newest LSN every table has reached."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
import pytest

from tests.cdc.helpers import CDC
from tests.derived_views.pipeline import capture, context, execute, settings_for, sync

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.pg, pytest.mark.spark]

A = "00000000-0000-0000-0000-00000000000a"
B = "00000000-0000-0000-0000-00000000000b"
#: Two related tables in the warehouse (orders with its history), a cache entity over them and a search index.
VIEWS = """
[warehouse]
tables = ["public.orders", "public.order_items"]
without_history = ["public.order_items"]

[search.products]
root = "public.products"
text = ["name"]
stored = ["name"]

[cache.order]
root = "public.orders"

[cache.order.children.items]
table = "public.order_items"
on = "order_id"
"""
ALL = ["warehouse", "search.products", "cache.order"]
#: Columns compared, as text, of each source table and its warehouse tables.
COLUMNS = {"orders": ("id", "status", "total"), "order_items": ("order_id", "line_no", "product_id", "quantity", "unit_price")}

State = dict[str, set[tuple[str, ...]]]


def _source(url: str) -> tuple[str, State]:
    """``pg_current_wal_lsn()`` and the compared rows of both tables, read in one snapshot."""
    with psycopg.connect(url) as conn, conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        (lsn,) = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone() or ("",)
        state = {
            table: {tuple(row) for row in conn.execute(f"SELECT {', '.join(f'{c}::text' for c in columns)} FROM {table}")}
            for table, columns in COLUMNS.items()
        }
    return str(lsn), state


def _rows(path: str, version: int, columns: tuple[str, ...], *, history: bool = False) -> set[tuple[str, ...]]:
    """The compared rows of the Delta table at ``path`` at ``version`` (of a history table, its current versions)."""
    from deltalake import DeltaTable

    rows = DeltaTable(path, version=version).to_pyarrow_table().to_pylist()
    return {tuple(str(row[c]) for c in columns) for row in rows if not history or row["_cdc_is_current"]}


def _lsn(text: str) -> int:
    high, low = text.split("/")
    return (int(high, 16) << 32) | int(low, 16)


def _equal_to_source(chosen: dict[str, Any], state: State) -> None:
    """The warehouse tables of ``orders`` and ``order_items`` at the versions ``chosen`` names equal ``state``,
    and the history holds no version from a later commit."""
    from deltalake import DeltaTable

    tables = {row["table"]: row for row in chosen["tables"]}
    for table, columns in COLUMNS.items():
        current = tables[f"warehouse/current/public.{table}"]
        assert _rows(current["path"], current["version"], columns) == state[table], (table, chosen["lsn"])
    history = tables["warehouse/history/public.orders"]
    assert _rows(history["path"], history["version"], COLUMNS["orders"], history=True) == state["orders"], chosen["lsn"]
    starts = DeltaTable(history["path"], version=history["version"]).to_pyarrow_table(columns=["_cdc_valid_from_lsn"])
    assert max(starts.column(0).to_pylist()) < _lsn(chosen["lsn"])


def test_tables_read_as_of_one_lsn_equal_the_source_at_it(
    spark: SparkSession,
    reference_db: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from deltalake import DeltaTable

    from cdc.cli import cli, run
    from cdc.commands import register
    from derived_views import select_versions, versions_as_of
    from derived_views.engine.maintenance import RETAIN, MaintenancePolicy
    from derived_views.errors import AsOfError
    from derived_views.runs import runner

    url = reference_db
    views_file = tmp_path / "views.toml"
    views_file.write_text(VIEWS)
    execute(
        url,
        "INSERT INTO customers (email, name) VALUES ('a@x', 'Ann')",
        "INSERT INTO products (name, price) VALUES ('Desk lamp', 10), ('Reading lamp', 12)",
        f"INSERT INTO orders (id, customer_id, total) VALUES ('{A}', 1, 10), ('{B}', 1, 20)",
        f"INSERT INTO order_items VALUES ('{A}', 1, 1, 1, 10), ('{A}', 2, 2, 1, 12), ('{B}', 1, 1, 2, 10)",
    )
    settings = settings_for(url, tmp_path, views_file=str(views_file))
    capture(settings)  # the snapshot
    ctx = context(spark, settings)
    register(cli)
    for name, value in (("DATABASE_URL", url), ("DATA_DIR", str(tmp_path)), ("VIEWS_FILE", str(views_file))):
        monkeypatch.setenv(f"CDC_{name}", value)

    def cdc(*args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = run(cli, list(args))
        out = capsys.readouterr()
        return code, out.out, out.err

    def as_of(*args: str) -> dict[str, Any]:
        code, out, err = cdc("views", "as-of", *args, "--json")
        assert code == 0, err
        return dict(json.loads(out))

    def step(views: list[str]) -> int:
        capture(settings)
        report = sync(ctx, views)
        assert report.watermark is not None
        return report.watermark.lsn

    # one transaction over both tables, applied with the snapshot by every view's first step
    execute(
        url,
        f"UPDATE orders SET status = 'paid', total = 30 WHERE id = '{A}'",
        f"INSERT INTO order_items VALUES ('{A}', 3, 1, 2, 10)",
    )
    lsn1, state1 = _source(url)
    step(ALL)
    # two transactions over orders alone, in one step of the warehouse alone
    execute(url, f"UPDATE orders SET status = 'shipped' WHERE id = '{A}'")
    inside, _ = _source(url)
    execute(url, f"UPDATE orders SET total = 35 WHERE id = '{B}'")
    lsn2, state2 = _source(url)
    w2 = step(["warehouse"])

    # latest: the search index and the cache are as of the first step still, so every table is read as
    # of it (orders at the version before its last commit); the warehouse alone has reached the second
    latest = as_of()
    assert _lsn(lsn1) - 1 <= _lsn(latest["as_of"]) < _lsn(lsn2) - 1, latest
    _equal_to_source(latest, state1)
    warehouse = as_of("latest", "--view", "warehouse")
    assert _lsn(warehouse["as_of"]) == w2, warehouse
    _equal_to_source(warehouse, state2)

    # order_items alone, and a product the search index reads
    execute(
        url,
        f"UPDATE order_items SET quantity = 5 WHERE order_id = '{B}'",
        f"DELETE FROM order_items WHERE order_id = '{A}' AND line_no = 2",
        "UPDATE products SET name = 'Armchair' WHERE id = 2",
    )
    lsn3, state3 = _source(url)
    w3 = step(ALL)

    # as of the second step's LSN, the view that step synced (the others moved on past it since)
    env = {**os.environ, "CDC_DATABASE_URL": url, "CDC_DATA_DIR": str(tmp_path), "CDC_VIEWS_FILE": str(views_file)}
    for lsn, state, views in ((lsn1, state1, ()), (lsn2, state2, ("warehouse",)), (lsn3, state3, ())):
        if lsn == lsn1:  # once as its own process
            done = subprocess.run(
                [str(CDC), "views", "as-of", lsn, "--json"], env=env, capture_output=True, text=True, check=False
            )
            assert done.returncode == 0, done.stderr
            chosen = json.loads(done.stdout)
        else:
            chosen = as_of(lsn, *(f"--view={view}" for view in views))
        names = [row["table"] for row in chosen["tables"]]
        assert ("search/products/documents" in names) == ("cache/order/entries" in names) == (not views), names
        _equal_to_source(chosen, state)
        helper = versions_as_of(tmp_path, lsn, names if views else None, views_file=views_file)  # the same versions
        assert {name: t.version for name, t in helper.tables.items()} == {r["table"]: r["version"] for r in chosen["tables"]}
        assert helper.lsn == chosen["lsn"]
    newest = as_of()
    assert _lsn(newest["as_of"]) == w3
    _equal_to_source(newest, state3)

    # search and cache read as of an LSN
    def found(*args: str) -> list[str]:
        code, out, err = cdc("search", "products", "lamp", *args, "--json")
        assert code == 0, err
        return sorted(hit["fields"]["name"] for hit in json.loads(out))

    assert found("--as-of", lsn1) == ["Desk lamp", "Reading lamp"]
    assert found() == found("--as-of", "latest") == ["Desk lamp"]
    code, out, err = cdc("cache", "get", "order", A, "--as-of", lsn1)
    assert code == 0 and json.loads(out)["status"] == "paid" and len(json.loads(out)["items"]) == 3, err
    assert json.loads(cdc("cache", "get", "order", A)[1])["status"] == "shipped"

    # maintenance raises orders' Delta retentions to the vacuum's: a commit that changes no data, so the
    # newest version given is that commit; a vacuum keeps the files of the versions as of the first LSN
    # (replaced minutes ago) for an hour's retention, and would remove them at none
    current = str(tmp_path / "warehouse/current/public.orders")
    tasks = runner.maintain(ctx, ALL, MaintenancePolicy(retention_hours=800), ["warehouse/current/public.orders"], dry_run=False)
    assert [task.action for task in tasks] == [RETAIN]
    assert DeltaTable(current).metadata().configuration["delta.deletedFileRetentionDuration"] == "interval 800 hours"
    assert {row["table"]: row["version"] for row in as_of()["tables"]}["warehouse/current/public.orders"] == (
        DeltaTable(current).version()
    )
    first = {row["table"]: row["version"] for row in as_of(lsn1)["tables"]}["warehouse/current/public.orders"]
    needed = {Path(uri).name for uri in DeltaTable(current, version=first).file_uris()}

    def vacuumed(hours: int) -> set[str]:
        found = DeltaTable(current).vacuum(retention_hours=hours, dry_run=True, enforce_retention_duration=False)
        return {Path(file).name for file in found}

    replaced = needed - {Path(uri).name for uri in DeltaTable(current).file_uris()}
    assert replaced and needed & vacuumed(1) == set() and needed & vacuumed(0) == replaced

    # an LSN inside a step that changed orders twice, one a step went past for the search index, one
    # past what the views reached, one before them, one that is no LSN, and one whose versions the
    # retention no longer promises: one clear error each
    execute(url, f"UPDATE orders SET total = 40 WHERE id = '{B}'")
    ahead, _ = _source(url)
    for lsn, expected in (
        (inside, "no version of warehouse/current/public.orders is exact as of"),
        (lsn2, "no version of search/products/documents is exact as of"),
        (ahead, "is newer than what the views have reached"),
        ("0/1", "is older than what the views keep readable"),
        ("1/2/3", "is not an LSN such as 0/16B3748"),
    ):
        code, _, err = cdc("views", "as-of", lsn)
        assert code == (2 if lsn == "1/2/3" else 1), err
        assert err.startswith("error: ") and expected in err and err.count("\n") == 1, err
    later = int(time.time() * 1000) + 200 * 3600 * 1000
    orders = {"orders": str(tmp_path / "warehouse/current/public.orders")}
    with pytest.raises(AsOfError, match="older than what the views keep readable"):
        select_versions(orders, lsn1, now_ms=later)
    assert select_versions(orders, None, now_ms=later).position == w3  # the newest version stays readable
