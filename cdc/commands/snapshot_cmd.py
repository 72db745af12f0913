"""``cdc snapshot``: ask the running capture (or the next one) to read tables again, and show reads under way.

The request travels through PostgreSQL (:mod:`cdc.capture.snapshot_requests`): no shell on the capture
host, no stop. The status is read from the log: each chunk of a read by key carries a progress record.
"""

from __future__ import annotations

import time

import click
import orjson

from cdc.capture.errors import ConfigError, SourceError
from cdc.capture.snapshot_requests import PREFIX, SnapshotRequest
from cdc.cli import pass_context
from cdc.settings import Settings


@click.command("snapshot")
@click.argument("tables", nargs=-1)
@click.option("--status", is_flag=True, help="Show the reads under way: rows done, estimated, rate, ETA.")
@click.option("--json", "as_json", is_flag=True, help="With --status: one JSON object per read.")
@pass_context
def snapshot(ctx: object, tables: tuple[str, ...], status: bool, as_json: bool) -> None:
    """Read TABLE... (schema.table) again beside the stream, as op=r events; or show reads under way."""
    settings: Settings = ctx.settings  # type: ignore[attr-defined]
    if status:
        for read in read_status(settings):
            click.echo(orjson.dumps(read).decode() if as_json else _status_line(read))
        return
    if not tables:
        raise ConfigError("name at least one table to read again (schema.table), or ask for --status")
    lsn = request_snapshot(settings, tables)
    click.echo(f"asked capture to read {', '.join(tables)} again (request at LSN {lsn})")


def request_snapshot(settings: Settings, tables: tuple[str, ...]) -> str:
    """Emit the request for ``tables`` (each a published table capture includes); its LSN."""
    import psycopg

    from cdc.capture.catalog import Catalog

    catalog = Catalog(settings.database_url)
    try:
        published = {t.log_name for t in catalog.published_tables(settings.publication)}
    finally:
        catalog.close()
    included = set(settings.tables)
    for name in tables:
        if name not in published or (included and name not in included):
            raise ConfigError(
                f"{name} is not a table capture reads: name a table of publication {settings.publication} "
                f"as schema.table{' that CDC_TABLES includes' if included else ''}"
            )
    try:
        with psycopg.connect(settings.database_url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT pg_logical_emit_message(true, %s, %s::bytea)::text",
                (PREFIX, SnapshotRequest(tuple(tables)).content()),
            ).fetchone()
    except psycopg.Error as exc:
        raise SourceError(f"cannot send the request: {str(exc).strip().splitlines()[0]}") from None
    return str(row[0]) if row else "?"


def read_status(settings: Settings) -> list[dict[str, object]]:
    """The reads under way as the log's progress records hold them (their layout: the ledger's,
    :class:`~cdc.capture.table_snapshots.ReadProgress`): table, rows done, rows estimated (the
    source's statistics), rows per second and seconds left (over the current run of the read)."""
    from cdc.log_backend import open_log
    from log_store import TopicPartition

    topic = f"{settings.topic_prefix}.__snapshots"
    runs: dict[str, list[tuple[int, int, int]]] = {}  # name -> (boundary, rows, ts) of its progress records
    with open_log(settings) as log:
        if topic not in log.topics():
            return []
        partition = TopicPartition(topic, 0)
        offset = log.start_offset(partition)
        while batch := log.read(partition, offset):
            for record in batch:
                name = orjson.loads(record.key) if record.key else None
                if isinstance(name, list):
                    if record.value is None:
                        runs.pop(str(name[1]), None)
                    else:
                        value = orjson.loads(record.value)
                        runs.setdefault(str(name[1]), []).append((value["boundary"], value["rows"], record.timestamp_ms))
            offset = batch[-1].offset + 1
    out = []
    for name, records in sorted(runs.items()):
        boundary, rows, last_ts = records[-1]
        current = [r for r in records if r[0] == boundary]
        first_rows, first_ts = current[0][1], current[0][2]
        rate = (rows - first_rows) * 1000 / (last_ts - first_ts) if last_ts > first_ts else None
        estimate = _estimate(settings, name)
        left = (max(estimate - rows, 0) / rate) if rate and estimate else None
        out.append(
            {"table": name, "rows": rows, "estimated_rows": estimate, "rows_per_second": rate, "eta_seconds": left,
             "last_chunk_age_seconds": max(0.0, time.time() - last_ts / 1000)}
        )  # fmt: skip
    return out


def _estimate(settings: Settings, name: str) -> int | None:
    import psycopg

    try:
        with psycopg.connect(settings.database_url) as conn:
            row = conn.execute("SELECT reltuples::bigint FROM pg_class WHERE oid = to_regclass(%s)", (name,)).fetchone()
    except psycopg.Error:
        return None
    return int(row[0]) if row and row[0] is not None and row[0] >= 0 else None


def _status_line(read: dict[str, object]) -> str:
    rows, estimate, rate, left = read["rows"], read["estimated_rows"], read["rows_per_second"], read["eta_seconds"]
    done = f"{rows}/{estimate} rows" if estimate else f"{rows} rows"
    speed = f", {float(rate):,.0f} rows/s" if isinstance(rate, float) else ""
    eta = f", about {float(left):.0f} s left" if isinstance(left, float) else ""
    return f"{read['table']}: {done}{speed}{eta}"
