"""``cdc sync`` beside what a Spark user writes instead, on the same change feed, in one run.

Usage: python -m bench.views_side_by_side [--warmup S] [--no-levers] [seconds] [transactions_per_second]
[preload] [burst] [arms]
(default 60 s, 2 tx/s, 100,000 products, a burst of 10,000 changed rows, arms ``cdc,cdc-all,cdc-dv,merge,sdp``,
a warm-up of 20 s per arm, then the levers)

One log: ``cdc capture`` runs as its own process for the whole run (its cost is the same for every arm
and is not counted). Each arm keeps the products' current rows in a Delta table from that log, in turn
(each alone on the machine, one after another), while a writer commits the update workload of
``bench/views_freshness.py`` (a transaction inserting 5 products and raising the price of 5 existing
ones) at a steady rate for ``seconds``, then one transaction changing the price of ``burst`` products:

* ``cdc``: ``cdc sync --continuous`` of the warehouse (the products' current table only: no history),
  in this process, polling the watermark every 0.1 s;
* ``cdc-all``: the same with every kind of view on: the products' current and history tables, a search
  index and a cache entity of the products (a views directory of its own);
* ``cdc-dv``: the same as ``cdc`` with deletion vectors (``CDC_DELETION_VECTORS=true``, an opt-in: tables
  ``deltalake``'s ``to_pyarrow_table()`` cannot read; a views directory of its own);
* ``merge``: a Structured Streaming job over the ``cdclog`` source (``rows=events``) whose
  ``foreachBatch`` keeps each key's latest event of the micro-batch and MERGEs it into Delta (the Delta
  documentation's upsert pattern), triggered as fast as it can, in this process's Spark session;
* ``sdp``: the example Spark Declarative Pipeline (``examples/declarative_pipeline``) run by
  ``spark-pipelines`` on a warm ``cdc spark-server``, over and over: a streaming table of the events and
  a materialized view of the current rows. (``create_auto_cdc_flow`` would be Spark's own incremental
  anchor, but Spark 4.2 runs it only into a connector with row-level operations, which Delta 4.4's is
  not: see docs/spark-source.md.)

Every arm first runs the steady workload for ``--warmup`` seconds, left out of its figures: the first
arm starts this process's JVM, whose first steps compile and load what later arms find ready. The warm-up
must span several steps: with 5 s (about one step) the first arm stayed about twice as slow.

Printed per arm: commit-to-visible p50 and p99 of the steady transactions (visible: the first commit of
the arm's table that holds the transaction's commit LSN; for ``cdc-all``, the first step that brought
every view to it), the burst's commit-to-visible, the CPU seconds the arm's processes spent per 1,000
changes (this process and its JVM for ``cdc`` and ``merge``; the server's process tree and the CLI runs
for ``sdp``), whether its table equals the source (count and sum of prices), and the ratios of the
``cdc`` arms to the faster anchor (``merge`` or ``sdp``) at each figure. For the ``cdc`` arms, the
phases of the sync step (seconds per phase, timed where the step calls them) of the median step and the
slowest ones.

Then the levers (``--no-levers`` leaves them out), each beside its anchor in the same run:

* file layout: a MERGE of 20 random keys into the ``cdc`` arm's table as ``cdc sync`` laid it out (the
  anchor), and into copies of it with smaller files, clustered by key, and with deletion vectors
  (``CDC_DELETION_VECTORS``): Delta's own MERGE metrics (rows copied unchanged, files removed/added);
* the MERGE itself: ``cdc sync``'s MERGE of the current table beside the Delta documentation's upsert (the
  anchor), the same batches into copies of the ``cdc`` arm's table;
* the scheduled case: a fresh ``cdc sync --once`` of one small transaction beside a bare Spark start (the
  anchor), with Spark started by the command, and attached to a warm ``cdc spark-server``
  (functions of ``bench/views_scheduled.py``).
"""

from __future__ import annotations

import functools
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

from bench.views_common import PRODUCTS_SQL, PhaseTimes, bench_spark, load_average, products_database
from cdc.config import view_arguments
from cdc.config.settings import Settings
from derived_views.runs import runner
from derived_views.views import warehouse
from local_servers.postgres import free_port

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "declarative_pipeline"
BIN = Path(sys.executable).parent
VIEWS = '[warehouse]\ntables = ["public.products"]\nwithout_history = ["public.products"]\n'
#: Every kind of view over the products: current and history tables, a search index, a cache entity.
ALL_VIEWS = """[warehouse]
tables = ["public.products"]

[search.products]
root = "public.products"
text = ["name", "description", "tags"]
stored = ["name", "price"]

[cache.product]
root = "public.products"
"""
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
    #: the arm's table
    table: str = ""
    #: seconds per phase of each measured sync step (the ``cdc`` arms)
    steps: list[dict[str, float]] = field(default_factory=list)


def _totals_equal(url: str, path: str) -> bool:
    """Whether the Delta table at ``path`` holds as many products, with the same sum of prices, as the source
    (read by ``deltalake``'s SQL engine, which also reads a table with deletion vectors)."""
    from derived_views.engine.delta_reads import read_query

    with psycopg.connect(url) as conn:
        count, total = conn.execute("SELECT count(*), sum(price) FROM products").fetchone()  # type: ignore[misc]
    held = read_query(path, "SELECT count(*) AS n, sum(price) AS total FROM t").to_pylist()[0]
    return bool(held["n"] == count and held["total"] == total)


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


@dataclass(frozen=True)
class Workload:
    """What every arm is given: the writer, the steady phase, the burst and the warm-up before them."""

    writer: Writer
    seconds: float
    rate: float
    burst: int
    warmup: float


def _warm_up(load: Workload, applied: list[tuple[int, float]]) -> None:
    """The steady workload for ``load.warmup`` seconds, until the arm applied all of it (left out of the figures)."""
    if load.warmup <= 0:
        return
    commits = load.writer.steady(load.warmup, load.rate)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and _visible(commits[-1:], applied)[-1] is None:
        time.sleep(0.1)


def _measure(
    arm: Arm, load: Workload, applied: list[tuple[int, float]], cpu: Callable[[], float], measuring: threading.Event | None = None
) -> None:
    """Warm the arm up, run the workload while the arm applies (``applied`` grows), then fill ``arm`` in
    (``measuring`` is set for the measured part)."""
    writer, seconds, rate, burst = load.writer, load.seconds, load.rate, load.burst
    _warm_up(load, applied)
    if measuring is not None:
        measuring.set()
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


@functools.cache
def _step_phases() -> PhaseTimes:
    """Seconds per phase of a sync step, timed where the step calls each function."""
    from derived_views.engine import evaluation
    from derived_views.views import cache, search
    from derived_views.write import scd1, steps

    return PhaseTimes(
        {
            (runner, "_step"): "step",
            (runner, "_plans"): "schemas and plans",
            (runner, "record_failures"): "failure records",
            (warehouse, "_has_pending"): "pending check",
            (steps, "is_current"): "current check and idle mark",
            (steps, "follow_source_columns"): "column renames",
            (evaluation, "small_tables"): "table size walk",
            (steps, "load_pending"): "read, reduce, type",
            (steps, "merge_current"): "current MERGE (all)",
            (scd1, "meets_table"): "  of it: append key check",
            (scd1, "append"): "  of it: append",
            (warehouse, "merge_history"): "history MERGE",
            (runner, "_sync_view"): "each view (side by side)",
            (search, "sync"): "search index (all)",
            (search, "affected_keys"): "  of it: affected documents",
            (search, "merge_roots"): "  of it: documents MERGE",
            (search, "_merge_terms"): "  of it: terms MERGE",
            (cache, "sync"): "cache entity (all)",
            (cache, "affected_roots"): "  of it: affected entries",
            (cache, "merge_roots"): "  of it: entries MERGE",
        }
    )


def _cdc_arm(settings: Settings, load: Workload, workdir: Path, cpu: Callable[[], float], name: str = "cdc") -> Arm:
    """``cdc sync --continuous``: ``cdc``, of the warehouse's current table; ``cdc-all``, of every view in
    :data:`ALL_VIEWS`; ``cdc-dv``, of the current table with deletion vectors (``CDC_DELETION_VECTORS``).
    The last two in a views directory of their own."""
    from derived_views import ViewContext
    from derived_views.definitions import load as load_definitions
    from derived_views.engine.spark_session import new_session

    spark = bench_spark()
    ctx = view_arguments.context_from_settings(settings, spark)
    names = ["warehouse"]
    if name != "cdc":
        views_dir = workdir / name
        views_dir.mkdir()
        (views_dir / "views.toml").write_text(ALL_VIEWS if name == "cdc-all" else VIEWS)
        ctx = ViewContext(
            new_session(spark),  # its settings (deletion vectors) stay its own
            str(views_dir),
            ctx.log,
            ctx.prefix,
            definitions=load_definitions(views_dir / "views.toml"),
            deletion_vectors=name == "cdc-dv",
        )
        names = []  # every view of the file
    applied: list[tuple[int, float]] = []
    phases = _step_phases()
    arm = Arm(name)
    measuring = threading.Event()

    def on_step(report: runner.StepReport) -> None:
        if report.watermark is not None and not report.failures:
            applied.append((report.watermark.lsn, time.time()))
        taken = phases.take()
        if measuring.is_set():
            arm.steps.append(taken)

    stop = threading.Event()
    loop = threading.Thread(
        target=lambda: runner.continuous(ctx, names, 0.1, should_stop=stop.is_set, on_step=on_step), daemon=True
    )
    loop.start()
    _wait_first(applied)
    _measure(arm, load, applied, cpu, measuring)
    stop.set()
    loop.join(timeout=120)
    arm.equal = _totals_equal(load.writer.url, warehouse.current_path(ctx, "public.products"))
    arm.table = warehouse.current_path(ctx, "public.products")
    return arm


def _merge_arm(settings: Settings, load: Workload, workdir: Path, cpu: Callable[[], float]) -> Arm:
    from delta.tables import DeltaTable
    from pyspark.sql import DataFrame, Window
    from pyspark.sql import functions as F

    import derived_views

    # a session of its own: Delta's defaults as a user's job gets them, none of the settings a cdc arm set
    spark = bench_spark().newSession()
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
        _measure(arm, load, applied, cpu)
    finally:
        query.stop()
    arm.equal = _totals_equal(load.writer.url, target)
    arm.table = target
    return arm


def _sdp_arm(settings: Settings, load: Workload, workdir: Path) -> Arm:
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
        _measure(arm, load, applied, lambda: _cpu(server_pid) + cpu_runs[0])
        stop.set()
        loop.join(timeout=900)
    arm.equal = _totals_equal(load.writer.url, str(tables / "products"))
    arm.table = str(tables / "products")
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


def main(seconds: float, rate: float, preload: int, burst: int, arms: list[str], warmup: float, levers: bool) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="cdc-bench-side-"))
    views_file = workdir / "views.toml"
    views_file.write_text(VIEWS)
    results: list[Arm] = []
    print(f"{load_average()} at the start")
    with products_database(preload, views_file=views_file) as (_server, url, settings):
        load = Workload(Writer(url, preload), seconds, rate, burst, warmup)
        with _capture(settings) as capture_pid:
            postmaster = int((_server.data_dir / "postmaster.pid").read_text().split()[0])
            cpu = lambda: _cpu(os.getpid(), frozenset({capture_pid, postmaster}))  # noqa: E731 - this process and its JVM
            for name in arms:
                if name in ("cdc", "cdc-all", "cdc-dv"):
                    results.append(_cdc_arm(settings, load, workdir, cpu, name))
                elif name == "merge":
                    results.append(_merge_arm(settings, load, workdir, cpu))
                elif name == "sdp":
                    results.append(_sdp_arm(settings, load, workdir))
                print(f"{load_average()} after the {name} arm", flush=True)
            _print_arms(results, seconds, rate, preload, burst, warmup)
            if levers:
                from bench.views_levers import file_layout, merge_forms, scheduled

                scheduled(settings, load.writer, views_file)
                cdc = next((arm for arm in results if arm.name == "cdc"), None)
                if cdc is not None:
                    merge_forms(bench_spark(), cdc.table, workdir / "forms")
                    file_layout(bench_spark(), cdc.table, workdir / "layouts")  # last: its MERGEs change the table
    shutil.rmtree(workdir, ignore_errors=True)
    print(f"{load_average()} at the end")


#: The arms a ``cdc`` arm is compared with; the faster of them at each figure is its anchor.
ANCHORS = ("merge", "sdp")


def _print_arms(results: list[Arm], seconds: float, rate: float, preload: int, burst: int, warmup: float) -> None:
    print(
        f"{seconds:g} s at {rate:g} tx/s (5 inserts, 5 price updates each) over {preload:,} products; burst {burst:,} rows;"
        f" after a warm-up of {warmup:g} s per arm"
    )
    figures = {
        arm.name: (_percentile(arm.steady, 0.5), _percentile(arm.steady, 0.99), arm.burst) for arm in results if arm.steady
    }
    anchors = [figures[name] for name in ANCHORS if name in figures]
    fastest = tuple(min(values) for values in zip(*anchors, strict=True)) if anchors else None
    for arm in results:
        per_thousand = arm.cpu_seconds / arm.changes * 1000 if arm.changes else float("nan")
        p50, p99 = _percentile(arm.steady, 0.5), _percentile(arm.steady, 0.99)
        line = (
            f"{arm.name:<7} commit-to-visible p50 {p50:6.2f} s p99 {p99:6.2f} s"
            f" (mean {statistics.mean(arm.steady) if arm.steady else float('nan'):5.2f}, {arm.missing} never seen)"
            f"  burst {arm.burst:6.2f} s  CPU {per_thousand:6.2f} s/1000 changes"
            f"  table {'equals' if arm.equal else 'DIFFERS FROM'} the source"
        )
        if fastest is not None and arm.name not in ANCHORS and arm.steady:
            p50_ratio, p99_ratio, burst_ratio = (mine / best for mine, best in zip((p50, p99, arm.burst), fastest, strict=True))
            line += f"  ratio to the faster anchor: p50 {p50_ratio:.2f}, p99 {p99_ratio:.2f}, burst {burst_ratio:.2f}"
        print(line)
    for arm in results:
        if arm.steps:
            _print_phases(arm)


def _print_phases(arm: Arm) -> None:
    """The phases of the ``cdc`` arm's median step and of its three slowest."""
    ordered = sorted(arm.steps, key=lambda phases: phases.get("step", 0.0))
    chosen = [("median", ordered[len(ordered) // 2])] + [("slowest", phases) for phases in ordered[-1:-4:-1]]
    print(f"{arm.name} step phases, seconds ({len(ordered)} steps measured; phases overlap where tables apply side by side):")
    seen = {name for _, phases in chosen for name in phases}
    names = [name for name in _step_phases().names if name in seen]
    print(f"  {'phase':<30}" + "".join(f"{label:>9}" for label, _ in chosen))
    for name in names:
        print(f"  {name:<30}" + "".join(f"{phases.get(name, 0.0):9.2f}" for _, phases in chosen))


if __name__ == "__main__":
    options, words = sys.argv[1:], []
    warmup, levers = 20.0, True
    while options:
        word = options.pop(0)
        if word == "--warmup":
            warmup = float(options.pop(0))
        elif word == "--no-levers":
            levers = False
        else:
            words.append(word)
    main(
        float(words[0]) if len(words) > 0 else 60.0,
        float(words[1]) if len(words) > 1 else 2.0,
        int(words[2]) if len(words) > 2 else 100_000,
        int(words[3]) if len(words) > 3 else 10_000,
        (words[4] if len(words) > 4 else "cdc,cdc-all,cdc-dv,merge,sdp").split(","),
        warmup,
        levers,
    )
