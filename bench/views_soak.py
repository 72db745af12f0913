"""Soak: capture and ``cdc sync --continuous`` as services under a steady pgbench load, sampled over time,
with view-table maintenance on and, in a second run beside it, off.

Usage: python -m bench.views_soak [minutes] [transactions_per_second] [scale] [--sample S] [--only on|off]
[--vacuum-hours H] [--deletion-vectors]
(default 60 minutes a run, 100 tx/s, pgbench scale 5 (500,000 accounts), a sample every 60 s; both runs;
copy-on-write view tables unless ``--deletion-vectors``)

Each run is a fresh PostgreSQL (``pgbench -i``, ``pgbench_history`` given ``REPLICA IDENTITY FULL``: a
keyless table), ``cdc setup``, then ``cdc capture`` and ``cdc sync --continuous`` as processes (every
view of the views file below: the warehouse's current and history tables of the four pgbench tables and
a cache entity over the accounts), then ``pgbench -n -c 2 -R RATE -T ...`` (tpcb-like: three updates
and an insert into the keyless history a transaction). Every sample prints:

- lag: the views' ``seconds_behind`` (``cdc lag --json``), read every 10 s, p50 and p99 of the sample;
- RSS of capture's process (and the part of it no file backs) and of sync's process with its JVM;
- files and Delta version of the largest current and history tables, the log's and the views' bytes
  on disk;
- the time ``deltalake`` takes to read the largest current table whole (through its ``QueryBuilder``, which
  applies deletion vectors).

Vacuum removes a replaced file only once it is older than ``CDC_VACUUM_RETENTION_HOURS`` (``--vacuum-hours``,
default here 1, the least it takes; 168 by default in the product), so the views' bytes on disk can level
off only in a run longer than that: in a shorter one the files and the read time show what compaction
does, and the bytes what the retention keeps.

At the end the load stops, ``cdc wait`` lets the views reach the source's last LSN, and ``cdc verify``
compares them with the source. Then each figure's slope over the second half of the run is printed per
hour and as a share of its mean (flat: within the noise of its samples), for the run with maintenance
beside the run without. Prints figures only; it asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import psycopg

from local_servers.postgres import LocalPostgres

ROOT = Path(__file__).resolve().parents[1]
CDC = str(ROOT / ".venv" / "bin" / "cdc")
VIEWS = """
[warehouse]
tables = ["public.pgbench_accounts", "public.pgbench_branches", "public.pgbench_tellers", "public.pgbench_history"]

[cache.account]
root = "public.pgbench_accounts"
"""
FIGURES = ("lag_p50_s", "lag_p99_s", "capture_rss_mb", "capture_anon_mb", "sync_rss_mb", "current_files", "history_files",
           "current_version", "log_mb", "views_mb", "read_s")  # fmt: skip


@dataclass
class Sample:
    minute: float
    figures: dict[str, float] = field(default_factory=dict)


def _rss_mb(pid: int, field: str = "VmRSS") -> float:
    """Resident memory of ``pid`` and every process below it, in MB (from /proc; ``field``: ``VmRSS``, or
    ``RssAnon`` for the part no file backs: what a leak would grow)."""
    total, pending = 0, [pid]
    while pending:
        current = pending.pop()
        try:
            for line in Path(f"/proc/{current}/status").read_text().splitlines():
                if line.startswith(f"{field}:"):
                    total += int(line.split()[1])
            for task in Path(f"/proc/{current}/task").iterdir():
                pending.extend(int(child) for child in (task / "children").read_text().split())
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total / 1024


def _bytes_mb(directory: Path) -> float:
    return sum(f.stat().st_size for f in directory.rglob("*") if f.is_file()) / (1 << 20) if directory.exists() else 0.0


def _lag(env: dict[str, str]) -> dict[str, object]:
    done = subprocess.run([CDC, "lag", "--json"], env=env, capture_output=True, timeout=120)
    return orjson.loads(done.stdout) if done.stdout.strip() else {}


def _read_seconds(path: Path) -> float:
    from derived_views.engine.delta_reads import read_query  # QueryBuilder: reads a table with deletion vectors too

    started = time.perf_counter()
    read_query(str(path), "SELECT * FROM t")
    return time.perf_counter() - started


def _sample(env: dict[str, str], data_dir: Path, capture: int, sync: int, lags: list[float], minute: float) -> Sample:
    report = _lag(env)
    tables = {str(t["table"]): t for t in report.get("tables", [])}  # type: ignore[attr-defined]
    current = tables.get("warehouse/current/public.pgbench_accounts", {})
    history = tables.get("warehouse/history/public.pgbench_accounts", {})
    ordered = sorted(lags) or [0.0]
    sample = Sample(minute)
    sample.figures = {
        "lag_p50_s": statistics.median(ordered),
        "lag_p99_s": ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))],
        "capture_rss_mb": _rss_mb(capture),
        "capture_anon_mb": _rss_mb(capture, "RssAnon"),
        "sync_rss_mb": _rss_mb(sync),
        "current_files": float(current.get("files") or 0),
        "history_files": float(history.get("files") or 0),
        "current_version": float(current.get("version") or 0),
        "log_mb": _bytes_mb(data_dir / "log"),
        "views_mb": sum(_bytes_mb(data_dir / view) for view in ("warehouse", "cache")),
        "read_s": _read_seconds(data_dir / "warehouse" / "current" / "public.pgbench_accounts") if current else 0.0,
    }
    return sample


def _views_seconds_behind(env: dict[str, str]) -> float:
    views = _lag(env).get("views", [])
    return max((float(v["seconds_behind"] or 0) for v in views), default=0.0)  # type: ignore[attr-defined]


def _caught_up(env: dict[str, str], url: str, timeout_s: float = 1800.0) -> int:
    """Wait until the warehouse holds every commit made so far (``cdc wait``, tried again while capture has
    not created the log yet); the exit status of the last ``cdc wait``."""
    with psycopg.connect(url, autocommit=True) as conn:
        lsn = str(conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0])  # type: ignore[index]
    deadline = time.monotonic() + timeout_s
    while True:
        waited = subprocess.run([CDC, "wait", "warehouse", "--lsn", lsn, "--timeout", "60"], env=env, capture_output=True)
        if waited.returncode == 0 or time.monotonic() > deadline:
            return waited.returncode
        time.sleep(1.0)  # the log or the views not made yet: `cdc wait` refuses at once


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(120)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def soak(
    maintenance: bool, minutes: float, rate: int, scale: int, sample_s: float, vacuum_hours: float, deletion_vectors: bool
) -> tuple[list[Sample], str]:
    """One run; returns its samples and the verify's verdict."""
    server = LocalPostgres()
    url = server.start()
    data_dir = Path(tempfile.mkdtemp(prefix="cdc-soak-"))
    views_file = data_dir.parent / f"{data_dir.name}.views.toml"
    views_file.write_text(VIEWS)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CDC_")}
    env.update(
        CDC_DATABASE_URL=url,
        CDC_DATA_DIR=str(data_dir),
        CDC_VIEWS_FILE=str(views_file),
        CDC_MAINTENANCE="true" if maintenance else "false",
        CDC_MAINTENANCE_INTERVAL_S=str(min(300.0, max(30.0, minutes * 60 / 12))),
        CDC_VACUUM_RETENTION_HOURS=str(vacuum_hours),
        CDC_DELETION_VECTORS="true" if deletion_vectors else "false",
    )
    pgbench = str(server.bindir / "pgbench")
    subprocess.run([pgbench, "-i", "-q", "-s", str(scale), url], check=True, capture_output=True)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ALTER TABLE pgbench_history REPLICA IDENTITY FULL")
    subprocess.run([CDC, "setup"], env=env, check=True, capture_output=True)
    logs = data_dir.parent / f"{data_dir.name}.logs"
    logs.mkdir()
    capture = subprocess.Popen([CDC, "capture"], env=env, stdout=subprocess.DEVNULL, stderr=(logs / "capture").open("wb"))
    sync = subprocess.Popen([CDC, "sync", "--continuous"], env=env, stdout=subprocess.DEVNULL, stderr=(logs / "sync").open("wb"))
    samples: list[Sample] = []
    verdict = "not run"
    try:
        if _caught_up(env, url):
            raise RuntimeError(f"the first sync did not end: see {logs}")
        load = subprocess.Popen(
            [pgbench, "-n", "-c", "2", "-R", str(rate), "-T", str(int(minutes * 60)), url],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        started = time.monotonic()
        while load.poll() is None:
            lags: list[float] = []
            next_sample = time.monotonic() + sample_s
            while time.monotonic() < next_sample and load.poll() is None:
                lags.append(_views_seconds_behind(env))
                time.sleep(max(0.0, min(10.0, next_sample - time.monotonic())))
            sample = _sample(env, data_dir, capture.pid, sync.pid, lags, (time.monotonic() - started) / 60)
            samples.append(sample)
            shown = "  ".join(f"{k}={v:.1f}" for k, v in sample.figures.items())
            print(f"[{'on' if maintenance else 'off'}] {sample.minute:5.1f} min  {shown}", flush=True)
        waited = _caught_up(env, url)
        done = subprocess.run([CDC, "verify", "warehouse", "--no-sync"], env=env, capture_output=True, text=True)
        verdict = (
            f"wait exit {waited}, verify exit {done.returncode}: " + (done.stdout.strip().splitlines() or ["(no output)"])[-1]
        )
    finally:
        _stop(sync)
        _stop(capture)
        server.stop()
        print(f"[{'on' if maintenance else 'off'}] data kept in {data_dir}, service logs in {logs}", flush=True)
    return samples, verdict


def slope_per_hour(samples: list[Sample], figure: str) -> tuple[float, float]:
    """Least-squares slope of ``figure`` over the second half of ``samples`` (per hour) and the mean."""
    half = samples[len(samples) // 2 :]
    if len(half) < 2:
        return 0.0, half[0].figures[figure] if half else 0.0
    xs = [s.minute / 60 for s in half]
    ys = [s.figures[figure] for s in half]
    slope = statistics.linear_regression(xs, ys).slope
    return slope, statistics.fmean(ys)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.views_soak")
    parser.add_argument("minutes", type=float, nargs="?", default=60.0)
    parser.add_argument("rate", type=int, nargs="?", default=100, help="pgbench transactions per second")
    parser.add_argument("scale", type=int, nargs="?", default=5, help="pgbench scale (100,000 accounts each)")
    parser.add_argument("--sample", type=float, default=60.0, help="seconds between samples")
    parser.add_argument("--only", choices=("on", "off"), help="one run: maintenance on or off")
    parser.add_argument(
        "--vacuum-hours",
        type=float,
        default=1.0,
        help="CDC_VACUUM_RETENTION_HOURS (at least 1): vacuum removes replaced files only once older, so the views' "
        "bytes can level off only in a run longer than this",
    )
    parser.add_argument("--deletion-vectors", action="store_true", help="CDC_DELETION_VECTORS=true for the view tables")
    args = parser.parse_args(argv)
    minutes, rate, scale = args.minutes, args.rate, args.scale
    runs = {label: flag for label, flag in (("on", True), ("off", False)) if args.only in (None, label)}
    results = {
        label: soak(flag, minutes, rate, scale, args.sample, args.vacuum_hours, args.deletion_vectors)
        for label, flag in runs.items()
    }
    vectors = ", deletion vectors" if args.deletion_vectors else ""
    print(f"\n{minutes:g} min a run at {rate} tx/s, pgbench scale {scale}{vectors}; slope over the second half, per hour")
    print(f"{'figure':16}" + "".join(f"{'maintenance ' + label:>34}" for label in results))
    for figure in FIGURES:
        cells = []
        for samples, _ in results.values():
            slope, mean = slope_per_hour(samples, figure)
            share = f"{slope / mean:+.0%}" if mean else "n/a"
            cells.append(f"{slope:+12.2f}/h (mean {mean:9.1f}, {share:>6})")
        print(f"{figure:16}" + "".join(f"{c:>34}" for c in cells))
    for label, (_, verdict) in results.items():
        print(f"maintenance {label}: {verdict}")


if __name__ == "__main__":
    main(sys.argv[1:])
