"""The change records of a table being read, held in a file until its read is in the log.

While a table is read beside the stream (:mod:`cdc.capture.reads.online_read`), the records its transactions
committing at or after the read's boundary give (the very bytes the log would get: encoded, masked and
filtered as for the log) go here instead of to the log, in commit order; they are appended after the
read's last rows. A group's held records are fsynced (:meth:`HeldChanges.sync`) before the log commits
the group, so every held record of a transaction the log's watermark covers is durable: the slot is
never confirmed past a change that lives only in memory, and a capture that resumes the read after a
crash finds them all. Records of transactions past the watermark (a crash between the two fsyncs) are
cut off when the file is opened again (:meth:`HeldChanges.reopen`): the slot sends those again.

**Runs.** A read takes a new snapshot every few seconds (:mod:`cdc.capture.reads.online_read`); the runs of a
read are numbered 0, 1, ... Each record carries the first run whose snapshot sees its transaction
(:meth:`HeldChanges.run_of`, judged by transaction ID, :mod:`cdc.capture.visibility`): the rows that run
and every later run read hold its effect, the rows of the runs before it do not. A transaction that no
snapshot taken so far sees gets the next run's number: that snapshot will see it (a snapshot holding an
ID that committed is never used, :func:`~cdc.capture.table_snapshots.take_snapshot`).

On-disk layout: the 8 bytes ``CDCHELD2``, then one entry per record, all integers big-endian::

    i64 commit LSN | i32 run | u32 topic length | i32 key length (-1: none) | i32 value length (-1: tombstone)
    | i64 timestamp ms | u16 header count | topic | key | value | (u16 name length | u32 value length | name | value)*

A torn entry at the end (a crash mid-write) is cut off too. The file lives under
``CDC_DATA_DIR/held/`` (mode 0600, like the log's files: it holds rows) and is deleted when its read
ends or starts over.
"""

from __future__ import annotations

import functools
import os
import struct
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import BinaryIO, Concatenate, ParamSpec, TypeVar

from cdc.capture.visibility import SnapshotXids
from event_format import is_truncate_record
from log_store import ProducerRecord
from log_store.errors import StorageIOError

_P = ParamSpec("_P")
_R = TypeVar("_R")


def _storage(method: Callable[Concatenate[HeldChanges, _P], _R]) -> Callable[Concatenate[HeldChanges, _P], _R]:
    """A file operation the operating system refuses (a full disk, permission bits) is the log's
    :class:`StorageIOError` naming the holding file, which capture reports as it reports the log's own."""

    @functools.wraps(method)
    def refused_as_storage(self: HeldChanges, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return method(self, *args, **kwargs)
        except OSError as exc:
            raise StorageIOError(self.path, exc) from exc

    return refused_as_storage


_MAGIC = b"CDCHELD2"
_ENTRY = struct.Struct("!qiIiiqH")
_HEADER = struct.Struct("!HI")


def _entry(lsn: int, run: int, record: ProducerRecord) -> bytes:
    topic = record.topic.encode()
    key, value = record.key, record.value
    key_len = -1 if key is None else len(key)
    value_len = -1 if value is None else len(value)
    parts = [
        _ENTRY.pack(lsn, run, len(topic), key_len, value_len, record.timestamp_ms, len(record.headers)),
        topic,
        key or b"",
        value or b"",
    ]
    for name, data in record.headers:
        encoded = name.encode()
        parts += [_HEADER.pack(len(encoded), len(data)), encoded, bytes(data)]
    return b"".join(parts)


def _read_exact(source: BinaryIO, size: int) -> bytes:
    data = source.read(size)
    if len(data) != size:
        raise EOFError
    return data


def _entries(source: BinaryIO) -> Iterator[tuple[int, int, int, ProducerRecord]]:
    """``(commit LSN, run, end offset, record)`` of each whole entry after the magic, in order (a torn tail
    ends the iteration)."""
    source.seek(len(_MAGIC))
    while True:
        try:
            lsn, run, topic_len, key_len, value_len, ts_ms, header_count = _ENTRY.unpack(_read_exact(source, _ENTRY.size))
            topic = _read_exact(source, topic_len).decode()
            key = _read_exact(source, key_len) if key_len >= 0 else None
            value = _read_exact(source, value_len) if value_len >= 0 else None
            headers = []
            for _ in range(header_count):
                name_len, data_len = _HEADER.unpack(_read_exact(source, _HEADER.size))
                headers.append((_read_exact(source, name_len).decode(), _read_exact(source, data_len)))
        except (EOFError, struct.error, UnicodeDecodeError):
            return
        yield lsn, run, source.tell(), ProducerRecord(topic, key, value, ts_ms, tuple(headers))


class HeldChanges:
    """An append-only file of held change records (see the module's docstring for the layout)."""

    @_storage
    def __init__(self, path: Path, *, keep_to: int | None = None, next_run: int = 0) -> None:
        """A new empty file at ``path``; with ``keep_to``, the existing one (:meth:`reopen`). ``next_run``:
        the number of the read's next run."""
        self.path = path
        self.count = 0
        self.handed_out = 0  # records :meth:`records` gave, and their values' bytes
        self.handed_out_bytes = 0
        #: the snapshots of the read's runs this process took, by run number
        self.snapshots: dict[int, SnapshotXids] = {}
        #: a truncate marker of the table is among the records: the read must start over (rows read before
        #: it and rows read after it cannot both stand beside one marker)
        self.truncated = False
        self.next_run = next_run
        #: (file offset, run): the records before the offset are marked that run at most (:meth:`run_started`)
        self._caps: list[tuple[int, int]] = []
        #: the caps that lowered marks of records already in the file (a run's number given again): kept with
        #: the read's progress, so that a process that resumes it reads the records as this one did
        self.lasting_caps: list[tuple[int, int]] = []
        # the highest run number a record may carry (an earlier process's records: any)
        self._highest = next_run if keep_to is None else 1 << 62
        self._ends: dict[int, tuple[SnapshotXids, int]] = {}  # run -> its snapshot, the WAL's end then
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        if keep_to is None:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
            self._file = os.fdopen(fd, "r+b")
            self._file.write(_MAGIC)
        else:
            self._file = open(path, "r+b")  # noqa: SIM115 - closed by discard() or close()
            if self._file.read(len(_MAGIC)) != _MAGIC:  # another layout: nothing in it can be judged
                self._file.seek(0)
                self._file.truncate(0)
                self._file.write(_MAGIC)
            self.cut_to(keep_to)
        self._dirty = False

    def recent(self, position: int) -> tuple[tuple[int, str, int], ...]:
        """The runs whose snapshot may see a transaction committing after ``position`` (the log's: after a
        crash the slot sends those again), as ``(run, snapshot text, WAL end)``: a snapshot sees only
        transactions committing before the WAL's end when it was taken. Kept with the read's progress, so
        that the next run marks what the slot sends again as this process would have."""
        return tuple((run, xids.text(), end) for run, (xids, end) in sorted(self._ends.items()) if end > position)

    def remember(self, recent: tuple[tuple[int, str, int], ...], caps: tuple[tuple[int, int], ...] = ()) -> None:
        """Know again the runs an earlier process recorded with :meth:`recent`, and the caps it kept
        (:attr:`lasting_caps`, cut to the file's end as it is now)."""
        self._file.flush()
        end = self._file.seek(0, os.SEEK_END)
        for offset, run in caps:
            self._caps.append((min(offset, end), run))
            self.lasting_caps.append((min(offset, end), run))
        for run, text, end in recent:
            self.snapshots.setdefault(run, SnapshotXids.parse(text))
            self._ends.setdefault(run, (self.snapshots[run], end))

    def run_started(self, run: int, snapshot: SnapshotXids, *, taken_now: bool = False, wal_end: int = 0) -> None:
        """The read's run number ``run`` reads from ``snapshot``. ``taken_now``: the snapshot was just taken,
        so it sees every record already in the file (the stream received them before it, see
        :func:`~cdc.capture.table_snapshots.take_snapshot`): none is marked later than ``run`` (a run that
        ended without writing a row gives its number to the next, and the records an earlier process
        marked for a run it never wrote are all older than this snapshot)."""
        self.snapshots[run] = snapshot
        self._ends[run] = (snapshot, wal_end)
        self.next_run = run + 1
        if taken_now:
            reused = run < self._highest  # a run that wrote nothing gives its number to this one
            self._file.flush()
            cap = (self._file.tell(), run)
            self._caps.append(cap)
            if reused:
                self.lasting_caps.append(cap)
        self._highest = max(self._highest, self.next_run)

    def run_of(self, xid: int) -> int:
        """The first run whose snapshot sees the committed transaction ``xid`` (see the module's docstring)."""
        return min((run for run, snapshot in self.snapshots.items() if snapshot.sees(xid)), default=self.next_run)

    @_storage
    def cut_to(self, position: int) -> None:
        """Cut off the records of transactions committed after ``position`` (the log's watermark: the slot
        sends those again) and any torn entry, durably."""
        self._file.flush()
        end, self.count = len(_MAGIC), 0
        for lsn, _, offset, record in _entries(self._file):
            if lsn > position:
                break
            end, self.count = offset, self.count + 1
            self.truncated = self.truncated or is_truncate_record(record.key, record.value)
        self._file.truncate(end)
        self._file.seek(end)
        self._caps = [(min(offset, end), run) for offset, run in self._caps]
        os.fsync(self._file.fileno())
        self._dirty = False

    @classmethod
    def reopen(cls, path: Path, position: int, next_run: int = 0) -> HeldChanges:
        """The file at ``path`` with the records of transactions committed after ``position`` (the log's
        watermark: the slot sends those again) and any torn entry cut off; ``next_run``: the number of the
        read's next run. A file of another layout is emptied."""
        return cls(path, keep_to=position, next_run=next_run)

    @_storage
    def add(self, lsn: int, records: Iterable[ProducerRecord], xid: int | None = None) -> None:
        """Append ``records`` of the transaction ``xid`` committed at ``lsn`` (buffered: durable after
        :meth:`sync`), marked with the first run that sees it (no ``xid``: the next run)."""
        run = self.next_run if xid is None else self.run_of(xid)
        for record in records:
            self._file.write(_entry(lsn, run, record))
            self.truncated = self.truncated or is_truncate_record(record.key, record.value)
            self.count += 1
            self._dirty = True

    @_storage
    def sync(self) -> None:
        """Make every record added so far durable."""
        if self._dirty:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._dirty = False

    def records(self, keep: Callable[[int, bytes | None], bool] | None = None) -> Iterator[ProducerRecord]:
        """Every record added, in order; with ``keep``, only those ``keep(run, key)`` is true of (counted in
        :attr:`handed_out`: the changes a read's end writes, for capture's figures)."""
        self._file.flush()
        with open(self.path, "rb") as source:
            for _, marked, end, record in _entries(source):
                run = min((cap for offset, cap in self._caps if end <= offset), default=marked)
                if keep is None or keep(min(run, marked), record.key):
                    self.handed_out += 1
                    self.handed_out_bytes += len(record.value or b"")
                    yield record

    def close(self) -> None:
        """Close the file, leaving it for the next run to resume its read with (:meth:`reopen`).

        Records still buffered were never synced, so no group the log committed needs them (the next run
        cuts the file to the log's watermark): a flush the operating system refuses here (a full disk)
        is not raised over the error that ended the run."""
        try:
            self._file.close()
        except OSError:
            pass

    def discard(self) -> None:
        """Close and delete the file."""
        self.close()
        self.path.unlink(missing_ok=True)
