"""Cost follows the change, not the table: the same changed rows synced into a 1M-row and a 10M-row view.

Usage: python -m bench.views_scale [--small N] [--large N] [--changed N] [--rounds N] [--deletion-vectors]
(defaults 1,000,000 / 10,000,000 / 10,000 / 3; ``--deletion-vectors``: the opt-in layout,
``CDC_DELETION_VECTORS=true``)

One throwaway PostgreSQL holds two narrow tables (id bigint primary key, price numeric(12,2), name text
of about 14 bytes), ``items_small`` with ``--small`` rows and ``items_large`` with ``--large`` rows,
filled by the server (``INSERT ... SELECT generate_series``). Both are captured into one log
(``Capture(once=True)``: the initial snapshot, timed) and synced into the warehouse's current tables
(:func:`derived_views.write.steps.apply_state` alone, as ``bench/views_sync.py`` does; the first sync
overwrites an empty table). Then, ``--rounds`` times, one source transaction updates ``--changed``
rows of each table, spread evenly over its keys (every (rows / changed)-th id, a different set each
round), is captured, and the change is synced into the small table, then into the large one. The
first round's small sync is the first MERGE of the process (a cold JVM); the figures are the warm
rounds' (the median of rounds 2..N), with the first printed too. Figures, side by side in one run:

- warm incremental sync at ``--large`` / at ``--small`` rows: target at most 1.5;
- full refresh of the large table (Spark JDBC read + Delta overwrite, :func:`bench.views_common.full_refresh`,
  its JDBC path warmed up on the small table first) / warm incremental sync at ``--large`` rows: target
  at least 10.

Each sync is split into reading the pending events (read, reduce, parse, checkpoint:
:func:`derived_views.write.steps.load_pending`), the MERGE (:func:`derived_views.write.scd1.merge_current`) and the
rest, and each MERGE's Delta commit metrics are printed (rows changed and copied, files replaced, scan and
rewrite times), so a figure off target shows where its time went. The machine's load average is printed
with each round: other work on the machine moves the figures a lot. Prints figures, asserts only row
counts.
"""

from __future__ import annotations

import argparse
import statistics
import time

import psycopg

from bench.capture_common import timed
from bench.views_common import (
    PhaseTimes,
    bench_spark,
    delta_commits,
    full_refresh,
    load_average,
    narrow_database,
    sync_current,
    table_size,
)
from cdc.config import view_arguments
from cdc.run.coordinator import Capture
from derived_views.views import warehouse
from derived_views.write import steps

SMALL, LARGE = "items_small", "items_large"
PHASES = ("read events", "MERGE")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=1_000_000, help="rows of the small table, default 1,000,000")
    parser.add_argument("--large", type=int, default=10_000_000, help="rows of the large table, default 10,000,000")
    parser.add_argument("--changed", type=int, default=10_000, help="rows each round changes in each table, default 10,000")
    parser.add_argument("--rounds", type=int, default=3, help="change rounds (the first is the cold one), default 3")
    parser.add_argument(
        "--deletion-vectors", action="store_true", help="the view tables use deletion vectors (CDC_DELETION_VECTORS=true)"
    )
    args = parser.parse_args()
    if not 0 < args.changed <= min(args.small, args.large):
        parser.error("--changed must be between 1 and the smaller table's rows")
    if args.rounds < 2:
        parser.error("--rounds must be at least 2 (the first runs on a cold JVM)")
    rows = {SMALL: args.small, LARGE: args.large}
    every = {table: count // args.changed for table, count in rows.items()}

    started = time.perf_counter()
    print(f"start: {load_average()}", flush=True)
    spark = bench_spark()
    phases = PhaseTimes({(steps, "load_pending"): "read events", (steps, "merge_current"): "MERGE"})
    # per round and table: (seconds, phases, MERGE commit lines, load average after)
    rounds: list[dict[str, tuple[float, dict[str, float], list[str], str]]] = []
    fill_start = time.perf_counter()
    with narrow_database(rows) as (_server, url, settings):
        filled = time.perf_counter() - fill_start
        settings = settings.model_copy(update={"deletion_vectors": args.deletion_vectors})
        with timed() as captured:
            Capture(settings, once=True).run()
        print(
            f"source filled and snapshot captured ({sum(rows.values()):,} rows in {captured[0]:.1f} s); {load_average()}",
            flush=True,
        )
        ctx = view_arguments.context_from_settings(settings, spark)
        paths = {table: warehouse.current_path(ctx, f"public.{table}") for table in rows}
        versions, first_sync = {}, {}
        for table in rows:
            with timed() as elapsed:
                sync_current(ctx, f"public.{table}")
            first_sync[table] = elapsed[0]
            versions[table], _, _ = delta_commits(spark, paths[table], -1)
            print(f"first sync of {table} ({rows[table]:,} rows): {elapsed[0]:.1f} s; {load_average()}", flush=True)
        sizes = {table: table_size(spark, path) for table, path in paths.items()}
        for round_ in range(args.rounds):
            changed = {}
            with psycopg.connect(url) as conn:  # one source transaction changes both tables
                for table in rows:
                    changed[table] = conn.execute(
                        f"UPDATE {table} SET price = price + 1, name = name || '+' WHERE id % {every[table]} = {round_}"
                    ).rowcount
            Capture(settings, once=True).run()
            results = {}
            for table in rows:
                phases.take()
                with timed() as elapsed:
                    sync_current(ctx, f"public.{table}")
                spent = phases.take()
                versions[table], written, commits = delta_commits(spark, paths[table], versions[table])
                assert written == changed[table], (table, written, changed[table])
                results[table] = (elapsed[0], spent, commits, load_average())
            rounds.append(results)
            print(
                f"round {round_ + 1}: " + ", ".join(f"{t} {r[0]:.2f} s" for t, r in results.items()) + f"; {load_average()}",
                flush=True,
            )
        refresh_paths = {table: str(settings.data_dir / "full_refresh" / table) for table in rows}
        full_refresh(spark, url, f"public.{SMALL}", refresh_paths[SMALL], rows[SMALL])  # warm-up: the JDBC path's first run
        refresh = {}
        for table in rows:
            with timed() as elapsed:
                full_refresh(spark, url, f"public.{table}", refresh_paths[table], rows[table])
            refresh[table] = (elapsed[0], load_average())
            print(f"full refresh of {table}: {elapsed[0]:.1f} s; {refresh[table][1]}", flush=True)
        for table in rows:
            for path in (paths[table], refresh_paths[table]):
                count = spark.read.format("delta").load(path).count()
                assert count == rows[table], (path, count)
    wall = time.perf_counter() - started

    layout = "deletion vectors" if args.deletion_vectors else "copy-on-write (default, no deletion vectors)"
    print(
        f"rows: small={args.small:,} large={args.large:,}; changed per round and table: {args.changed:,} "
        f"(every {every[SMALL]:,}th / {every[LARGE]:,}th id); layout: {layout}"
    )
    print(
        f"source filled in {filled:.0f} s, snapshot captured in {captured[0]:.1f} s; "
        + "; ".join(f"first sync of {t}: {first_sync[t]:.1f} s, {sizes[t][0]} files, {sizes[t][1] / 1e6:,.1f} MB" for t in rows)
    )
    print(f"{'round':<12} {'table':<12} {'sync s':>8} " + " ".join(f"{p:>12}" for p in (*PHASES, "rest")) + "   load after")
    for number, results in enumerate(rounds, 1):
        for table, (seconds, spent, _, load) in results.items():
            label = f"{number} (cold)" if number == 1 else str(number)
            print(
                f"{label:<12} {table:<12} {seconds:8.2f} "
                + " ".join(f"{spent.get(p, 0.0):12.2f}" for p in PHASES)
                + f" {seconds - sum(spent.values()):12.2f}   {load}"
            )
    print("MERGE commits of the last round:")
    for table, (_, _, commits, _) in rounds[-1].items():
        print(f"  {table}: {'; '.join(commits)}")
    warm = {table: statistics.median(r[table][0] for r in rounds[1:]) for table in rows}
    cold = {table: rounds[0][table][0] for table in rows}
    print(f"incremental sync, first change of each table: small {cold[SMALL]:.2f} s (cold JVM), large {cold[LARGE]:.2f} s")
    print(
        f"incremental sync, warm (median of rounds 2-{args.rounds}): small {warm[SMALL]:.2f} s, large {warm[LARGE]:.2f} s"
        f"   -> large/small = {warm[LARGE] / warm[SMALL]:.2f} (target <= 1.5)"
    )
    print(
        f"full refresh (JDBC read + Delta overwrite, JDBC warmed up): small {refresh[SMALL][0]:.2f} s, "
        f"large {refresh[LARGE][0]:.2f} s"
    )
    print(
        f"at {args.large:,} rows: full refresh / warm incremental = {refresh[LARGE][0] / warm[LARGE]:.1f}x (target >= 10x); "
        f"at {args.small:,} rows: {refresh[SMALL][0] / warm[SMALL]:.1f}x"
    )
    print(f"wall time {wall / 60:.1f} min; end: {load_average()}")


if __name__ == "__main__":
    main()
