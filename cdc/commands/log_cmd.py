"""``cdc log``: list, describe, tail and compact the topics of the log.

The embedded log lives in ``<CDC_DATA_DIR>/log``; segment rolling, tombstone and retention limits come from
the ``CDC_SEGMENT_*`` / ``CDC_*_RETENTION_*`` settings. With ``CDC_LOG=kafka://...`` the topics are Kafka's:
``topics``, ``describe`` and ``tail`` read them (read-committed, up to the latest watermark), and Kafka
compacts them itself. Every command opens the log read-only, so it runs beside a running capture;
``compact --roll`` needs the writer lock (capture stopped).
"""

from __future__ import annotations

import base64
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from datetime import UTC, datetime
from typing import Any

import click
import orjson
from rich.console import Console
from rich.table import Table

from cdc.commands.interrupts import interrupt_on
from cdc.config.log_backend import open_log as open_settings_log
from cdc.config.settings import load_settings
from cdc.errors import ConfigError
from log_store import LogStore, Record, TopicPartition, Watermark
from log_store.errors import CorruptSegmentError, UnknownTopicError
from log_store.log import Log

log_group = click.Group("log", help="Inspect and maintain the log (<CDC_DATA_DIR>/log, or Kafka's topics).")


@contextmanager
def open_log(*, writer: bool = False) -> Iterator[Log]:
    """Open the log of the current settings (read-only unless ``writer``)."""
    log = open_settings_log(load_settings(), writer=writer)
    try:
        yield log
    finally:
        log.close()


def render_bytes(data: bytes | None) -> Any:
    """A key or value for JSON output: parsed JSON, else UTF-8 text, else ``{"base64": ...}``."""
    if data is None:
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(data).decode("ascii")}
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return text


def render_record(record: Record) -> bytes:
    """One JSON line for ``cdc log tail``."""
    line: dict[str, Any] = {
        "topic": record.topic,
        "partition": record.partition,
        "offset": record.offset,
        "key": render_bytes(record.key),
        "value": render_bytes(record.value),
        "timestamp": record.timestamp_ms,
    }
    if record.headers:
        line["headers"] = {name: render_bytes(value) for name, value in record.headers}
    return orjson.dumps(line)


def _format_time(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds")


@log_group.command("topics")
def topics_cmd() -> None:
    """List the topics, one per line."""
    with open_log() as log:
        for name in log.topics():
            click.echo(name)


@log_group.command("describe")
@click.argument("topic")
def describe_cmd(topic: str) -> None:
    """Partitions, offsets, segments, bytes, dirty ratio and the latest watermark of TOPIC.

    Every committed batch is checked (framing and CRC32C, as reads check them): a damaged partition is
    marked in the table and the command ends with the error of the first one, exit status 4.
    """
    damaged: list[CorruptSegmentError] = []
    with open_log() as log:
        config = log.topic_config(topic)
        rows = log.describe(topic)
        watermark = log.latest_watermark()
        if watermark is None:
            log.require_published_watermark()
        checks: list[str] = []
        for row in rows:
            try:
                log.verify(row.tp)
            except CorruptSegmentError as exc:
                damaged.append(exc)
                checks.append(f"corrupt at offset {exc.offset}")
            else:
                checks.append("ok")
    table = Table(title=f"{topic}  ({config.partitions} partition(s), {'compacted' if config.compacted else 'retention'})")
    kafka = isinstance(log.root, str)  # Kafka keeps segments, sizes and checks to itself
    columns = ("partition", "start offset", "end offset") + (() if kafka else ("segments", "bytes", "dirty ratio", "check"))
    for column in columns:
        table.add_column(column, justify="right")
    for row, check in zip(rows, checks, strict=True):
        ratio = "-" if row.dirty_ratio is None else f"{row.dirty_ratio:.2f}"
        cells = [str(row.tp.partition), str(row.start_offset), str(row.end_offset)]
        table.add_row(*cells if kafka else [*cells, str(row.segments), f"{row.bytes:,}", ratio, check])
    console = Console(width=140)
    console.print(table)
    if watermark is None:
        console.print("latest watermark: none (nothing committed yet)")
    else:
        console.print(
            f"latest watermark: #{watermark.sequence} at position {watermark.position} ({_format_time(watermark.timestamp_ms)})"
        )
    if damaged:
        raise damaged[0]


@log_group.command("tail")
@click.argument("topic")
@click.option("--from-beginning", is_flag=True, help="Start at the first stored offset, not the end.")
@click.option("--follow", "-f", is_flag=True, help="Keep printing new records until Ctrl-C.")
@click.option("--partition", "-p", "partition", type=int, default=None, help="Only this partition (default: all).")
@click.option(
    "--poll-interval",
    type=click.FloatRange(min=0.01),
    default=0.25,
    show_default=True,
    help="Seconds between checks of the watermark with --follow.",
)
@click.option("--max-records", type=click.IntRange(min=1), default=None, help="Stop after printing this many records.")
def tail_cmd(
    topic: str, from_beginning: bool, follow: bool, partition: int | None, poll_interval: float, max_records: int | None
) -> None:
    """Print TOPIC's committed records as JSON lines (topic, partition, offset, key, value, timestamp).

    Without --from-beginning it starts at the current end; with --follow it waits for new commit
    watermarks and prints their records, until Ctrl-C (SIGINT), SIGTERM or --max-records; either signal
    ends it with status 0, even when it was started with SIGINT ignored (as a shell starts a background
    job), in which case Python itself would never turn SIGINT into KeyboardInterrupt.
    """
    out = sys.stdout.buffer if hasattr(sys.stdout, "buffer") else None
    printed = 0
    try:
        with interrupt_on(signal.SIGINT, signal.SIGTERM) if follow else nullcontext(), open_log() as log:
            count = log.partitions(topic)
            if partition is not None and not 0 <= partition < count:
                raise UnknownTopicError(log.root, topic, partition, count)
            tps = [TopicPartition(topic, p) for p in range(count) if partition is None or p == partition]
            watermark = log.latest_watermark()
            if watermark is None:
                log.require_published_watermark()
            positions = {
                tp: (log.start_offset(tp) if from_beginning else (watermark.end_offset(tp) if watermark is not None else 0))
                for tp in tps
            }
            while True:
                if watermark is not None:
                    for tp in tps:
                        while True:
                            records = log.read(tp, positions[tp], max_records=1000, until=watermark)
                            if not records:
                                break
                            for record in records:
                                line = render_record(record) + b"\n"
                                if out is not None:
                                    out.write(line)
                                else:
                                    click.echo(line.decode("utf-8"), nl=False)
                                printed += 1
                                if max_records is not None and printed >= max_records:
                                    return
                            positions[tp] = records[-1].offset + 1
                    if out is not None:
                        out.flush()
                if not follow:
                    return
                watermark = _next_watermark(log, watermark, poll_interval)
    except KeyboardInterrupt:
        return
    except BrokenPipeError:
        sys.stderr.close()  # the reader went away (e.g. `| head`): stop quietly
        return
    finally:
        if out is not None:
            try:
                out.flush()
            except BrokenPipeError:
                pass


def _next_watermark(log: Log, current: Watermark | None, interval: float) -> Watermark | None:
    """Poll the published watermark every ``interval`` seconds until it moves past ``current``."""
    while True:
        latest = log.latest_watermark()
        if latest is not None and (current is None or latest.sequence != current.sequence):
            return latest
        time.sleep(interval)


@log_group.command("compact")
@click.argument("topic", required=False)
@click.option(
    "--roll",
    is_flag=True,
    help="First seal the active segments so that everything committed is compacted (needs the writer lock: stop capture first).",
)
def compact_cmd(topic: str | None, roll: bool) -> None:
    """Compact TOPIC (or every topic); topics that are not compacted get their retention applied."""
    if load_settings().uses_kafka:
        raise ConfigError(
            "the log is in Kafka (CDC_LOG), which compacts its topics itself (cleanup.policy=compact, "
            "the broker's log cleaner); `cdc log compact` applies to the embedded log only"
        )
    with open_log(writer=roll) as log:
        assert isinstance(log, LogStore)
        if roll:
            log.roll(topic)
        report = log.compact(topic)
    if not report.partitions:
        click.echo(
            "nothing to compact: no sealed segment below the watermark "
            "(use --roll with capture stopped to include the active segments)"
        )
        return
    for part in report.partitions:
        if not part.changed:
            click.echo(
                f"{part.tp.topic}[{part.tp.partition}]: unchanged ({part.records_read} record(s) read, "
                f"{part.bytes_before:,} bytes)"
            )
            continue
        click.echo(
            f"{part.tp.topic}[{part.tp.partition}]: {part.records_read} record(s) read, "
            f"{part.records_kept} kept, {part.tombstones_removed} tombstone(s) removed, "
            f"{part.folded} folded, {part.segments_rewritten} segment(s) rewritten, "
            f"{part.segments_deleted} deleted, {part.bytes_before:,} -> {part.bytes_after:,} "
            "bytes"
        )
