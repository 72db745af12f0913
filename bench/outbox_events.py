"""Outbox events through capture beside row changes of the same volume, in one run on one server.

Usage: .venv/bin/python -m bench.outbox_events [events]   (default 200,000).

Both workloads write ``events`` events in transactions of 1,000, then one capture (``--once``) streams them
into the durable log, timed from its start to its exit:

* ``row changes`` (the anchor): ``INSERT`` of rows ``(id, name, amount)`` into table ``bench``;
* ``outbox messages``: ``pg_logical_emit_message(true, 'cdc.outbox.bench', <JSON of the same id, name and
  amount>)``, keyed by ``id`` (``CDC_OUTBOX_KEY_FIELD``);
* ``outbox table``: rows of a Debezium-style outbox table (``id uuid, aggregatetype, aggregateid, type,
  payload jsonb``, the same JSON), routed to ``cdc.outbox.Bench`` (``[outbox."public.outbox"]``).

It prints events per second of each and the ratio of each form to row changes (above 1: an event costs
less than a row change).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import psycopg

from bench.capture_common import bench_database, insert_rows, timed
from cdc.config.settings import Settings
from cdc.run.coordinator import Capture

PER_TRANSACTION = 1000
OUTBOX_TABLE = "CREATE TABLE outbox (id uuid PRIMARY KEY, aggregatetype text, aggregateid text, type text, payload jsonb)"


def emit_messages(url: str, events: int) -> None:
    """``events`` outbox messages in transactions of :data:`PER_TRANSACTION`, one JSON object each."""
    with psycopg.connect(url, autocommit=True) as conn:
        for first in range(1, events + 1, PER_TRANSACTION):
            conn.execute(
                "SELECT count(pg_logical_emit_message(true, 'cdc.outbox.bench', "
                "json_build_object('id', g, 'name', 'name ' || g, 'amount', g * 1.25)::text)) "
                "FROM generate_series(%s::bigint, %s::bigint) g",
                (first, min(first + PER_TRANSACTION - 1, events)),
            )


def insert_outbox_rows(url: str, events: int) -> None:
    """``events`` rows of the outbox table in transactions of :data:`PER_TRANSACTION`."""
    with psycopg.connect(url, autocommit=True) as conn:
        for first in range(1, events + 1, PER_TRANSACTION):
            conn.execute(
                "INSERT INTO outbox SELECT gen_random_uuid(), 'Bench', g::text, 'Created', "
                "json_build_object('id', g, 'name', 'name ' || g, 'amount', g * 1.25) "
                "FROM generate_series(%s::bigint, %s::bigint) g",
                (first, min(first + PER_TRANSACTION - 1, events)),
            )


def captured(settings: Settings, events: int) -> float:
    """Seconds one capture takes to stream the ``events`` waiting events into the log."""
    with timed() as seconds:
        stats = Capture(settings, once=True).run()
    assert stats.events == events, f"captured {stats.events} events of {events}"
    return seconds[0]


def main(events: int) -> None:
    with bench_database() as (_, url, settings), tempfile.TemporaryDirectory() as scratch:
        views = Path(scratch) / "views.toml"
        views.write_text('[outbox."public.outbox"]\n')
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(OUTBOX_TABLE)
            conn.execute("ALTER PUBLICATION cdc_publication ADD TABLE outbox")
        tables = "public.bench,public.outbox"
        settings = settings.model_copy(update={"outbox_key_field": "id", "views_file": views, "tables": tables.split(",")})
        Capture(settings, once=True).run()  # empty snapshot; the slot sits before the workloads
        insert_rows(url, events, PER_TRANSACTION)
        rows = captured(settings, events)
        emit_messages(url, events)
        messages = captured(settings, events)
        insert_outbox_rows(url, events)
        table = captured(settings, events)
    print(f"events={events:,} in transactions of {PER_TRANSACTION:,}, one capture --once each, same server and log")
    print(f"{'row changes (anchor)':<24}{events / rows:>14,.0f} ev/s{rows:>10.2f} s")
    print(f"{'outbox messages':<24}{events / messages:>14,.0f} ev/s{messages:>10.2f} s")
    print(f"{'outbox table':<24}{events / table:>14,.0f} ev/s{table:>10.2f} s")
    print(f"{'ratio messages / rows':<24}{rows / messages:>14.2f}")
    print(f"{'ratio table / rows':<24}{rows / table:>14.2f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 200_000)
