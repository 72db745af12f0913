"""The ``cdclog`` source's ``rows=events`` form: each log record with its envelope parsed into columns.

A raw row (:data:`derived_views.source.log_partitions.RAW_DDL`) carries the record's value as the envelope's JSON
text (``docs/event-format.md``); a user's job would parse it before it can key, order or filter changes.
:func:`change_events` does that in the Python worker that read the record, one row per record, in the
same order (so offsets stay contiguous per partition wherever the log holds them):

- ``op``, ``lsn`` (``source.lsn``, the commit LSN), ``sequence`` (``source.sequence``), ``tx_id``
  (``source.txId``), ``commit_ts_ms`` (``source.ts_ms``) and ``snapshot`` (``source.snapshot``) as
  columns; ``(lsn, sequence)`` orders every event of a database in commit order.
- ``before`` and ``after`` as JSON text (compact, the log's values unchanged: numerics are decimal
  strings, timestamps ISO text), for ``from_json`` with the user's column types.
- A tombstone is the deletion of its key: ``op`` ``d``, ``tombstone`` true, ``lsn``/``sequence`` from its
  headers (null when it carries none). After compaction the tombstone may be all that is left of a
  delete, so a consumer must apply it; right after its own delete it repeats that delete at the same
  position, which applying twice leaves unchanged.
- A partial row (an update that left TOAST values out) lists its missing columns in ``unchanged``;
  those columns hold the key's previous values, never null.
- A value that is not a readable envelope keeps its place with ``op`` null and ``error`` saying why, so
  that a job can route it aside instead of stopping on it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    import pyarrow as pa

#: Columns of every ``rows=events`` row, in order.
EVENTS_DDL = (
    "topic string, partition int, offset bigint, key string, op string, lsn bigint, sequence bigint, "
    "tx_id bigint, commit_ts_ms bigint, snapshot string, before string, after string, "
    "unchanged array<string>, tombstone boolean, error string"
)

_NAMES = [part.split()[0] for part in EVENTS_DDL.split(", ")]
_PARSED = _NAMES[4:]
_OPS = frozenset(("r", "c", "u", "d", "t"))


def events_schema() -> pa.Schema:
    """:data:`EVENTS_DDL` as an Arrow schema."""
    import pyarrow as pa

    types = {
        "string": pa.string(),
        "int": pa.int32(),
        "bigint": pa.int64(),
        "boolean": pa.bool_(),
        "array<string>": pa.list_(pa.string()),
    }
    return pa.schema([(part.split(" ", 1)[0], types[part.split(" ", 1)[1]]) for part in EVENTS_DDL.split(", ")])


def change_events(raw: pa.RecordBatch) -> pa.RecordBatch:
    """The rows of :data:`EVENTS_DDL` for a batch of raw rows (:data:`~derived_views.source.log_partitions.RAW_DDL`),
    one per record, in order."""
    import pyarrow as pa

    columns = raw.to_pydict()
    parsed = [
        parse_record(value, unchanged, lsn, seq)
        for value, unchanged, lsn, seq in zip(
            columns["value"], columns["unchanged"], columns["deleted_lsn"], columns["deleted_seq"], strict=True
        )
    ]
    out: dict[str, list[Any]] = {name: columns[name] for name in _NAMES[:4]}
    for i, name in enumerate(_PARSED):
        out[name] = [row[i] for row in parsed]
    return pa.RecordBatch.from_pydict(out, schema=events_schema())


def parse_record(value: str | None, unchanged: str | None, deleted_lsn: int | None, deleted_seq: int | None) -> tuple[Any, ...]:
    """One record's parsed columns (:data:`EVENTS_DDL` from ``op`` on); see the module docstring."""
    if value is None:
        return ("d", deleted_lsn, deleted_seq, None, None, None, None, None, None, True, None)
    try:
        envelope = orjson.loads(value)
        source = envelope["source"]
        op = envelope["op"]
        if op not in _OPS:
            raise ValueError(f"unknown op {op!r}")
        missing = orjson.loads(unchanged) if unchanged else None
        if missing is not None and not (isinstance(missing, list) and all(isinstance(name, str) for name in missing)):
            raise ValueError(f"the unchanged header is no list of column names: {unchanged!r}")
        return (
            op,
            int(source["lsn"]),
            int(source.get("sequence", 0)),
            _optional_int(source.get("txId")),
            _optional_int(source.get("ts_ms")),
            None if source.get("snapshot") is None else str(source["snapshot"]),
            _json(envelope.get("before")),
            _json(envelope.get("after")),
            missing,
            False,
            None,
        )
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        return (None, None, None, None, None, None, None, None, None, False, f"unreadable change event: {exc}")


def _json(row: Any) -> str | None:
    return None if row is None else orjson.dumps(row).decode()


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)
