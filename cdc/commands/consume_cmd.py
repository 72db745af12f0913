"""``cdc log consume`` and ``cdc log groups``: read topics of the log as a consumer group.

``consume`` prints each committed record as one JSON line (the form of ``cdc log tail``) and commits the
group's offsets after each batch it printed and flushed, so a consumer stopped at any moment (even by
``kill -9``) prints again, when it starts again, only records of the batch it had not committed: at
least once, never a record skipped (:mod:`log_store.consumer`). ``groups`` shows every group's committed
offsets beside the end of each partition at the latest watermark, and the lag between them; with the
log in Kafka, Kafka's groups that committed offsets of the log's topics (:func:`log_store.kafka.consumer.committed_groups`),
their lag in Kafka's offsets. With the log in Kafka, ``consume`` is a member of the Kafka consumer group
(:mod:`log_store.kafka.consumer`, read-committed).
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable
from types import FrameType

import click
import orjson
from rich.console import Console
from rich.table import Table

from cdc.commands.log_cmd import open_log, render_record
from cdc.config.settings import load_settings
from log_store import LogStore, TopicPartition
from log_store.consumer import Consumer, Reset
from log_store.kafka.consumer import KafkaConsumer, committed_groups, open_consumer
from log_store.kafka.log import KafkaLog


@click.command("consume")
@click.argument("topics", nargs=-1, required=True)
@click.option("--group", "-g", required=True, help="The consumer group whose offsets are read and committed.")
@click.option(
    "--from",
    "reset",
    type=click.Choice(["earliest", "latest"]),
    default="earliest",
    show_default=True,
    help="Where a partition the group never committed starts.",
)
@click.option("--follow", "-f", is_flag=True, help="Keep waiting for new records until Ctrl-C or SIGTERM.")
@click.option("--max-records", type=click.IntRange(min=1), default=None, help="Stop after printing this many records.")
@click.option("--batch", type=click.IntRange(min=1), default=500, show_default=True, help="Records per commit.")
@click.option(
    "--poll-interval",
    type=click.FloatRange(min=0.01),
    default=0.5,
    show_default=True,
    help="Seconds a poll waits for new records with --follow.",
)
def consume(
    topics: tuple[str, ...], group: str, reset: Reset, follow: bool, max_records: int | None, batch: int, poll_interval: float
) -> None:
    """Print the committed records of TOPICS as JSON lines for consumer group GROUP, committing as it goes.

    It starts at the group's committed offsets and ends when it has printed everything up to the latest
    watermark (with --follow: it waits for more). Each batch is committed once printed and flushed.
    """
    settings = load_settings()
    # caught up: at once on the embedded log; Kafka's consumer says when its partitions are read to the end
    caught_up_within = settings.kafka_timeout_ms / 1000 if settings.uses_kafka else 0.0
    out = sys.stdout.buffer
    printed = 0
    with open_log() as log:
        consumer = open_consumer(log, group, reset=reset)
        consumer.subscribe(list(topics))
        previous = signal.signal(signal.SIGTERM, _woken(consumer))
        try:
            while (max_records is None or printed < max_records) and not consumer.woken:
                wanted = batch if max_records is None else min(batch, max_records - printed)
                records = consumer.poll(max_records=wanted, timeout_s=poll_interval if follow else caught_up_within)
                if not records:
                    if not follow:
                        return
                    continue
                out.write(b"".join(render_record(record) + b"\n" for record in records))
                out.flush()
                consumer.commit()  # after the lines are out: a stop before it prints them again, skips none
                printed += len(records)
        except KeyboardInterrupt:
            return
        except BrokenPipeError:
            sys.stderr.close()  # the reader went away: what it did not take is not committed
            return
        finally:
            signal.signal(signal.SIGTERM, previous)
            consumer.close()


def _woken(consumer: Consumer | KafkaConsumer) -> Callable[[int, FrameType | None], None]:
    """A SIGTERM handler that ends ``consume`` after the batch under way."""

    def handler(signum: int, frame: FrameType | None) -> None:
        consumer.wakeup()

    return handler


@click.command("groups")
@click.option("--json", "as_json", is_flag=True, help="One JSON line per group and partition.")
def groups(as_json: bool) -> None:
    """Every consumer group of the log: per partition its committed offset, the end offset at the latest
    watermark, and the lag (records committed to the log that the group has not committed). With the log in
    Kafka: the groups that committed offsets of the log's topics, the lag in Kafka's offsets."""
    rows: list[tuple[str, TopicPartition, int, int]] = []
    with open_log() as log:
        watermark = log.latest_watermark()
        if isinstance(log, KafkaLog):
            groups = committed_groups(log.settings)
        else:
            assert isinstance(log, LogStore)
            groups = {group: log.committed_offsets(group) for group in log.consumer_groups()}
        for group, offsets in groups.items():
            for tp, offset in sorted(offsets.items()):
                end = watermark.end_offset(tp) if watermark is not None else 0
                rows.append((group, tp, offset, end))
    if as_json:
        for group, tp, offset, end in rows:
            line = {"group": group, "topic": tp.topic, "partition": tp.partition, "committed": offset, "end": end}
            click.echo(orjson.dumps({**line, "lag": max(0, end - offset)}).decode())
        return
    if not rows:
        click.echo("no consumer group has committed offsets")
        return
    table = Table(title="consumer groups")
    for column in ("group", "topic", "partition", "committed", "end", "lag"):
        table.add_column(column, justify="left" if column in ("group", "topic") else "right")
    for group, tp, offset, end in rows:
        table.add_row(group, tp.topic, str(tp.partition), str(offset), str(end), str(max(0, end - offset)))
    Console(width=140).print(table)
