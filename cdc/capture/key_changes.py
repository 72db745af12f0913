"""Unchanged TOAST values of an update that changes a row's key, recovered so that no value is lost.

**The problem.** Under the default replica identity an update sends the old row's key only ('K') and
leaves out every TOAST value it did not change ('u'). Capture writes a key change as a delete (and
tombstone) of the old key and a create of the new key. A partial row is folded by compaction and by
the views onto the *same key's* previous value, and the new key has none: written as a partial row,
the create would lose those values for good (promise 4).

**The mechanism.** The values are the old key's, as of just before the update: its latest record,
with any partial records folded onto the ones before them exactly as compaction folds them
(:func:`event_format.fold_after`: an omitted column holds the previous record's value). They
come from two places:

1. the log, for everything before the group being written: :class:`LogRows` reads the old key's
   partition backwards from its end, newest record first, and folds until it has a full row; a
   tombstone, a delete or a truncate marker of the topic means the row did not exist;
2. the group itself, for events of the same or an earlier transaction of the group that the log does
   not hold yet: :class:`KeyChangeValues` watches every record of the group as it goes to the log and
   keeps, for the keys it will be asked about (found by a first pass over the group's change messages,
   :meth:`cdc.capture.change_replayer.ChangeReplayer.key_changes`), the row that record leaves.

The create of the new key is then written as a full row with those values and no ``unchanged``
header. A log whose compaction cannot fold partial rows (Kafka) gets every update that leaves TOAST
values unchanged the same way, its key's own row giving them (:attr:`cdc.capture.events.EventBuilder.whole_rows`):
a read back per group and partition, which ``REPLICA IDENTITY FULL`` on the table avoids (the server
then sends the values with the update). Only when neither place holds the row (the log was trimmed by
retention, or holds a partial row with nothing to fold it onto) does capture stop with
:class:`~cdc.capture.errors.MissingValueError`, naming the table and the fix, before anything of the
transaction is appended or confirmed.

Costs: nothing for transactions without such an update (the assembler marks those that hold an
update with an old key, the only kind that can change a key); for the others one extra decode pass
over the group's updates and one backward read of each partition that holds a changed key, ending
as soon as every such key of the partition is found.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import orjson

from cdc.capture.errors import MissingValueError
from cdc.capture.events import missing_message, with_unchanged_key
from cdc.capture.pgoutput.messages import UNCHANGED, Update
from cdc.capture.tables import TableShape
from event_format import UNCHANGED_HEADER, is_truncate_key, loads_exact
from log_store import ProducerRecord, TopicPartition
from log_store.partitioner import partition_for_key

if TYPE_CHECKING:
    from cdc.capture.reads.held_changes import HeldChanges
    from log_store.log import Log

#: A full row: column name -> its JSON value bytes (as written in the log).
Row = dict[str, bytes]
_WINDOW = 4096
#: a decoded record value (``None``: tombstone) and its headers
_Found = tuple["dict[str, Any] | None", tuple[tuple[str, bytes], ...]]


def discarded_values(shape: TableShape, old_key: bytes, names: list[str], same_key: bool = False) -> dict[str, bytes]:
    """``previous_values`` for a replay whose records are thrown away (a transaction the log already
    holds, replayed only for its Relation messages): JSON null for every column, never written."""
    return dict.fromkeys(names, b"null")


class _Incomplete:
    """A row the log holds only partly (a partial record with nothing before it to fold onto)."""

    def __init__(self, why: str) -> None:
        self.why = why


def _unchanged(headers: Iterable[tuple[str, bytes]]) -> list[str]:
    for name, value in headers:
        if name == UNCHANGED_HEADER:
            names = orjson.loads(value)
            return [str(n) for n in names]
    return []


def _after_row(value: dict[str, Any]) -> Row:
    after = value.get("after")
    if not isinstance(after, dict):
        return {}
    return {name: orjson.dumps(item) for name, item in after.items()}


class _Fold:
    """One key's row folded from its records as they come, newest first (see :meth:`LogRows.rows`)."""

    __slots__ = ("missing", "result", "row")

    def __init__(self) -> None:
        self.row: Row | None = None
        self.missing: set[str] = set()
        self.result: Row | _Incomplete | None | _Pending = _PENDING

    def feed(self, value: dict[str, Any] | None, headers: tuple[tuple[str, bytes], ...]) -> bool:
        """Take the next older record (``None``: tombstone); True once the row is decided."""
        if value is None or value.get("op") in ("d", "t"):
            if self.row is None:
                self.result = None  # deleted (or truncated) last: the row does not exist
            else:
                kind = "tombstone" if value is None else f"op={value.get('op')} record"
                self.result = _Incomplete(f"its record before a partial one is a {kind}")
            return True
        after = _after_row(value)
        if self.row is None:
            self.row, self.missing = after, set(_unchanged(headers))
        else:
            for name in list(self.missing):
                if name in after:
                    self.row[name] = after[name]
                    self.missing.discard(name)
            lacking = self.missing - set(_unchanged(headers))
            if lacking:
                self.result = _Incomplete(f"its earlier record lacks {', '.join(sorted(lacking))}")
                return True
        if not self.missing:
            self.result = self.row
            return True
        return False

    def end(self) -> Row | _Incomplete | None:
        """The outcome once no older record is left."""
        if not isinstance(self.result, _Pending):
            return self.result
        return None if self.row is None else _Incomplete("the log holds no full record of it")


class _Pending:
    """Marks a fold that has not decided yet."""


_PENDING = _Pending()


class LogRows:
    """The latest full rows of keys as the log holds them (reads committed records only)."""

    def __init__(self, log: Log) -> None:
        self.log = log

    def row(self, topic: str, key: bytes) -> Row | _Incomplete | None:
        """The key's row folded from its newest records; ``None`` when the log says it does not exist."""
        return self.rows(topic, {key})[key]

    def rows(self, topic: str, keys: set[bytes]) -> dict[bytes, Row | _Incomplete | None]:
        """The rows of ``keys``: one backward read per partition, however many keys it holds, that stops
        as soon as every key of the partition is decided."""
        if topic not in self.log.topics():
            return dict.fromkeys(keys)
        partitions = self.log.partitions(topic)
        by_partition: dict[int, set[bytes]] = {}
        for key in keys:
            by_partition.setdefault(partition_for_key(key, partitions), set()).add(key)
        out: dict[bytes, Row | _Incomplete | None] = {}
        for partition, wanted in by_partition.items():
            folds = {key: _Fold() for key in wanted}
            self._fold_backwards(TopicPartition(topic, partition), folds)
            out.update({key: fold.end() for key, fold in folds.items()})
        return out

    def _fold_backwards(self, tp: TopicPartition, folds: dict[bytes, _Fold]) -> None:
        """Feed every fold its key's records and the topic's truncate markers, newest first, reading
        backwards in windows of ``_WINDOW`` offsets so that recent records are found quickly."""
        first, high = self.log.start_offset(tp), self.log.end_offset(tp)
        open_folds = dict(folds)
        while high > first and open_folds:
            low = max(first, high - _WINDOW)
            found: list[tuple[bytes | None, _Found]] = []  # (key, or None for a truncate marker)
            offset = low
            while offset < high:
                batch = self.log.read(tp, offset, max_records=high - offset)
                if not batch:
                    break
                for record in batch:
                    if record.offset >= high:
                        break
                    if record.key in open_folds:
                        value = loads_exact(record.value) if record.value is not None else None
                        found.append((record.key, (value, record.headers)))
                    elif record.value is not None and is_truncate_key(record.key):
                        value = loads_exact(record.value)
                        if value.get("op") == "t":
                            found.append((None, (value, record.headers)))
                offset = batch[-1].offset + 1
            for key, (value, headers) in reversed(found):
                targets = list(open_folds) if key is None else [key] if key in open_folds else []
                for target in targets:
                    if open_folds[target].feed(value, headers):
                        del open_folds[target]
            high = low


class KeyChangeValues:
    """What a group's key-changing updates need: the old keys' rows, kept current as the group is written.

    Built before the group is appended, with the rows the log holds (``rows``) for every key in
    ``wanted`` (``(topic, key)`` pairs); :meth:`watch` passes the group's records through and applies
    each to the rows it tracks; the instance is the builder's ``previous_values`` callable.
    """

    def __init__(self, wanted: set[tuple[str, bytes]], log_rows: LogRows, held: Mapping[str, HeldChanges] | None = None) -> None:
        """``held``: topic -> the holding file of a partial read of its table, whose records are newer than
        the log's and are folded over them."""
        self.rows: dict[tuple[str, bytes], Row | _Incomplete | None] = {}
        by_topic: dict[str, set[bytes]] = {}
        for topic, key in wanted:
            by_topic.setdefault(topic, set()).add(key)
        for topic, keys in by_topic.items():
            self.rows.update({(topic, key): row for key, row in log_rows.rows(topic, keys).items()})
        self.topics = {topic for topic, _ in wanted}
        for topic, file in (held or {}).items():
            if topic in by_topic:
                deque(self.watch(file.records()), maxlen=0)  # folded over the log's rows, nothing kept

    def watch(self, records: Iterable[ProducerRecord]) -> Iterator[ProducerRecord]:
        """Pass ``records`` through, updating the tracked rows with each one."""
        rows, topics = self.rows, self.topics
        for record in records:
            if record[0] in topics:
                tracked = (record[0], record[1])
                if tracked in rows:
                    rows[tracked] = self._apply(rows[tracked], record)
                elif record[2] is not None and is_truncate_key(record[1]):
                    if orjson.loads(record[2]).get("op") == "t":
                        for wanted_key in rows:
                            if wanted_key[0] == record[0]:
                                rows[wanted_key] = None
            yield record

    @staticmethod
    def _apply(row: Row | _Incomplete | None, record: ProducerRecord) -> Row | _Incomplete | None:
        if record.value is None:
            return None
        value = loads_exact(record.value)
        if value.get("op") in ("d", "t"):
            return None
        after = _after_row(value)
        unchanged = _unchanged(record.headers)
        if not unchanged:
            return after
        if not isinstance(row, dict):
            return _Incomplete("a partial record of it in the same group has nothing to fold onto")
        lacking = [name for name in unchanged if name not in row]
        if lacking:
            return _Incomplete(f"its previous row lacks {', '.join(lacking)}")
        merged = dict(after)
        for name in unchanged:
            merged[name] = row[name]
        return merged

    def __call__(self, shape: TableShape, old_key: bytes, names: list[str], same_key: bool = False) -> dict[str, bytes]:
        """The JSON values of ``names`` in the row of ``old_key`` (raises when it cannot be recovered);
        ``same_key``: the update kept its key (a partial row written whole, see the module docstring)."""
        row = self.rows.get((shape.topic, old_key), _Incomplete("it was not looked up"))
        whose = "the key's" if same_key else "the old key's"
        if row is None:
            why = f"the log holds no record of {whose[:-2]}"
        elif isinstance(row, _Incomplete):
            why = f"{whose} row cannot be rebuilt from the log ({row.why})"
        else:
            lacking = [name for name in names if name not in row]
            if not lacking:
                return {name: row[name] for name in names}
            why = f"{whose} row in the log lacks {', '.join(lacking)}"
        raise MissingValueError(missing_message(shape, old_key, names, why, same_key))


def read_back_key(shape: TableShape, message: Update, partial: bool) -> bytes | None:
    """The key whose row in the log holds the TOAST values ``message`` leaves out: the old key of an
    update that changes it, or (``partial``) the key of one that keeps it; ``None`` for neither."""
    codec = shape.codec
    old = message.old if message.old_kind == "K" else None
    new = with_unchanged_key(shape, old, message.new)

    def key_of(values: Any) -> bytes | None:
        return codec.key([codec.fragment(i, v) if v is not UNCHANGED else None for i, v in enumerate(values[: codec.count])])

    new_key = key_of(new)
    old_key = new_key if old is None else key_of(old)
    return old_key if old_key is not None and (old_key != new_key or partial) else None
