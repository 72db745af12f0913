"""``cdc verify`` of a warehouse table at 1M and 10M rows: its rate beside reading each side alone, and its
peak memory.

Usage: python -m bench.verify_scale [--rows N [N ...]] [--wide] [--profile FILE]
(default 1,000,000 10,000,000 rows)

For each size, a throwaway PostgreSQL holds one narrow table (id bigint primary key, price
numeric(12,2), name text of about 14 bytes), or with ``--wide`` one of 30 columns (integers, floats
with NaN, decimals, text, instants with and without zone, dates, booleans, uuids: about 400 bytes a
row, :data:`bench.views_common.WIDE_TABLE`), with N rows filled by the server, captured into the log
(``Capture(once=True)``) and synced into the warehouse's current table (the views file keeps no
history table, so the one table is compared). Then, side by side in one run:

- ``verify``: :func:`derived_views.runs.verify.verify` of the warehouse (what ``cdc verify warehouse
  --no-sync`` runs): both sides read and compared, the rate in rows of the table per second;
- the source alone: ``COPY (SELECT id, price, name FROM items) TO STDOUT`` of the same table through
  psycopg, its bytes thrown away (the server's own ceiling for one read of the table);
- the view alone: the same columns of the Delta table scanned with ``deltalake`` into Arrow batches,
  thrown away (no Python objects);
- this process's peak RSS during the verify (``VmHWM``, reset through ``/proc/self/clear_refs`` right
  before it) and its RSS before it: the verify's own memory is the difference. Flat in the table's size
  is the target, and at least 200,000 rows/s.

The machine's load average is printed with each figure: other work on the machine moves the rates a lot.
``--profile FILE`` writes a cProfile of each verify to ``FILE.<rows>`` (read it with ``python -m pstats``;
the rate is then lower). Prints figures, asserts only that the verify found the view equal to the source.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import time
from pathlib import Path

import psycopg

from bench.capture_common import timed
from bench.views_common import load_average, narrow_database, sync_current
from bench.views_memory import _reset_peak_rss, _status_kb
from cdc.run.coordinator import Capture


def _copy_seconds(url: str) -> float:
    """Seconds to read the table through ``COPY ... TO STDOUT``, its bytes thrown away."""
    with psycopg.connect(url) as conn, timed() as elapsed:
        with conn.cursor().copy("COPY (SELECT * FROM items) TO STDOUT") as copy:
            for _ in copy:
                pass
    return elapsed[0]


def _scan_seconds(path: str) -> float:
    """Seconds to scan the view table's columns with ``deltalake`` into Arrow batches, thrown away."""
    from derived_views.engine.delta_reads import stream_query

    with timed() as elapsed:
        for _ in stream_query(path, "SELECT * FROM t"):
            pass
    return elapsed[0]


def _one_size(rows: int, wide: bool, profile: str | None) -> dict[str, float]:
    from cdc.config import view_arguments
    from cdc.config.settings import load_settings
    from derived_views.runs import runner
    from derived_views.runs.verify import verify
    from derived_views.views import warehouse

    with narrow_database({"items": rows}, wide=wide) as (_server, url, settings):
        views_file = Path(settings.data_dir) / "views.toml"
        views_file.write_text('[warehouse]\nwithout_history = ["public.items"]\n')
        settings = load_settings(
            database_url=url, data_dir=str(settings.data_dir), tables="public.items", views_file=str(views_file)
        )
        with timed() as captured:
            Capture(settings, once=True).run()
        ctx = view_arguments.context_from_settings(settings)
        with timed() as synced:
            sync_current(ctx, "public.items")
        print(f"{rows:,} rows: captured in {captured[0]:.1f} s, synced in {synced[0]:.1f} s; {load_average()}", flush=True)
        watermark = runner.latest(ctx)
        assert watermark is not None
        path = warehouse.current_path(ctx, "public.items")
        copy_s, scan_s = _copy_seconds(url), _scan_seconds(path)
        before = _status_kb(os.getpid(), "VmRSS")
        _reset_peak_rss(os.getpid())
        profiler = cProfile.Profile() if profile else None
        with timed() as verified:
            if profiler is not None:
                profiler.enable()
            report = verify(ctx, "warehouse", url, watermark)
            if profiler is not None:
                profiler.disable()
        peak = _status_kb(os.getpid(), "VmHWM")
        if profiler is not None:
            profiler.dump_stats(f"{profile}.{rows}")
        assert report.ok and report.compared == rows, (report.compared, report.differences[:5])
        ctx.spark.stop()
        return {
            "verify_s": verified[0],
            "copy_s": copy_s,
            "scan_s": scan_s,
            "rss_before_mb": before / 1024,
            "peak_mb": peak / 1024,
            "load": os.getloadavg()[0],
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 10_000_000], help="table sizes, one run each")
    parser.add_argument("--wide", action="store_true", help="a table of 30 columns of many types, not the narrow one")
    parser.add_argument("--profile", metavar="FILE", help="write a cProfile of each verify to FILE.<rows>")
    args = parser.parse_args()
    started = time.perf_counter()
    print(f"{'wide' if args.wide else 'narrow'} table", flush=True)
    results = {rows: _one_size(rows, args.wide, args.profile) for rows in args.rows}
    print(f"wall time {(time.perf_counter() - started) / 60:.1f} min")
    for rows, f in results.items():
        print(
            f"{rows:>11,} rows: verify {rows / f['verify_s']:>9,.0f} rows/s ({f['verify_s']:.1f} s) | "
            f"source alone (COPY TO STDOUT) {rows / f['copy_s']:>10,.0f} rows/s | "
            f"view alone (deltalake scan) {rows / f['scan_s']:>10,.0f} rows/s"
        )
        print(
            f"{'':>11}  peak RSS during verify {f['peak_mb']:.0f} MB (before it {f['rss_before_mb']:.0f} MB: "
            f"+{f['peak_mb'] - f['rss_before_mb']:.0f} MB); load average at the end {f['load']:.2f}"
        )


if __name__ == "__main__":
    main()
