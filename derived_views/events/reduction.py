"""Change events decoded from log records, and the per-batch reductions the views apply (pure Python).

A record's value is the Debezium-style envelope of ``docs/event-format.md``. Events of one key share
a log partition and arrive in commit order, so each reduction runs over one partition's records at a
time (:func:`~derived_views.events.arrow_reduction.reduce_table`, in the driver or in the Spark task
that reads the partition) and never needs a shuffle.

Two reductions, both folding partial rows (the ``unchanged`` header) onto the key's previous event in
the batch:

- :func:`latest_per_key` keeps, for every key, only its latest event by ``(lsn, sequence)``; events
  before the partition's last truncate are dropped and that truncate is kept as a marker. A keyless
  event (key ``None``) is kept as is.
- :func:`fold_all` keeps every event, in order (the history view needs each version).

A tombstone that carries the position of its deletion (the ``lsn``/``sequence`` headers, see
``docs/event-format.md``) is read as a delete of its key at that position: compaction drops the delete
event and keeps only the tombstone, so a view that reads the key after compaction still deletes it. A
tombstone right after its own delete event (an uncompacted log) adds nothing and is skipped; a tombstone
without those headers carries no position and is skipped too.

A partial row whose missing columns are not found in the batch keeps them listed in
:attr:`Event.unchanged`; the MERGE then takes those columns from the row already in the table. An event
whose value is not a readable envelope is kept with :attr:`Event.error` set, so the caller can route it
to a dead-letter table instead of failing the batch.

The reduced rows carry each event's envelope as JSON text (``value``): the log's own bytes, unless a
fold changed the event's ``after`` (then a re-serialized envelope), and Spark parses the typed columns
from it, so the row values are never decoded and re-encoded in Python.
:func:`~derived_views.events.arrow_reduction.reduce_table` takes a vectorised path (Arrow compute, no
Python object per event) whenever the partition's events need no fold and hold no truncate or
unreadable envelope; it yields the same rows as the per-event path (:func:`reduce_events_python`),
which handles every other partition (:mod:`derived_views.events.arrow_reduction`).
Given the view's columns, the
vectorised path's one parse of each envelope also types its ``after`` and ``before``
(:mod:`derived_views.events.typed_rows`), and those rows carry the typed columns instead of the text.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import orjson

#: Spark DDL of the rows :func:`~derived_views.events.arrow_reduction.reduce_table` returns (positions
#: matter: Arrow batches match by position).
EVENT_DDL = (
    "topic string, partition int, offset bigint, key string, op string, lsn bigint, seq bigint, "
    "commit_ts_ms bigint, value string, unchanged array<string>, error string"
)

TRUNCATE = "t"
DELETE = "d"
POISON = "?"


@dataclass
class Event:
    """One decoded change event; ``after``/``before`` are column dicts, ``unchanged`` missing columns."""

    topic: str
    partition: int
    offset: int
    key: str | None
    op: str
    lsn: int
    seq: int
    commit_ts_ms: int
    after: dict[str, Any] | None = None
    before: dict[str, Any] | None = None
    unchanged: tuple[str, ...] = ()
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    raw: str | None = None

    @property
    def position(self) -> tuple[int, int]:
        """``(lsn, sequence)``: the total order of a database's events."""
        return self.lsn, self.seq


def tombstone_envelope(lsn: int, seq: int, ts_ms: int) -> str:
    """The envelope a tombstone stands for: a delete at ``(lsn, seq)`` whose row is its key."""
    return '{"before":null,"after":null,"op":"d","source":{"lsn":%d,"sequence":%d,"ts_ms":%d}}' % (lsn, seq, ts_ms)


def decode(
    topic: str,
    partition: int,
    offset: int,
    key: str | None,
    value: str | None,
    unchanged: str | None,
    deleted_lsn: int | None = None,
    deleted_seq: int | None = None,
    timestamp_ms: int = 0,
) -> Event | None:
    """Decode one log record; a delete for a positioned tombstone, ``None`` for any other tombstone, an
    event with ``error`` for a bad value."""
    if value is None:
        if key is None or deleted_lsn is None:
            return None
        seq = deleted_seq or 0
        return Event(
            topic,
            partition,
            offset,
            key,
            DELETE,
            deleted_lsn,
            seq,
            timestamp_ms,
            raw=tombstone_envelope(deleted_lsn, seq, timestamp_ms),
            extra={"tombstone": True},
        )
    try:
        envelope = orjson.loads(value)
        source = envelope["source"]
        op = str(envelope["op"])
        if op not in ("r", "c", "u", "d", "t"):
            raise ValueError(f"unknown op {op!r}")
        missing = tuple(orjson.loads(unchanged)) if unchanged else ()
        return Event(
            topic=topic,
            partition=partition,
            offset=offset,
            key=key,
            op=op,
            lsn=int(source["lsn"]),
            seq=int(source.get("sequence", 0)),
            commit_ts_ms=int(source.get("ts_ms", 0)),
            after=envelope.get("after"),
            before=envelope.get("before"),
            unchanged=missing,
            raw=value,
        )
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        return Event(topic, partition, offset, key, POISON, 0, 0, 0, error=f"unreadable change event: {exc}", raw=value)


def fold(previous: Event | None, event: Event) -> Event:
    """Fill ``event``'s unchanged columns from ``previous`` (the same key's earlier event), when it has them."""
    if not event.unchanged or previous is None or previous.op in (DELETE, TRUNCATE, POISON):
        return event
    base = previous.after or {}
    after = dict(event.after or {})
    still_missing = []
    for name in event.unchanged:
        if name in base and name not in previous.unchanged:
            after[name] = base[name]
        else:
            still_missing.append(name)
    return replace(event, after=after, unchanged=tuple(still_missing), raw=None)


def latest_per_key(events: Iterable[Event]) -> list[Event]:
    """The latest event of every key (folded), after the last truncate; see the module docstring."""
    latest: dict[str, Event] = {}
    keyless: list[Event] = []
    poison: list[Event] = []
    truncate: Event | None = None
    for event in events:
        if event.op == POISON:
            poison.append(event)
        elif event.op == TRUNCATE:
            latest.clear()
            keyless.clear()
            truncate = event
        elif event.key is None:
            keyless.append(event)
        else:
            previous = latest.get(event.key)
            if _repeats_delete(previous, event):
                continue
            if previous is None or event.position >= previous.position:
                latest[event.key] = fold(previous, event)
    head = [truncate] if truncate is not None else []
    return head + keyless + list(latest.values()) + poison


def fold_all(events: Iterable[Event]) -> list[Event]:
    """Every event in order, each partial row folded onto its key's previous event in the batch."""
    previous: dict[str, Event] = {}
    out: list[Event] = []
    for event in events:
        if _repeats_delete(previous.get(event.key) if event.key is not None else None, event):
            continue
        if event.op == TRUNCATE:
            previous.clear()
        elif event.op != POISON and event.key is not None:
            key = event.key
            event = fold(previous.get(key), event)
            previous[key] = event
        out.append(event)
    return out


def _repeats_delete(previous: Event | None, event: Event) -> bool:
    """Whether ``event`` is the tombstone of the delete event ``previous`` (same key and position)."""
    return (
        event.extra.get("tombstone", False)
        and previous is not None
        and previous.op == DELETE
        and previous.position == event.position
    )


def envelope_text(event: Event) -> str | None:
    """The event's envelope as JSON text: the log's bytes, or ``before``/``after`` re-serialized after a fold."""
    if event.raw is not None:
        return event.raw
    if event.after is None and event.before is None:
        return None
    return orjson.dumps({"before": event.before, "after": event.after, "op": event.op}).decode()


def to_row(event: Event) -> tuple[Any, ...]:
    """The event as a tuple in :data:`EVENT_DDL` order."""
    return (
        event.topic,
        event.partition,
        event.offset,
        event.key,
        event.op,
        event.lsn,
        event.seq,
        event.commit_ts_ms,
        envelope_text(event),
        list(event.unchanged),
        event.error,
    )


def decode_all(columns: dict[str, list[Any]]) -> Iterator[Event]:
    """Decode raw log rows given column-wise (the log source's column names)."""
    n = len(columns["topic"])
    for topic, partition, offset, key, value, unchanged, deleted_lsn, deleted_seq, ts in zip(
        columns["topic"],
        columns["partition"],
        columns["offset"],
        columns["key"],
        columns["value"],
        columns["unchanged"],
        columns.get("deleted_lsn", [None] * n),
        columns.get("deleted_seq", [None] * n),
        columns.get("timestamp_ms", [0] * n),
        strict=True,
    ):
        event = decode(topic, partition, offset, key, value, unchanged, deleted_lsn, deleted_seq, ts or 0)
        if event is not None:
            yield event


def out_schema(row: Any | None = None) -> Any:
    """The Arrow schema of reduced rows: :data:`EVENT_DDL`, plus the typed columns when ``row`` is given."""
    import pyarrow as pa

    names = [part.strip().split(" ")[0] for part in EVENT_DDL.split(",")]
    types = [
        pa.string(),
        pa.int32(),
        pa.int64(),
        pa.string(),
        pa.string(),
        pa.int64(),
        pa.int64(),
        pa.int64(),
        pa.string(),
        pa.list_(pa.string()),
        pa.string(),
    ]
    fields = list(zip(names, types, strict=True))
    if row is not None:
        fields += [("parsed", pa.bool_()), ("after", row), ("before", row)]
    return pa.schema(fields)


def _untyped(table: Any, row: Any | None) -> Any:
    """Reduced rows whose envelopes Spark parses: ``parsed`` false and no typed columns (when ``row``)."""
    import pyarrow as pa

    if row is None:
        return table
    n = table.num_rows
    return pa.Table.from_arrays(
        [*table.columns, pa.array([False] * n, pa.bool_()), pa.nulls(n, row), pa.nulls(n, row)],
        schema=out_schema(row),
    )


def reduce_events_python(events: list[Event], mode: str, row: Any | None = None) -> Any:
    """The per-event reduction (:func:`latest_per_key` or :func:`fold_all`) as an Arrow table (its
    envelopes left to Spark: ``parsed`` false when ``row`` is given)."""
    import pyarrow as pa

    reduced = latest_per_key(events) if mode == "latest" else fold_all(events)
    schema = out_schema()
    rows = [to_row(event) for event in reduced]
    arrays = [pa.array([row[i] for row in rows], type=column.type) for i, column in enumerate(schema)]
    return _untyped(pa.Table.from_arrays(arrays, schema=schema), row)
