"""Search and cache views, and rebuild by replay equal to incremental sync, over a hand-built log."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from derived_views.errors import EarlierLayoutError
from event_format import SNAPSHOT_POSITION
from tests.derived_views.conftest import EXAMPLE_VIEWS
from tests.derived_views.log_builder import LogBuilder, product

if TYPE_CHECKING:
    from derived_views.write.context import ViewContext

pytestmark = pytest.mark.spark

ORDER = "6f1c0000-0000-4000-8000-000000000001"


def _table(ctx: ViewContext, path: str, drop_meta: bool = True) -> list[dict[str, Any]]:
    frame = ctx.spark.read.format("delta").load(path)
    rows = [r.asDict(recursive=True) for r in frame.collect()]
    if drop_meta:
        rows = [{k: v for k, v in r.items() if k not in ("_cdc_commit_ts",)} for r in rows]
    return sorted(rows, key=repr)


def _seed(log: LogBuilder) -> None:
    with log.transaction() as tx:
        tx.insert("public.categories", {"id": 1, "name": "Lighting"}, op="r")
        tx.insert("public.categories", {"id": 2, "name": "Garden"}, op="r")
        tx.insert("public.customers", {"id": 1, "email": "a@x", "name": "Ada", "created_at": "2026-11-21T10:00:00Z"}, op="r")
        tx.insert("public.products", product(1, "Brass desk lamp", category=1, description="warm light"), op="r")
        tx.insert("public.products", product(2, "Floor lamp", category=1), op="r")
        tx.insert("public.products", product(3, "Hose", category=2, description="green garden hose"), op="r")
        tx.insert(
            "public.orders",
            {"id": ORDER, "customer_id": 1, "status": "pending", "placed_at": "2026-11-21T11:00:00Z", "total": "39.80"},
            op="r",
        )
        tx.insert(
            "public.order_items", {"order_id": ORDER, "line_no": 1, "product_id": 1, "quantity": 2, "unit_price": "19.90"}, op="r"
        )


def test_search_reindexes_exactly_the_renamed_categorys_products(ctx: ViewContext, log: LogBuilder) -> None:
    from derived_views.runs import runner
    from derived_views.views import search

    _seed(log)
    runner.step(ctx, ["search"])
    assert [h.key["id"] for h in search.query(ctx.views_dir, "products", "lamp")] in ([1, 2], [2, 1])
    assert search.query(ctx.views_dir, "products", "brass lamp")[0].key["id"] == 1
    with log.transaction() as tx:
        tx.update("public.categories", {"id": 1, "name": "Illumination"})
    runner.step(ctx, ["search"])
    hits = search.query(ctx.views_dir, "products", "illumination", stored=["category_name"])
    assert sorted(h.key["id"] for h in hits) == [1, 2] and hits[0].fields["category_name"] == "Illumination"
    assert search.query(ctx.views_dir, "products", "lighting") == []
    docs = ctx.spark.read.format("delta").load(ctx.path("search", "products", "documents"))
    documents = ctx.path("search", "products", "documents")
    history = ctx.spark.sql(f"DESCRIBE HISTORY delta.`{documents}`").orderBy("version").collect()
    metrics = history[-1]["operationMetrics"]
    assert metrics["numTargetRowsUpdated"] == "2"
    assert {r["id"]: r["category_name"] for r in docs.collect()}[3] == "Garden"
    with log.transaction() as tx:
        tx.delete("public.products", {"id": 2})
    runner.step(ctx, ["search"])
    assert [h.key["id"] for h in search.query(ctx.views_dir, "products", "lamp")] == [1]


def test_terms_a_step_left_behind_its_documents_catch_up_exactly(
    ctx: ViewContext, log: LogBuilder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The documents and the terms commit apart (side by side): a step that commits the documents but
    dies before the terms' commit leaves the terms as of their older watermark; the next step, with no
    new event (the documents already current), brings the terms to the documents' rows, as a rebuild."""
    from derived_views.engine.commit_progress import read_progress
    from derived_views.runs import runner
    from derived_views.views import search

    _seed(log)
    runner.step(ctx, ["search"])
    documents, terms = (ctx.path("search", "products", name) for name in ("documents", "terms"))

    def killed(*_args: object) -> None:
        raise RuntimeError("killed between the documents' and the terms' commits")

    monkeypatch.setattr(search, "_merge_terms", killed)
    with log.transaction() as tx:
        tx.update("public.categories", {"id": 1, "name": "Illumination"})
        tx.update("public.products", product(3, "Hose reel", category=2, description="green garden hose"))
    assert runner.step(ctx, ["search"]).failures
    monkeypatch.undo()
    ctx.forget()
    behind, ahead = read_progress(ctx.spark, terms), read_progress(ctx.spark, documents)
    assert behind is not None and ahead is not None and behind.lsn < ahead.lsn
    assert search.query(ctx.views_dir, "products", "illumination") == []
    runner.step(ctx, ["search"])
    ctx.forget()
    caught_up = read_progress(ctx.spark, terms)
    assert caught_up is not None and caught_up.lsn == ahead.lsn
    assert sorted(h.key["id"] for h in search.query(ctx.views_dir, "products", "illumination")) == [1, 2]
    assert [h.key["id"] for h in search.query(ctx.views_dir, "products", "reel")] == [3]
    assert search.query(ctx.views_dir, "products", "lighting") == []
    incremental = _table(ctx, terms)
    runner.step(ctx, ["search"], replace=True)
    assert _table(ctx, terms) == incremental


def test_terms_of_the_per_term_layout_are_rewritten_per_document_and_stay_exact(ctx: ViewContext, log: LogBuilder) -> None:
    """A terms table written one row per (document, term), as earlier versions did (its commits record
    the plan's stamp without the layout), is rewritten whole in the per-document layout by the next step,
    even one without new events; later steps (a document losing and gaining terms, one deleted)
    keep it equal to a rebuild."""
    from dataclasses import replace as with_fields

    from pyspark.sql import functions as F

    from derived_views.engine.commit_progress import read_progress
    from derived_views.runs import runner
    from derived_views.views import search
    from derived_views.views.composite_sync import overwrite

    _seed(log)
    runner.step(ctx, ["search"])
    terms = ctx.path("search", "products", "terms")
    current = read_progress(ctx.spark, terms)
    assert current is not None
    per_term = ctx.spark.read.format("delta").load(terms).select("doc", F.explode("terms").alias("e"), "doc_len")
    old = per_term.select("doc", "e.term", "e.tf", "doc_len")
    old_stamp = current.definition.rsplit("/", 1)[0]
    overwrite(ctx, old.localCheckpoint(), terms, with_fields(current, definition=old_stamp))
    ctx.forget()
    assert "term" in ctx.spark.read.format("delta").load(terms).columns
    with pytest.raises(EarlierLayoutError, match=r"run `cdc sync search.products --once`"):
        search.query(ctx.views_dir, "products", "lamp")
    runner.step(ctx, ["search"])
    ctx.forget()
    rewritten = read_progress(ctx.spark, terms)
    assert rewritten is not None and rewritten.definition == current.definition
    assert ctx.spark.read.format("delta").load(terms).columns == ["doc", "terms", "doc_len"]
    assert sorted(h.key["id"] for h in search.query(ctx.views_dir, "products", "lamp")) == [1, 2]
    with log.transaction() as tx:
        tx.update("public.products", product(1, "Brass reading lamp", category=1, description="dim light"))
        tx.delete("public.products", {"id": 3})
    runner.step(ctx, ["search"])
    ctx.forget()
    assert [h.key["id"] for h in search.query(ctx.views_dir, "products", "reading")] == [1]
    assert search.query(ctx.views_dir, "products", "warm") == []
    assert search.query(ctx.views_dir, "products", "hose") == []
    incremental = _table(ctx, terms)
    runner.step(ctx, ["search"], replace=True)
    assert _table(ctx, terms) == incremental


def test_truncate_and_category_rename_in_one_batch_leave_no_document(ctx: ViewContext, log: LogBuilder) -> None:
    """Re-indexing a renamed category's products must not bring back products truncated before it."""
    from derived_views.runs import runner
    from derived_views.views import search

    _seed(log)
    runner.step(ctx, ["search"])
    with log.transaction() as tx:
        tx.truncate("public.products")
    with log.transaction() as tx:
        tx.insert("public.products", product(4, "Desk lamp", category=1))
    with log.transaction() as tx:
        tx.update("public.categories", {"id": 1, "name": "Illumination"})
    runner.step(ctx, ["search"])
    documents = ctx.spark.read.format("delta").load(ctx.path("search", "products", "documents"))
    docs = {r["id"]: r["category_name"] for r in documents.collect()}
    assert docs == {4: "Illumination"}
    assert [h.key["id"] for h in search.query(ctx.views_dir, "products", "lamp")] == [4]
    assert search.query(ctx.views_dir, "products", "hose") == []


def test_cache_order_with_items_follows_both_tables(ctx: ViewContext, log: LogBuilder) -> None:
    from derived_views.runs import runner
    from derived_views.views import cache

    _seed(log)
    runner.step(ctx, ["cache"])
    value = cache.get(ctx.views_dir, "order", ORDER)
    assert value is not None and value["status"] == "pending" and value["items"][0]["quantity"] == 2
    with log.transaction() as tx:
        tx.insert("public.order_items", {"order_id": ORDER, "line_no": 2, "product_id": 3, "quantity": 1, "unit_price": "5.00"})
        tx.update(
            "public.orders",
            {"id": ORDER, "customer_id": 1, "status": "paid", "placed_at": "2026-11-21T11:00:00Z", "total": "44.80"},
        )
    runner.step(ctx, ["cache"])
    value = cache.get(ctx.views_dir, "order", ORDER)
    assert value is not None and value["status"] == "paid" and [i["line_no"] for i in value["items"]] == [1, 2]
    with log.transaction() as tx:
        tx.delete("public.order_items", {"order_id": ORDER, "line_no": 1})
        tx.delete("public.order_items", {"order_id": ORDER, "line_no": 2})
        tx.delete("public.orders", {"id": ORDER})
    runner.step(ctx, ["cache"])
    assert cache.get(ctx.views_dir, "order", ORDER) is None


def test_views_of_two_processes_share_the_warehouse_tables_and_apply_each_change_once(ctx: ViewContext, log: LogBuilder) -> None:
    """The cache entity brings the warehouse's current tables it reads to its watermark; a process that
    synced the warehouse before then finds them there (its cached progress is dropped) and applies
    nothing to them again, only to the history tables, and both views stay exact."""
    from deltalake import DeltaTable

    from derived_views.runs import runner
    from derived_views.views import warehouse
    from derived_views.write.context import ViewContext as Context

    _seed(log)
    runner.step(ctx, ["warehouse"])
    other = Context(ctx.spark, ctx.views_dir, ctx.log, ctx.prefix, definitions=ctx.definitions)
    with log.transaction() as tx:
        tx.insert("public.order_items", {"order_id": ORDER, "line_no": 2, "product_id": 3, "quantity": 1, "unit_price": "5.00"})
    runner.step(other, ["cache"])
    items = warehouse.current_path(ctx, "public.order_items")
    version = DeltaTable(items).version()
    assert {r["line_no"] for r in _table(ctx, items)} == {1, 2}
    runner.step(ctx, ["warehouse"])
    assert DeltaTable(items).version() == version  # applied once, by the cache entity's step
    history = _table(ctx, warehouse.history_path(ctx, "public.order_items"))
    assert sorted(r["line_no"] for r in history if r["_cdc_is_current"]) == [1, 2]
    assert not Path(ctx.path("cache", "order", "_state")).exists()


def test_views_side_by_side_bring_a_shared_copy_forward_once(ctx: ViewContext, log: LogBuilder, tmp_path: Path) -> None:
    """An index and an entity both read the warehouse's current products and are synced side by side
    without the warehouse: one brings the copy forward while the other waits for it and finds it current,
    so a new product (an insert-only batch: appended, not merged) lands once, and both views have it."""
    from derived_views.definitions import load
    from derived_views.runs import runner
    from derived_views.views import search, warehouse
    from derived_views.write.context import ViewContext as Context

    views = tmp_path / "views.toml"
    example = EXAMPLE_VIEWS.read_text()
    views.write_text(example[: example.index("[cache.order]")] + '[cache.product]\nroot = "public.products"\n')
    both = Context(ctx.spark, ctx.views_dir, ctx.log, ctx.prefix, definitions=load(views))
    _seed(log)
    runner.step(both, ["search", "cache"])
    with log.transaction() as tx:
        tx.insert("public.products", product(4, "Copper kettle", category=2))
    report = runner.step(both, ["search", "cache"])
    assert report.failures == () and report.events["search.products"] and report.events["cache.product"]
    ids = sorted(r["id"] for r in _table(both, warehouse.current_path(both, "public.products")))
    assert ids == [1, 2, 3, 4]
    assert [h.key["id"] for h in search.query(both.views_dir, "products", "kettle")] == [4]
    entries = _table(both, both.path("cache", "product", "entries"))
    assert len(entries) == 4 and any("Copper kettle" in json.dumps(e, default=str) for e in entries)


def test_a_table_the_warehouse_leaves_out_gets_a_copy_of_the_indexs_own(ctx: ViewContext, log: LogBuilder) -> None:
    """The index reads products from the warehouse's current table and keeps its own copy of categories,
    which the warehouse leaves out; a category rename still re-indexes its products."""
    from derived_views.runs import runner
    from derived_views.views import search, warehouse
    from derived_views.write.context import ViewContext as Context

    kept = ctx.definitions.warehouse.model_copy(update={"tables": ["public.products"]})
    narrow = Context(
        ctx.spark, ctx.views_dir, ctx.log, ctx.prefix, definitions=ctx.definitions.model_copy(update={"warehouse": kept})
    )
    _seed(log)
    runner.step(narrow, ["search"])
    with log.transaction() as tx:
        tx.update("public.categories", {"id": 1, "name": "Illumination"})
    runner.step(narrow, ["search"])
    hits = search.query(narrow.views_dir, "products", "illumination", stored=["category_name"])
    assert sorted(h.key["id"] for h in hits) == [1, 2]
    assert (Path(narrow.path("search", "products", "_state", "public.categories")) / "_delta_log").is_dir()
    assert not Path(narrow.path("search", "products", "_state", "public.products")).exists()
    assert {r["id"] for r in _table(narrow, warehouse.current_path(narrow, "public.products"))} == {1, 2, 3}
    assert not Path(warehouse.current_path(narrow, "public.categories")).exists()


def test_deletion_vectors_are_an_opt_in_the_read_only_commands_still_read(ctx: ViewContext, log: LogBuilder) -> None:
    """With ``CDC_DELETION_VECTORS`` on, new view tables use deletion vectors: a MERGE marks the rows it
    replaces instead of rewriting their files, and ``cdc search`` / ``cdc cache get`` (deltalake's SQL
    reader) still answer; off (the default), no table has them."""
    from deltalake import DeltaTable

    from derived_views.runs import runner
    from derived_views.views import cache, search
    from derived_views.write.context import ViewContext as Context

    marked = Context(ctx.spark, ctx.views_dir, ctx.log, ctx.prefix, definitions=ctx.definitions, deletion_vectors=True)
    _seed(log)
    runner.step(marked, [])
    with log.transaction() as tx:
        tx.update("public.categories", {"id": 1, "name": "Illumination"})
    runner.step(marked, [])
    docs = marked.path("search", "products", "documents")
    assert "deletionVectors" in (DeltaTable(docs).protocol().reader_features or [])
    merge = DeltaTable(docs).history(1)[0]
    assert merge["operation"] == "MERGE" and int(merge["operationMetrics"]["numTargetDeletionVectorsAdded"]) > 0, merge
    hits = search.query(marked.views_dir, "products", "illumination", stored=["category_name"])
    assert sorted(h.key["id"] for h in hits) == [1, 2] and hits[0].fields["category_name"] == "Illumination"
    order = cache.get(marked.views_dir, "order", ORDER)
    assert order is not None and order["status"] == "pending"
    plain = Context(ctx.spark, ctx.views_dir + "-plain", ctx.log, ctx.prefix, definitions=ctx.definitions)
    runner.step(plain, ["search"])
    assert not DeltaTable(plain.path("search", "products", "documents")).protocol().reader_features


def _step(ctx: ViewContext, *, replace: bool = False) -> None:
    from derived_views.runs import runner
    from derived_views.source.as_of import LogAsOf
    from derived_views.views import cache, search, warehouse

    watermark = runner.latest(ctx)
    assert watermark is not None
    as_of = LogAsOf(ctx.log, watermark)
    plans = runner.plans_at(ctx, watermark)
    warehouse.sync(ctx, as_of, replace=replace, only=["public.products", "public.categories"])
    search.sync(ctx, as_of, plans["search.products"], replace=replace)
    cache.sync(ctx, as_of, plans["cache.order"], replace=replace)


def test_rebuild_equals_incremental(ctx: ViewContext, log: LogBuilder, monkeypatch: pytest.MonkeyPatch) -> None:
    """Incremental steps read their small ranges in the driver; the rebuild reads through Spark tasks."""
    from derived_views.source import pending
    from derived_views.views import warehouse

    _seed(log)
    _step(ctx)
    with log.transaction() as tx:
        tx.update("public.products", product(2, "Floor lamp XL", category=2), unchanged=("description",))
        tx.update("public.categories", {"id": 2, "name": "Outdoor"})
        tx.delete("public.products", {"id": 3})
        tx.insert("public.order_items", {"order_id": ORDER, "line_no": 2, "product_id": 2, "quantity": 1, "unit_price": "5.00"})
    _step(ctx)
    paths = [
        warehouse.current_path(ctx, "public.products"),
        warehouse.history_path(ctx, "public.products"),
        warehouse.current_path(ctx, "public.categories"),
        ctx.path("search", "products", "documents"),
        ctx.path("search", "products", "terms"),
        ctx.path("cache", "order", "entries"),
    ]
    incremental = {p: _table(ctx, p) for p in paths}
    monkeypatch.setattr(pending, "DRIVER_READ_LIMIT", 0)
    _step(ctx, replace=True)
    for p in paths:
        assert _table(ctx, p) == incremental[p], p
    last = ctx.spark.sql(f"DESCRIBE HISTORY delta.`{paths[0]}`").orderBy("version", ascending=False).first()
    assert last is not None and last["operation"] in ("WRITE", "CREATE OR REPLACE TABLE AS SELECT")


def test_cli_search_cache_get_and_unknown_view(
    ctx: ViewContext, log: LogBuilder, data_dir: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from cdc.cli import cli, run
    from cdc.commands import register

    _seed(log)
    monkeypatch.setenv("CDC_DATA_DIR", str(data_dir))
    monkeypatch.setenv("CDC_VIEWS_FILE", str(EXAMPLE_VIEWS))
    register(cli)
    assert run(cli, ["sync", "search", "cache", "--once"]) == 0
    assert run(cli, ["search", "brass lamp", "--limit", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and out[0].startswith("1. [") and "] 1  Brass desk lamp  Lighting  19.90" in out[0]
    assert run(cli, ["search", "products", "brass lamp", "--json"]) == 0
    hits = json.loads(capsys.readouterr().out)
    assert hits[0]["key"] == {"id": 1} and hits[0]["fields"]["category_name"] == "Lighting"
    assert run(cli, ["search", "nosuchindex", "lamp"]) == 2
    assert "unknown search index 'nosuchindex': choose one of products" in capsys.readouterr().err
    assert run(cli, ["cache", "get", "order", ORDER]) == 0
    assert '"status": "pending"' in capsys.readouterr().out
    assert run(cli, ["cache", "get", "invoice", "1"]) == 2
    assert run(cli, ["sync", "nosuchview", "--once"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: unknown view 'nosuchview': choose one of cache.order, search.products, warehouse")


def test_no_view_syncs_to_a_snapshot_still_being_copied(ctx: ViewContext, log: LogBuilder) -> None:
    """Groups at the in-progress snapshot position hold part of the tables and no commit: skip them."""
    from derived_views.runs import runner

    with log.transaction() as tx:
        tx.insert("public.categories", {"id": 1, "name": "books"})
    log.log.append_group([], SNAPSHOT_POSITION)
    report = runner.step(ctx, ["warehouse"])
    assert report.watermark is None and report.events == {}
    assert runner.latest(ctx) is None


def test_a_second_process_cannot_sync_a_view_being_synced(
    ctx: ViewContext, log: LogBuilder, caplog: pytest.LogCaptureFixture
) -> None:
    """Two writers of one view could both apply the same pending range (an append would land twice); a
    cache entity reads the warehouse's current tables, so its step waits while another process writes them."""
    import logging
    import subprocess
    import sys
    import time
    from concurrent.futures import ThreadPoolExecutor

    from derived_views.errors import ViewBusyError
    from derived_views.runs import runner

    with log.transaction() as tx:
        tx.insert("public.products", product(1))
    released = False
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, types\n"
            "from pathlib import Path\n"
            "from derived_views.runs.runner import TABLES_LOCK, view_locks\n"
            "from log_store.lock import FileLock\n"
            f"ctx = types.SimpleNamespace(views_dir={ctx.views_dir!r})\n"
            "with view_locks(ctx, ['warehouse']), FileLock(Path(ctx.views_dir) / '_locks' / f'{TABLES_LOCK}.lock'):\n"
            "    print('locked', flush=True)\n"
            "    sys.stdin.readline()\n",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        with pytest.raises(ViewBusyError, match=rf"view 'warehouse' is being synced or rebuilt by process {holder.pid}"):
            runner.step(ctx, ["warehouse", "cache"])
        caplog.set_level(logging.INFO, logger="cdc.views")
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(runner.step, ctx, ["cache"])
            deadline = time.monotonic() + 120
            while not any("waiting for the warehouse's current tables" in r.getMessage() for r in caplog.records):
                assert not waiting.done(), waiting.result()
                assert time.monotonic() < deadline, "the cache step neither waited nor ended"
                time.sleep(0.05)
            assert not waiting.done()
            assert holder.stdin is not None
            holder.stdin.write("\n")
            holder.stdin.flush()
            released = True
            done = waiting.result(timeout=300)  # went on once the lock was free
            assert done.watermark is not None and not done.failures, done
            assert ctx.progress(ctx.path("cache", "order", "entries")).position == done.watermark.position
    finally:
        assert holder.stdin is not None
        if not released:
            holder.stdin.write("\n")
            holder.stdin.flush()
        holder.wait(timeout=30)
    report = runner.step(ctx, ["warehouse"])  # the lock went with its holder
    assert report.events["warehouse"] > 0


def test_search_cache_get_and_views_answer_without_a_jvm(ctx: ViewContext, log: LogBuilder) -> None:
    """The read-only commands read the Delta tables with deltalake: they work with no Java on the PATH,
    and an unknown entity is refused before anything is read."""
    import json
    import os
    import subprocess
    import sys

    from derived_views.runs import runner

    _seed(log)
    runner.step(ctx, ["search", "cache"])
    no_java = {
        **{k: v for k, v in os.environ.items() if k != "JAVA_HOME"},
        "JAVA_HOME": "/nonexistent",
        "PATH": os.path.dirname(sys.executable),
        "CDC_DATA_DIR": ctx.views_dir,
        "SPARK_HOME": "/nonexistent",
        "CDC_VIEWS_FILE": str(EXAMPLE_VIEWS),
    }

    def cdc(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", "from cdc.cli import main; main()", *args],
            env=no_java,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    found = cdc("search", "brass lamp", "--limit", "2")
    assert found.returncode == 0, found.stderr
    assert found.stdout.splitlines()[0].startswith("1. [") and "Brass desk lamp" in found.stdout.splitlines()[0]
    cached = cdc("cache", "get", "order", ORDER)
    assert cached.returncode == 0, cached.stderr
    assert json.loads(cached.stdout)["items"][0]["line_no"] == 1
    unknown = cdc("cache", "get", "invoice", "1")
    assert unknown.returncode == 2 and "unknown cache entity 'invoice'" in unknown.stderr
    listed = cdc("views", "--json")
    assert listed.returncode == 0, listed.stderr
    synced = {t["path"].split("/data/", 1)[1] for t in json.loads(listed.stdout)["tables"] if t["as_of_lsn"]}
    assert synced >= {
        "search/products/terms",
        "search/products/documents",
        "cache/order/entries",
        "warehouse/current/public.categories",
        "warehouse/current/public.order_items",
    }
    reads = {
        t["holds"]: t["path"].split("/data/", 1)[1] for t in json.loads(listed.stdout)["tables"] if t["view"] == "cache.order"
    }
    assert reads["reads public.order_items (current)"] == "warehouse/current/public.order_items"
    assert not Path(ctx.path("cache", "order", "_state")).exists()  # the warehouse keeps every table: no copy of its own
