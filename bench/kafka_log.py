"""The log in Kafka against the embedded log, in one run: capture throughput, and Spark reading 1M events.

Usage: python -m bench.kafka_log [rows]   (default 1,000,000 single-row inserts in 1,000-row transactions)

One throwaway PostgreSQL and one throwaway Kafka broker (KRaft, one node, on this machine). Two slots
sit before the workload, one per log, and a third for the anchor; then, on the same WAL range:

- ``pg_recvlogical`` decoding it with pgoutput into /dev/null (the walsender's ceiling, the anchor of
  ``bench/capture_streaming.py``);
- ``cdc capture --once`` into the embedded log (fsync per group);
- ``cdc capture --once`` into Kafka (a transaction per group, acks=all, one broker on the same disk).

Then a Spark read of every event of the table, reduced per key as a rebuild reads it, into Spark's
``noop`` sink: through the ``cdclog`` source from the embedded log, and through Spark's Kafka source
from Kafka (each run twice, in one process; the second figure is the steady one).
"""

from __future__ import annotations

import sys

import psycopg

from bench.capture_common import bench_database, insert_rows, recvlogical_seconds, timed
from cdc.config.view_arguments import location_from_settings
from cdc.run.coordinator import Capture
from derived_views.engine.spark_session import build_spark
from derived_views.source.log_source import read_watermark
from derived_views.source.pending import read_log
from local_servers.kafka import LocalKafka


def main(rows: int) -> None:
    with bench_database() as (server, url, embedded), LocalKafka() as broker:
        kafka = embedded.model_copy(update={"log": f"kafka://{broker.bootstrap}", "slot": "kafka_slot"})
        for settings in (embedded, kafka):
            Capture(settings, once=True).run()  # an empty snapshot: the slot now sits before the workload
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("SELECT pg_create_logical_replication_slot('anchor', 'pgoutput')")
        insert_rows(url, rows, 1000)
        anchor = recvlogical_seconds(server, url, "anchor")
        rates = {}
        for name, settings in (("embedded log", embedded), ("Kafka", kafka)):
            with timed() as took:
                stats = Capture(settings, once=True).run()
            assert stats.events == rows, f"{name}: {stats.events} events for {rows} rows"
            rates[name] = (stats.events / took[0], took[0])
        anchor_rate = rows / anchor
        print(f"rows={rows} transactions={rows // 1000}")
        print(f"pg_recvlogical anchor      : {anchor_rate:>12,.0f} rows/s   ({anchor:.1f} s)")
        for name, (rate, seconds) in rates.items():
            print(f"capture into {name:<14}: {rate:>12,.0f} events/s ({seconds:.1f} s)  {rate / anchor_rate:.2f} of the anchor")
        print(f"Kafka / embedded log       : {rates['Kafka'][0] / rates['embedded log'][0]:.2f}")

        spark = build_spark("cdc-bench-kafka")
        topic = f"{embedded.topic_prefix}.public.bench"
        reads: dict[str, list[float]] = {}
        for name, settings in (("cdclog source", embedded), ("Kafka source", kafka)):
            location = location_from_settings(settings)
            watermark = read_watermark(location, [topic])
            assert watermark is not None
            for _ in range(2):
                frame = read_log(spark, location, [topic], {}, watermark.offsets, reduce="latest")
                with timed() as took:
                    frame.write.format("noop").mode("overwrite").save()
                reads.setdefault(name, []).append(took[0])
        for name, seconds in reads.items():
            print(f"Spark read of {rows:,} events, {name:<13}: {seconds[1]:.2f} s (first run {seconds[0]:.2f} s)")
        print(f"Kafka source / cdclog source: {reads['Kafka source'][1] / reads['cdclog source'][1]:.2f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000)
