"""Committed transactions into the log as one group: the records of every transaction, in commit order.

The group is handed to the log as a generator: the log writes it in bounded chunks, so a million-row
transaction is never held in memory (its changes wait in a spill file until here). The caller confirms
the group to the server only after :meth:`GroupWriter.append` returned (the log fsynced, or Kafka
committed), and it never retries a group this raised for: the log kept nothing of it.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass, field

from cdc.capture.change_replayer import ChangeReplayer
from cdc.capture.events import PreviousValues
from cdc.capture.key_changes import KeyChangeValues, LogRows, discarded_values
from cdc.capture.reads.held_changes import HeldChanges
from cdc.capture.stream_core import group_position
from cdc.capture.streaming import Transaction
from cdc.capture.tables import TableShape
from log_store import ProducerRecord
from log_store.log import Log

log = logging.getLogger("cdc.capture")


@dataclass
class GroupWritten:
    """What one group put in the log."""

    events: int = 0
    value_bytes: int = 0


@dataclass
class GroupWriter:
    """Appends groups of transactions to ``log``, their records built by ``replayer``.

    ``read_back_warned`` names the tables already warned of (:meth:`append`); the caller keeps it across
    the writers of one process, so a capture that starts again after a Kafka failure does not warn again.

    ``held``: topic -> the holding file of a table being read beside the stream
    (:mod:`cdc.capture.reads.online_read`): its records go there instead of to the log, and the file is
    fsynced before :meth:`append` returns. ``abandon`` is called with the topics of ``held`` whose
    records of a group would need a row the log may not hold yet (an update that leaves TOAST values
    unchanged and changes the key, or any such update on a log that cannot fold partial rows); it must
    take them out of the gate, so that the group writes nothing of those tables (their records of the
    group, if any, still go to the holding file, which the caller deletes after the group). A topic of
    ``folded`` (a partial read, :mod:`cdc.capture.reads.partial_reads`) is never abandoned: the log holds a
    full row of each of its keys, and its holding file the newer changes, so a key's row is the log's
    with the held records folded over it, then the group's.
    """

    log: Log
    replayer: ChangeReplayer
    read_back_warned: set[str] = field(default_factory=set)
    held: dict[str, HeldChanges] = field(default_factory=dict)
    abandon: Callable[[set[str]], None] = lambda topics: None
    folded: set[str] = field(default_factory=set)

    def append(self, group: list[Transaction]) -> GroupWritten:
        """Append ``group`` at its last commit's position (:func:`~cdc.capture.stream_core.group_position`), then close it.

        An update that changes a row's key and leaves TOAST values unchanged takes them from the old key's
        row, and so does, on a log that cannot fold partial rows, an update that keeps its key
        (:mod:`cdc.capture.key_changes`). Schema records of a group the log did not take are written again with the next.
        """
        replayer = self.replayer
        written = GroupWritten()
        wanted = replayer.key_changes(group, partial=replayer.builder.whole_rows)
        abandoned: set[str] = set()
        if self.held and (abandoned := {topic for topic, _ in wanted if topic in self.held and topic not in self.folded}):
            self.abandon(abandoned)
            wanted = {(topic, key) for topic, key in wanted if topic not in abandoned}
        folded = {topic: held for topic, held in self.held.items() if topic in self.folded}
        values = KeyChangeValues(wanted, LogRows(self.log), folded) if wanted or abandoned else None
        watched = values.watch if values else _passed
        # watched before they are diverted: a held record changes the row a later one of the group folds onto
        held = self.held
        changes: Iterator[ProducerRecord] = itertools.chain.from_iterable(
            _diverted(watched(replayer.records(tx)), held, tx.commit_lsn, tx.xid) if held else watched(replayer.records(tx))
            for tx in group
        )
        if self.held:
            # the held records are durable before the log commits the group that gave them
            changes = itertools.chain(changes, _synced(list(self.held.values())))
        try:
            provider = _discarding(abandoned, values) if values and abandoned else values
            previous = replayer.builder.previous_values_from(provider) if provider else nullcontext()
            with replayer.tentative_schemas(), previous:
                records = _counted(changes, written)
                self.log.append_group(records, group_position(group[-1]).hex16())
        finally:
            for tx in group:
                tx.close()
        self._warn_of_rows_read_back()
        return written

    def _warn_of_rows_read_back(self) -> None:
        """Say once per table that its updates leave TOAST values out, which capture reads back from the log."""
        read_back = self.replayer.builder.rows_read_back
        for table in sorted(read_back - self.read_back_warned):
            log.warning(
                "updates of %s leave TOAST values out; the log (Kafka) cannot fold such partial rows, so capture reads "
                "each such row back from the log to write it whole, which slows it down; run ALTER TABLE %s "
                "REPLICA IDENTITY FULL so that updates carry those values",
                table,
                table,
            )
        self.read_back_warned |= read_back


def _passed(records: Iterator[ProducerRecord]) -> Iterator[ProducerRecord]:
    return records


def _diverted(records: Iterator[ProducerRecord], held: dict[str, HeldChanges], lsn: int, xid: int) -> Iterator[ProducerRecord]:
    """Pass the records of the transaction ``xid`` committed at ``lsn`` through, except those of a topic in
    ``held``, which go to its holding file."""
    for record in records:
        target = held.get(record[0])
        if target is None:
            yield record
        else:
            target.add(lsn, (record,), xid)


def _discarding(topics: set[str], values: KeyChangeValues) -> PreviousValues:
    """``values``, but JSON nulls for the tables of ``topics``: their records of the group go to a holding
    file that is deleted unread (their read starts over), so no value of theirs is ever written."""

    def previous(shape: TableShape, old_key: bytes, names: list[str], same_key: bool = False) -> dict[str, bytes]:
        if shape.topic in topics:
            return discarded_values(shape, old_key, names, same_key)
        return values(shape, old_key, names, same_key)

    return previous


def _synced(files: list[HeldChanges]) -> Iterator[ProducerRecord]:
    """No record: fsyncs ``files`` when the records before it are all taken."""
    for held in files:
        held.sync()
    yield from ()


def _counted(records: Iterator[ProducerRecord], written: GroupWritten) -> Iterator[ProducerRecord]:
    """Pass ``records`` through, adding their number and value bytes to ``written`` as they go."""
    events = size = 0
    try:
        for record in records:
            events += 1
            value = record[2]
            if value is not None:
                size += len(value)
            yield record
    finally:
        written.events += events
        written.value_bytes += size
