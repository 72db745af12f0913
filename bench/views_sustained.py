"""Views under a steady write load, rate after rate, beside a hand-written Spark job keeping the same tables.

Usage: python -m bench.views_sustained [--scales 5,50] [--rates 25,50,100,200] [--minutes 5]
[--arms warehouse,warehouse-dv,all,anchor] [--deletion-vectors]
(default pgbench scales 5 and 50 (500,000 and 5,000,000 accounts), 5 minutes per rate, every arm)

Per scale: a fresh PostgreSQL (``pgbench -i``; ``pgbench_history``, keyless, gets ``REPLICA IDENTITY
FULL``; the accounts' filler given words to index; a one-row probe table), ``cdc setup``, and ``cdc
capture`` as a process for the whole scale. Then each arm in turn, alone on the machine, reads that one
log into tables of its own:

- ``warehouse``: ``cdc sync --continuous`` of the warehouse's current and history tables of the four
  pgbench tables (and the probe's);
- ``warehouse-dv``: the same with ``CDC_DELETION_VECTORS=true`` (its tables use deletion vectors);
- ``all``: the same with every kind of view on: the warehouse, a cache entity and a search index over the
  accounts;
- ``anchor``: ``bench.sustained_anchor``, a Structured Streaming job whose ``foreachBatch`` keeps the same
  current and history tables the way the Delta documentation's patterns do (the fair anchor: the same
  tables, not one).

An arm first reads the whole log (its tables made from the initial read), then runs the rates in
ascending order, each for ``--minutes``: ``pgbench -n -c 2 -R RATE`` (tpcb-like: three updates and an
insert a transaction, four row changes) and, beside it, a probe transaction every second (one row updated;
the WAL insert position read inside the transaction, after its write). A probe is visible once every table
of the arm records a position past that LSN (``cdc sync``: each table's commit or position file; the
anchor: the highest LSN of its micro-batch, each of which ends at a commit watermark). Printed per arm and
rate:

- commit -> visible p50 and p99 over the probes of the window's second half, and p50 over its first half;
- bounded: the second half's p50 within 1.25x the first half's plus 2 s, and every probe of the window
  visible within 60 s of the window's end (else the higher rates are not run for that arm);
- CPU seconds of the arm's processes (sync or the anchor job, their JVMs included) per 1,000 row changes;
- the highest rate the arm sustained; and the ``cdc`` arms' p50 and CPU as a ratio to the anchor's.

At the end of each ``cdc`` arm, ``cdc verify warehouse --no-sync`` compares its tables with the source.
Prints figures only; it asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from bench.views_side_by_side import _cpu, _percentile
from bench.views_soak import _stop
from local_servers.postgres import LocalPostgres

ROOT = Path(__file__).resolve().parents[1]
BIN = ROOT / ".venv" / "bin"
TABLES = ["public.pgbench_accounts", "public.pgbench_branches", "public.pgbench_tellers", "public.pgbench_history"]
PROBE = "public.sustained_probe"
WAREHOUSE = "[warehouse]\ntables = [" + ", ".join(f'"{t}"' for t in [*TABLES, PROBE]) + "]\n"
EVERY_VIEW = (
    WAREHOUSE
    + '\n[cache.account]\nroot = "public.pgbench_accounts"\n'
    + '\n[search.accounts]\nroot = "public.pgbench_accounts"\ntext = ["filler"]\n'
)
ARMS = ("warehouse", "warehouse-dv", "all", "anchor")


@dataclass
class Point:
    """What one arm measured at one rate."""

    rate: int
    p50: float = float("nan")
    p99: float = float("nan")
    early_p50: float = float("nan")
    bounded: bool = False
    cpu_per_1000: float = float("nan")
    changes: int = 0


@dataclass
class ArmResult:
    name: str
    points: list[Point] = field(default_factory=list)
    verdict: str = ""

    def sustained(self) -> int:
        return max((p.rate for p in self.points if p.bounded), default=0)


def _lsn(text: str) -> int:
    high, low = text.split("/")
    return (int(high, 16) << 32) + int(low, 16)


class Probe:
    """A transaction a second on the probe table: ``(WAL insert position inside it, commit time)`` each."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.commits: list[tuple[int, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            n = 0
            while not self._stop.wait(1.0):
                n += 1
                with conn.transaction():
                    conn.execute("UPDATE sustained_probe SET n = %s WHERE id = 1", (n,))
                    inside = str(conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0])  # type: ignore[index]
                self.commits.append((_lsn(inside), time.time()))

    def __enter__(self) -> Probe:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


class Positions:
    """When each position was first reached by every table of an arm, polled every 0.25 s."""

    def __init__(self, reached: Callable[[], int | None]) -> None:
        self.reached = reached
        self.seen: list[tuple[int, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            try:
                position = self.reached()
            except Exception:  # noqa: BLE001 - a table being written or not made yet: try again
                continue
            if position is not None and (not self.seen or position > self.seen[-1][0]):
                self.seen.append((position, time.time()))

    def visible_after(self, lsn: int, committed: float) -> float | None:
        times = [at for position, at in self.seen if position > lsn]
        return min(times) - committed if times else None

    def __enter__(self) -> Positions:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


def _cdc_reached(data_dir: Path) -> int | None:
    """The least position every view table of ``data_dir`` records (commit or position file)."""
    from derived_views.engine.positions import local_position

    tables = [
        log.parent
        for view in ("warehouse", "cache", "search")
        for log in (data_dir / view).rglob("_delta_log")
        if not any(part.startswith("_") for part in log.parent.relative_to(data_dir).parts)
    ]
    positions = [local_position(str(t)) for t in tables]
    if not tables or any(p is None or not p.position for p in positions):
        return None
    return min(int(p.position, 16) for p in positions if p is not None)


def _anchor_reached(applied: Path) -> int | None:
    """Past the highest LSN the anchor applied: its events carry their transaction's commit LSN, which for a
    probe is the WAL insert position read inside it (so a probe counts as visible once its own event is)."""
    lines = applied.read_text().split() if applied.exists() else []
    return max((int(v) + 1 for v in lines[::2]), default=None)


def _env(url: str, data_dir: Path, views: str | None = None, deletion_vectors: bool = False) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CDC_")}
    env.update(CDC_DATABASE_URL=url, CDC_DATA_DIR=str(data_dir), CDC_DELETION_VECTORS=str(deletion_vectors).lower())
    if views is not None:
        views_file = data_dir / "views.toml"
        views_file.write_text(views)
        env["CDC_VIEWS_FILE"] = str(views_file)
    return env


def _wait_first(positions: Positions, url: str, timeout_s: float = 3600) -> None:
    """Until the arm holds everything the source committed so far (its first read of the log): a probe
    transaction committed now is visible (the anchor's position moves only with events)."""
    with psycopg.connect(url, autocommit=True) as conn, conn.transaction():
        conn.execute("UPDATE sustained_probe SET n = n + 1 WHERE id = 1")
        now = _lsn(str(conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0]))  # type: ignore[index]
    deadline = time.monotonic() + timeout_s
    while positions.visible_after(now, 0.0) is None:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the arm did not read the log within {timeout_s:g} s")
        time.sleep(1.0)


def _rate_point(url: str, pgbench: str, rate: int, minutes: float, positions: Positions, cpu: Callable[[], float]) -> Point:
    point = Point(rate)
    seconds = int(minutes * 60)
    cpu_before = cpu()
    with Probe(url) as probe:
        load = subprocess.run(
            [pgbench, "-n", "-c", "2", "-R", str(rate), "-T", str(seconds), url], capture_output=True, text=True, check=True
        )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and positions.visible_after(*probe.commits[-1]) is None:
        time.sleep(0.5)
    point.changes = 4 * next(
        int(line.split(":")[1].split()[0]) for line in load.stdout.splitlines() if "transactions actually processed" in line
    )
    point.cpu_per_1000 = (cpu() - cpu_before) / max(1, point.changes) * 1000
    latencies = [positions.visible_after(lsn, at) for lsn, at in probe.commits]
    half = len(latencies) // 2
    early = [v for v in latencies[:half] if v is not None]
    late = [v for v in latencies[half:] if v is not None]
    point.early_p50, point.p50, point.p99 = (
        statistics.median(early or [float("nan")]),
        _percentile(late, 0.5),
        _percentile(late, 0.99),
    )
    point.bounded = None not in latencies and point.p50 <= 1.25 * point.early_p50 + 2.0
    return point


def _arm(
    name: str, url: str, pgbench: str, log_dir: Path, work: Path, rates: list[int], minutes: float, vectors: bool
) -> ArmResult:
    result = ArmResult(name)
    data_dir = work / name
    data_dir.mkdir()
    (data_dir / "log").symlink_to(log_dir)
    logs = (data_dir / "service.log").open("wb")
    if name == "anchor":
        applied = data_dir / "applied"
        process = subprocess.Popen(
            [sys.executable, "-m", "bench.sustained_anchor", str(log_dir), str(data_dir / "tables"), str(applied)],
            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=logs, stderr=logs,
        )  # fmt: skip
        reached = lambda: _anchor_reached(applied)  # noqa: E731
    else:
        views = WAREHOUSE if name.startswith("warehouse") else EVERY_VIEW
        env = _env(url, data_dir, views, vectors or name.endswith("-dv"))
        process = subprocess.Popen([str(BIN / "cdc"), "sync", "--continuous"], env=env, stdout=logs, stderr=logs)
        reached = lambda: _cdc_reached(data_dir)  # noqa: E731
    try:
        with Positions(reached) as positions:
            _wait_first(positions, url)
            for rate in rates:
                point = _rate_point(url, pgbench, rate, minutes, positions, lambda: _cpu(process.pid))
                result.points.append(point)
                print(
                    f"  {name:9} {rate:4d} tx/s  p50 {point.p50:6.1f} s  p99 {point.p99:6.1f} s  (first half p50 "
                    f"{point.early_p50:6.1f} s)  {'bounded' if point.bounded else 'NOT bounded'}  "
                    f"{point.cpu_per_1000:6.2f} CPU-s / 1,000 changes",
                    flush=True,
                )
                if not point.bounded:
                    break
        if name != "anchor":
            done = subprocess.run([str(BIN / "cdc"), "verify", "warehouse", "--no-sync"], env=env, capture_output=True, text=True)
            result.verdict = f"verify exit {done.returncode}: " + (done.stdout.strip().splitlines() or ["(no output)"])[-1]
    finally:
        _stop(process)
    return result


def scale_run(scale: int, rates: list[int], minutes: float, arms: list[str], vectors: bool) -> list[ArmResult]:
    server = LocalPostgres()
    url = server.start()
    work = Path(tempfile.mkdtemp(prefix=f"cdc-sustained-{scale}-"))
    capture_dir = work / "capture"
    capture_dir.mkdir()
    pgbench = str(server.bindir / "pgbench")
    subprocess.run([pgbench, "-i", "-q", "-s", str(scale), url], check=True, capture_output=True)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ALTER TABLE pgbench_history REPLICA IDENTITY FULL")
        # words for the search index (pgbench leaves the filler blank): a branch's name and the account's number
        conn.execute("UPDATE pgbench_accounts SET filler = 'branch' || bid || ' account ' || aid")
        conn.execute("VACUUM ANALYZE pgbench_accounts")
        conn.execute("CREATE TABLE sustained_probe (id int PRIMARY KEY, n bigint NOT NULL)")
        conn.execute("INSERT INTO sustained_probe VALUES (1, 0)")
    env = _env(url, capture_dir) | {"CDC_TABLES": ",".join([*TABLES, PROBE])}
    subprocess.run([str(BIN / "cdc"), "setup"], env=env, check=True, capture_output=True)
    capture = subprocess.Popen([str(BIN / "cdc"), "capture"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    results = []
    try:
        print(f"pgbench scale {scale} ({scale * 100_000:,} accounts), {minutes:g} min a rate; kept in {work}", flush=True)
        for name in arms:
            results.append(_arm(name, url, pgbench, capture_dir / "log", work, rates, minutes, vectors))
    finally:
        _stop(capture)
        server.stop()
    return results


def _ratio(value: float, anchor: float) -> str:
    return f"{value / anchor:.2f}x" if anchor and anchor == anchor and value == value else "n/a"


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.views_sustained")
    parser.add_argument("--scales", default="5,50", help="pgbench scales (100,000 accounts each)")
    parser.add_argument("--rates", default="25,50,100,200", help="pgbench transactions per second, ascending")
    parser.add_argument("--minutes", type=float, default=5.0, help="minutes per rate")
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--deletion-vectors", action="store_true", help="CDC_DELETION_VECTORS=true for the cdc arms")
    args = parser.parse_args(argv)
    rates = [int(r) for r in args.rates.split(",")]
    arms = [a for a in args.arms.split(",") if a]
    unknown = set(arms) - set(ARMS)
    if unknown:
        parser.error(f"unknown arm(s) {sorted(unknown)}: choose among {', '.join(ARMS)}")
    for scale in (int(s) for s in args.scales.split(",")):
        results = scale_run(scale, rates, args.minutes, arms, args.deletion_vectors)
        anchor = next((r for r in results if r.name == "anchor"), None)
        print(f"\nscale {scale}: highest rate sustained, and the last common rate's p50 and CPU against the anchor's")
        for result in results:
            line = f"  {result.name:9} sustained {result.sustained()} tx/s"
            if anchor is not None and result is not anchor:
                common = [(p, a) for p in result.points for a in anchor.points if a.rate == p.rate]
                if common:
                    p, a = common[-1]
                    line += f"; at {p.rate} tx/s p50 {_ratio(p.p50, a.p50)}, CPU {_ratio(p.cpu_per_1000, a.cpu_per_1000)}"
            print(line + (f"; {result.verdict}" if result.verdict else ""), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
