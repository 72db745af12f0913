"""Change events decoded from log records, and the per-batch reductions the views apply (pure Python).

A record's value is the Debezium-style envelope of ``docs/event-format.md``. Events of one key share
a log partition and arrive in commit order, so each reduction runs over one partition's records at a
time (one Spark task, see :func:`reduce_partition`) and never needs a shuffle.

Two reductions, both folding partial rows (the ``unchanged`` header) onto the key's previous event in
the batch:

- :func:`latest_per_key` keeps, for every key, only its latest event by ``(lsn, sequence)``; events
  before the partition's last truncate are dropped and that truncate is kept as a marker. A keyless
  event (key ``None``) is kept as is.
- :func:`fold_all` keeps every event, in order (the history view needs each version).

A partial row whose missing columns are not found in the batch keeps them listed in
:attr:`Event.unchanged`; the MERGE then takes those columns from the row already in the table. An event
whose value is not a readable envelope is kept with :attr:`Event.error` set, so the caller can route it
to a dead-letter table instead of failing the batch.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import orjson

#: Spark DDL of the rows :func:`reduce_partition` yields (positions matter: Arrow batches match by position).
EVENT_DDL = (
    "topic string, partition int, offset bigint, key string, op string, lsn bigint, seq bigint, "
    "commit_ts_ms bigint, after string, before string, unchanged array<string>, error string"
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

    @property
    def position(self) -> tuple[int, int]:
        """``(lsn, sequence)``: the total order of a database's events."""
        return self.lsn, self.seq


def decode(
    topic: str, partition: int, offset: int, key: str | None, value: str | None, unchanged: str | None
) -> Event | None:
    """Decode one log record; ``None`` for a tombstone, an event with ``error`` for a bad value."""
    if value is None:
        return None
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
        )
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        return Event(topic, partition, offset, key, POISON, 0, 0, 0, error=f"unreadable change event: {exc}")


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
    return replace(event, after=after, unchanged=tuple(still_missing))


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
            if previous is None or event.position >= previous.position:
                latest[event.key] = fold(previous, event)
    head = [truncate] if truncate is not None else []
    return head + keyless + list(latest.values()) + poison


def fold_all(events: Iterable[Event]) -> list[Event]:
    """Every event in order, each partial row folded onto its key's previous event in the batch."""
    previous: dict[str, Event] = {}
    out: list[Event] = []
    for event in events:
        if event.op == TRUNCATE:
            previous.clear()
        elif event.op != POISON and event.key is not None:
            event = fold(previous.get(event.key), event)
            previous[event.key] = event
        out.append(event)
    return out


def _json(value: dict[str, Any] | None) -> str | None:
    return None if value is None else orjson.dumps(value).decode()


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
        _json(event.after),
        _json(event.before),
        list(event.unchanged),
        event.error,
    )


def decode_all(columns: dict[str, list[Any]]) -> Iterator[Event]:
    """Decode raw log rows given column-wise (the log source's column names)."""
    for topic, partition, offset, key, value, unchanged in zip(
        columns["topic"],
        columns["partition"],
        columns["offset"],
        columns["key"],
        columns["value"],
        columns["unchanged"],
        strict=True,
    ):
        event = decode(topic, partition, offset, key, value, unchanged)
        if event is not None:
            yield event


def reduce_partition(batches: Iterable[Any], mode: str) -> Iterator[Any]:
    """``mapInArrow`` body: one Spark partition of raw log rows in, reduced events (Arrow) out.

    ``mode`` is ``"latest"`` (:func:`latest_per_key`) or ``"all"`` (:func:`fold_all`). The whole
    partition is read before anything is yielded, since a key's latest event may come last.
    """
    import pyarrow as pa

    events: list[Event] = []
    for batch in batches:
        events.extend(decode_all(batch.to_pydict()))
    reduced = latest_per_key(events) if mode == "latest" else fold_all(events)
    names = [part.strip().split(" ")[0] for part in EVENT_DDL.split(",")]
    types = [
        pa.string(), pa.int32(), pa.int64(), pa.string(), pa.string(), pa.int64(), pa.int64(),
        pa.int64(), pa.string(), pa.string(), pa.list_(pa.string()), pa.string(),
    ]
    step = 50_000
    for start in range(0, len(reduced), step):
        rows = [to_row(event) for event in reduced[start : start + step]]
        arrays = [pa.array([row[i] for row in rows], type=types[i]) for i in range(len(types))]
        yield pa.RecordBatch.from_arrays(arrays, names=names)
