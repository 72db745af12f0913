"""``cdc sync`` beside what a Spark user writes instead, on the same change feed, in one run.

Usage: python -m bench.views_side_by_side [seconds] [transactions_per_second] [preload] [burst] [arms]
(default 60 s, 2 tx/s, 100,000 products, a burst of 10,000 changed rows, arms ``cdc,merge,sdp``)

One log: ``cdc capture`` runs as its own process for the whole run (its cost is the same for every arm
and is not counted). Each arm keeps the products' current rows in a Delta table from that log, in turn,
while a writer commits the update workload of ``bench/views_freshness.py`` (a transaction inserting 5
products and raising the price of 5 existing ones) at a steady rate for ``seconds``, then one transaction
changing the price of ``burst`` products:

* ``cdc``: ``cdc sync --continuous`` of the warehouse (the products' current table only: no history),
  in this process, polling the watermark every 0.1 s;
* ``merge``: a Structured Streaming job over the ``cdclog`` source (``rows=events``) whose
  ``foreachBatch`` keeps each key's latest event of the micro-batch and MERGEs it into Delta (the Delta
  documentation's upsert pattern), triggered as fast as it can, in this process's Spark session;
* ``sdp``: the example Spark Declarative Pipeline (``examples/declarative_pipeline``) run by
  ``spark-pipelines`` on a warm ``cdc spark-server``, over and over: a streaming table of the events and
  a materialized view of the current rows. (``create_auto_cdc_flow`` would be Spark's own incremental
  anchor, but Spark 4.2 runs it only into a connector with row-level operations, which Delta 4.4's is
  not: see docs/spark-source.md.)

Printed per arm: commit-to-visible p50 and p99 of the steady transactions (visible: the first commit of
the arm's table that holds the transaction's commit LSN), the burst's commit-to-visible, and the CPU
seconds the arm's processes spent per 1,000 changes (this process and its JVM for ``cdc`` and
``merge``; the server's process tree and the CLI runs for ``sdp``). The ratios to ``cdc`` say whether it
is as fast as what a user would write.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import yaml  # type: ignore[import-untyped]

from bench.views_common import PRODUCTS_SQL, bench_spark, load_average, products_database
from cdc import view_context
from cdc.settings import Settings
from derived_views.views import runner, warehouse
from local_servers.postgres import free_port

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "declarative_pipeline"
BIN = Path(sys.executable).parent
VIEWS = '[warehouse]\ntables = ["public.products"]\nwithout_history = ["public.products"]\n'
#: The products' columns the arms keep, as the warehouse types them.
COLUMNS = "category_id int, name string, description string, price decimal(12,2), attributes string, tags array<string>"


@dataclass
class Arm:
    """What one arm measured."""

    name: str
    steady: list[float] = field(default_factory=list)
    burst: float = float("nan")
    cpu_seconds: float = 0.0
    changes: int = 0
    missing: int = 0
    #: whether the arm's table holds the source's rows at the end (count and sum of prices)
    equal: bool = False


def _totals_equal(url: str, path: str) -> bool:
    """Whether the Delta table at ``path`` holds as many products, with the same sum of prices, as the source."""
    import pyarrow.compute as pc
    from deltalake import DeltaTable

    with psycopg.connect(url) as conn:
        count, total = conn.execute("SELECT count(*), sum(price) FROM products").fetchone()  # type: ignore[misc]
    table = DeltaTable(path).to_pyarrow_table(columns=["price"])
    return bool(table.num_rows == count and pc.sum(table.column("price")).as_py() == total)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))] if ordered else float("nan")


def _cpu(pid: int, exclude: frozenset[int] = frozenset()) -> float:
    """CPU seconds of ``pid`` and every live process below it, but the trees of ``exclude``."""
    ticks = os.sysconf("SC_CLK_TCK")
    children: dict[int, list[int]] = {}
    stats: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.name))
        stats[int(entry.name)] = (int(fields[11]) + int(fields[12])) / ticks
    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        if current in exclude:
            continue
        total += stats.get(current, 0.0)
        todo += children.get(current, [])
    return total


class Writer:
    """The workload: transactions at a steady rate, then a burst; each one's commit LSN and time."""

    def __init__(self, url: str, preload: int) -> None:
        self.url = url
        self.preload = preload
        self.next_id = preload + 1
        self.chooser = random.Random(7)

    def steady(self, seconds: float, rate: float) -> list[tuple[int, float]]:
        commits = []
        with psycopg.connect(self.url, autocommit=True) as conn:
            start = time.monotonic()
            while time.monotonic() - start < seconds:
                commits.append(self._commit(conn, 5))
                time.sleep(max(0.0, start + len(commits) / rate - time.monotonic()))
        return commits

    def burst(self, rows: int) -> tuple[int, float]:
        with psycopg.connect(self.url, autocommit=True) as conn:
            return self._commit(conn, 0, rows)

    def _commit(self, conn: psycopg.Connection, inserts: int, updates: int = 5) -> tuple[int, float]:
        """One transaction: the WAL insert position before it began, and its commit time."""
        text = str(conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0])  # type: ignore[index]
        high, low = text.split("/")
        with conn.transaction():
            if inserts:
                conn.execute(PRODUCTS_SQL, (self.next_id, self.next_id + inserts - 1))
                self.next_id += inserts
            ids = self.chooser.sample(range(1, self.preload + 1), updates)
            conn.execute("UPDATE products SET price = price + 1 WHERE id = ANY(%s)", (ids,))
        return (int(high, 16) << 32) + int(low, 16), time.time()


def _visible(commits: list[tuple[int, float]], applied: list[tuple[int, float]]) -> list[float | None]:
    """Commit-to-visible seconds of each commit (the WAL insert position read just before it began, and
    its commit time) given the arm's applies (the highest commit LSN its table held after each apply, and
    when); ``None`` for a commit never applied.

    The writer alone changes the captured table, so a transaction's events carry a commit LSN past the
    position read before it began, and every earlier transaction's is below that position: the first
    apply holding an LSN past it holds the transaction."""
    found: list[float | None] = []
    for before, committed in commits:
        times = [at for lsn, at in applied if lsn > before]
        found.append(min(times) - committed if times else None)
    return found


@contextmanager
def _capture(settings: Settings) -> Iterator[int]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CDC_")}
    env.update(CDC_DATABASE_URL=settings.database_url, CDC_DATA_DIR=str(settings.data_dir), CDC_TABLES="public.products")
    process = subprocess.Popen([str(BIN / "cdc"), "capture"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield process.pid
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)


def _wait_first(applied: list[tuple[int, float]], timeout: float = 900) -> None:
    """Until the arm applied once (the whole log so far: its tables exist and hold the preloaded rows)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not applied:
        time.sleep(0.2)
    if not applied:
        raise RuntimeError(f"the arm applied nothing within {timeout:g} s")


def _measure(arm: Arm, writer: Writer, seconds: float, rate: float, burst: int, applied: list[tuple[int, float]],
             cpu: Callable[[], float]) -> None:  # fmt: skip
    """Run the workload while the arm applies (``applied`` grows), then fill ``arm`` in."""
    before = cpu()
    commits = writer.steady(seconds, rate)
    commits.append(writer.burst(burst))
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and _visible(commits[-2:], applied)[-1] is None:
        time.sleep(0.1)
    arm.cpu_seconds = cpu() - before
    arm.changes = (len(commits) - 1) * 10 + burst
    seen = _visible(commits, applied)
    arm.steady = [latency for latency in seen[:-1] if latency is not None]
    arm.missing = len(commits) - 1 - len(arm.steady)
    arm.burst = seen[-1] if seen[-1] is not None else float("nan")


def _cdc_arm(settings: Settings, writer: Writer, seconds: float, rate: float, burst: int, cpu: Callable[[], float]) -> Arm:
    spark = bench_spark()
    ctx = view_context.context_from_settings(settings, spark)
    applied: list[tuple[int, float]] = []

    def on_step(report: runner.StepReport) -> None:
        if report.watermark is not None and not report.failures:
            applied.append((report.watermark.lsn, time.time()))

    stop = threading.Event()
    loop = threading.Thread(
        target=lambda: runner.continuous(ctx, ["warehouse"], 0.1, should_stop=stop.is_set, on_step=on_step), daemon=True
    )
    loop.start()
    _wait_first(applied)
    arm = Arm("cdc")
    _measure(arm, writer, seconds, rate, burst, applied, cpu)
    stop.set()
    loop.join(timeout=120)
    arm.equal = _totals_equal(writer.url, warehouse.current_path(ctx, "public.products"))
    return arm


def _merge_arm(
    settings: Settings, writer: Writer, seconds: float, rate: float, burst: int, workdir: Path, cpu: Callable[[], float]
) -> Arm:
    from delta.tables import DeltaTable
    from pyspark.sql import DataFrame, Window
    from pyspark.sql import functions as F

    import derived_views

    spark = bench_spark()
    derived_views.register(spark)
    target = str(workdir / "merge" / "products")
    applied: list[tuple[int, float]] = []

    def upsert(batch: DataFrame, _batch_id: int) -> None:
        row = F.from_json("after", COLUMNS)
        latest = Window.partitionBy("id").orderBy(F.col("lsn").desc(), F.col("sequence").desc())
        changes = (
            batch.where("error IS NULL AND op <> 't'")
            .select(F.from_json("key", "id bigint")["id"].alias("id"), "op", "lsn", "sequence", row.alias("row"))
            .withColumn("rank", F.row_number().over(latest))
            .where("rank = 1")
            .select("id", "op", "lsn", "row.*")
        )
        top = batch.agg(F.max("lsn")).collect()[0][0]
        if not DeltaTable.isDeltaTable(spark, target):
            changes.where("op <> 'd'").drop("op").write.format("delta").save(target)
        else:
            (
                DeltaTable.forPath(spark, target)
                .alias("t")
                .merge(changes.alias("s"), "t.id = s.id")
                .whenMatchedDelete("s.op = 'd'")
                .whenMatchedUpdateAll("s.op <> 'd'")
                .whenNotMatchedInsertAll("s.op <> 'd'")
                .execute()
            )
        if top is not None:
            applied.append((int(top), time.time()))

    log = str(Path(settings.data_dir) / "log")
    stream = (
        spark.readStream.format("cdclog")
        .option("path", log)
        .option("topics", "cdc.public.products")
        .option("rows", "events")
        .load()
    )
    query = stream.writeStream.foreachBatch(upsert).option("checkpointLocation", str(workdir / "merge" / "checkpoint")).start()
    try:
        _wait_first(applied)
        arm = Arm("merge")
        _measure(arm, writer, seconds, rate, burst, applied, cpu)
    finally:
        query.stop()
    arm.equal = _totals_equal(writer.url, target)
    return arm


def _sdp_arm(settings: Settings, writer: Writer, seconds: float, rate: float, burst: int, workdir: Path) -> Arm:
    spec = _pipeline(workdir / "sdp", Path(settings.data_dir) / "log")
    tables = workdir / "sdp" / "tables"
    applied: list[tuple[int, float]] = []
    with _spark_server(workdir / "sdp", tables) as (url, server_pid):
        stop = threading.Event()
        cpu_runs = [0.0]

        def runs() -> None:
            env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
            while not stop.is_set():
                started = os.times()
                subprocess.run(
                    [str(BIN / "spark-pipelines"), "--remote", url, "run", "--spec", str(spec)],
                    env=env, capture_output=True, check=True, timeout=600,
                )  # fmt: skip
                ended = os.times()
                cpu_runs[0] += ended.children_user + ended.children_system - started.children_user - started.children_system
                from deltalake import DeltaTable

                top = DeltaTable(str(tables / "product_changes")).to_pyarrow_table(columns=["lsn"]).column("lsn")
                applied.append((int(max(top.to_pylist() or [0])), time.time()))

        loop = threading.Thread(target=runs, daemon=True)
        loop.start()
        _wait_first(applied)
        arm = Arm("sdp")
        _measure(arm, writer, seconds, rate, burst, applied, lambda: _cpu(server_pid) + cpu_runs[0])
        stop.set()
        loop.join(timeout=900)
    arm.equal = _totals_equal(writer.url, str(tables / "products"))
    return arm


def _pipeline(workdir: Path, log_dir: Path) -> Path:
    copy = workdir / "pipeline"
    shutil.copytree(EXAMPLE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    path = copy / "spark-pipeline.yml"
    spec = yaml.safe_load(path.read_text())
    spec["storage"] = (workdir / "storage").as_uri()
    spec["configuration"]["cdc.log"] = str(log_dir)
    path.write_text(yaml.safe_dump(spec))
    return path


@contextmanager
def _spark_server(workdir: Path, tables: Path) -> Iterator[tuple[str, int]]:
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CDC_") or k == "CDC_SPARK_JARS_DIR"}
    server = subprocess.Popen(
        [str(BIN / "cdc"), "spark-server", "--port", str(port), "--conf", f"spark.sql.warehouse.dir={tables}"],
        cwd=workdir, env=env, stdout=subprocess.DEVNULL, stderr=(workdir / "server.log").open("w"),
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError((workdir / "server.log").read_text()[-3000:]) from None
                time.sleep(0.5)
        yield f"sc://127.0.0.1:{port}", server.pid
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)


def main(seconds: float, rate: float, preload: int, burst: int, arms: list[str]) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="cdc-bench-side-"))
    views_file = workdir / "views.toml"
    views_file.write_text(VIEWS)
    results: list[Arm] = []
    print(f"{load_average()} at the start")
    with products_database(preload, views_file=views_file) as (_server, url, settings):
        writer = Writer(url, preload)
        with _capture(settings) as capture_pid:
            postmaster = int((_server.data_dir / "postmaster.pid").read_text().split()[0])
            cpu = lambda: _cpu(os.getpid(), frozenset({capture_pid, postmaster}))  # noqa: E731 - this process and its JVM
            for name in arms:
                if name == "cdc":
                    results.append(_cdc_arm(settings, writer, seconds, rate, burst, cpu))
                elif name == "merge":
                    results.append(_merge_arm(settings, writer, seconds, rate, burst, workdir, cpu))
                elif name == "sdp":
                    results.append(_sdp_arm(settings, writer, seconds, rate, burst, workdir))
    shutil.rmtree(workdir, ignore_errors=True)
    print(f"{seconds:g} s at {rate:g} tx/s (5 inserts, 5 price updates each) over {preload:,} products; burst {burst:,} rows")
    anchor = results[0] if results else None
    for arm in results:
        per_thousand = arm.cpu_seconds / arm.changes * 1000 if arm.changes else float("nan")
        p50, p99 = _percentile(arm.steady, 0.5), _percentile(arm.steady, 0.99)
        line = (
            f"{arm.name:<6} commit-to-visible p50 {p50:6.2f} s p99 {p99:6.2f} s"
            f" (mean {statistics.mean(arm.steady) if arm.steady else float('nan'):5.2f}, {arm.missing} never seen)"
            f"  burst {arm.burst:6.2f} s  CPU {per_thousand:6.2f} s/1000 changes"
            f"  table {'equals' if arm.equal else 'DIFFERS FROM'} the source"
        )
        if anchor is not None and arm is not anchor and anchor.steady and arm.steady:
            line += f"  ratio to cdc: p50 {p50 / _percentile(anchor.steady, 0.5):.2f}, burst {arm.burst / anchor.burst:.2f}"
        print(line)
    print(f"{load_average()} at the end")


if __name__ == "__main__":
    args = sys.argv[1:]
    main(
        float(args[0]) if len(args) > 0 else 60.0,
        float(args[1]) if len(args) > 1 else 2.0,
        int(args[2]) if len(args) > 2 else 100_000,
        int(args[3]) if len(args) > 3 else 10_000,
        (args[4] if len(args) > 4 else "cdc,merge,sdp").split(","),
    )
