"""Compaction, the pure algorithm: keep the latest record of every key, fold partial records.

Given the records of a partition's cleanable range (sealed segments below the watermark), in offset
order, the cleaner works in two passes:

1. :func:`build_offset_map` maps every key to the offset of its latest record in the range, and notes
   the keys whose latest record carries the ``unchanged`` header (a partial row);
2. :meth:`Cleaner.clean_batch` rewrites each batch keeping only:

   * records whose offset is their key's latest (original offsets are kept: batches keep their base
     offset and offset span, so no offset is ever reused or renumbered);
   * keyless records (they cannot be superseded);
   * for a tombstone (null value), only while ``now - append time < delete_retention_ms``; after that it
     goes too, and with it the key;
   * a latest partial record is *folded*: the columns it names as unchanged are copied from the key's
     previous value (full, or itself folded from earlier records), the header is dropped. When there is
     no previous value, or the fold function refuses (:class:`~log_store.errors.FoldError`), the record
     is kept exactly as written, header included. Without a fold function (:attr:`LogConfig.fold`) every
     record of such a key is kept: the log cannot tell which of their fields still count.

Records of other keys never affect each other. A batch whose records all survive unchanged is returned
as its original bytes. Both passes decide a batch of keyed records none of whose keys is due a fold
with C-level maps over its columns (``dict.update``, ``map(dict.get, ...)``); other batches are walked
record by record, with the same result. The cleaner does no I/O; :mod:`log_store.log_cleaner` reads segments, writes the
side files and swaps them in.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import compress, repeat
from operator import and_, eq, is_not, itemgetter

from log_store.batch_encoding import encode_records
from log_store.errors import FoldError
from log_store.fold import FoldFunction, parse_unchanged
from log_store.record import UNCHANGED_HEADER, Headers, Record
from log_store.record_batch import BatchHeader

_OFFSET, _KEY, _VALUE, _HEADERS = itemgetter(2), itemgetter(3), itemgetter(4), itemgetter(6)


def _is_partial(record: Record) -> bool:
    return bool(record.headers) and any(name == UNCHANGED_HEADER for name, _ in record.headers)


@dataclass
class OffsetMap:
    """Latest offset per key in the cleanable range, and the keys whose latest record is partial."""

    latest: dict[bytes, int] = field(default_factory=dict)
    partial: set[bytes] = field(default_factory=set)

    def add_columns(self, offsets: list[int], keys: list[bytes | None], headers: Sequence[Headers]) -> None:
        """Account for one batch's records given as columns (see :func:`decode_columns`)."""
        if not any(headers) and None not in keys:
            # the common batch (keyed, no headers) in C: later offsets overwrite earlier ones
            self.latest.update(zip(keys, offsets, strict=True))  # type: ignore[arg-type]
            if self.partial:
                self.partial.difference_update(keys)
            return
        self.add(
            [Record("", 0, offset, key, None, 0, header) for offset, key, header in zip(offsets, keys, headers, strict=True)]
        )

    def add(self, records: Iterable[Record]) -> None:
        """Account for records, in offset order."""
        latest, partial = self.latest, self.partial
        if isinstance(records, list):
            keys = list(map(_KEY, records))
            if not any(map(_HEADERS, records)) and None not in keys:
                # the common batch (keyed, no headers) in C: later offsets overwrite earlier ones
                latest.update(zip(keys, map(_OFFSET, records), strict=True))
                if partial:
                    partial.difference_update(keys)
                return
        for record in records:
            key = record.key
            if key is None:
                continue
            latest[key] = record.offset
            if record.headers and _is_partial(record):
                partial.add(key)
            elif partial:
                partial.discard(key)


def build_offset_map(records: Iterable[Record]) -> OffsetMap:
    """The :class:`OffsetMap` of ``records`` (in offset order)."""
    offset_map = OffsetMap()
    offset_map.add(records)
    return offset_map


@dataclass
class CleanerStats:
    """Counts of one cleaning run."""

    records_read: int = 0
    records_kept: int = 0
    tombstones_removed: int = 0
    folded: int = 0
    fold_failures: int = 0
    batches_rewritten: int = 0


class Cleaner:
    """Rewrites batches against an :class:`OffsetMap` (second pass; records in offset order)."""

    def __init__(self, offset_map: OffsetMap, *, now_ms: int, delete_retention_ms: int, fold: FoldFunction | None) -> None:
        self.offset_map = offset_map
        self.now_ms = now_ms
        self.delete_retention_ms = delete_retention_ms
        self.fold = fold
        self.stats = CleanerStats()
        # key -> (value so far, whether it is a full row) for keys whose latest record is partial
        self._running: dict[bytes, tuple[bytes | None, bool]] = {}

    def _track(self, record: Record) -> Record:
        """Update the running value of a fold key; return the record to emit if it is the latest."""
        key = record.key
        assert key is not None
        previous, full = self._running.get(key, (None, False))
        if record.value is None:
            self._running[key] = (None, False)
            return record
        if not _is_partial(record):
            self._running[key] = (record.value, True)
            return record
        if previous is None or not full:
            self._running[key] = (record.value, False)
            return record
        header = record.header(UNCHANGED_HEADER)
        assert header is not None and self.fold is not None
        try:
            folded = self.fold(previous, record.value, parse_unchanged(header))
        except FoldError:
            self.stats.fold_failures += 1
            self._running[key] = (record.value, False)
            return record
        self._running[key] = (folded, True)
        headers = tuple(h for h in record.headers if h[0] != UNCHANGED_HEADER)
        return record._replace(value=folded, headers=headers)

    def clean_batch(self, header: BatchHeader, raw: bytes, records: list[Record]) -> bytes | None:
        """The cleaned batch (``raw`` itself when nothing changed), or ``None`` when nothing is left."""
        expired = self.now_ms - header.append_time_ms >= self.delete_retention_ms
        kept = self._kept_without_folds(records, expired)
        if kept is None:
            return self._clean_records(header, raw, records, expired)
        self.stats.records_read += len(records)
        self.stats.records_kept += len(kept)
        if not kept:
            return None
        if len(kept) == len(records):
            return raw
        self.stats.batches_rewritten += 1
        return encode_records(header.base_offset, header.last_offset_delta, kept, header.append_time_ms)

    def _kept_without_folds(self, records: list[Record], expired: bool) -> list[Record] | None:
        """The records to keep, decided with C-level maps, for the common batch: every record keyed
        and none of its keys due a fold. ``None`` for any other batch (the caller walks it)."""
        latest, partial = self.offset_map.latest, self.offset_map.partial
        keys = list(map(_KEY, records))
        if partial and not partial.isdisjoint(keys):
            return None
        latest_offsets = list(map(latest.get, keys))
        if None in latest_offsets:  # a keyless record (or a key outside the map): walk the batch
            return None
        keep = list(map(eq, latest_offsets, map(_OFFSET, records)))
        if expired:
            values = list(map(_VALUE, records))
            if None in values:
                latest_flags = keep
                keep = list(map(and_, latest_flags, map(is_not, values, repeat(None))))
                self.stats.tombstones_removed += sum(latest_flags) - sum(keep)
        return list(compress(records, keep))

    def _clean_records(self, header: BatchHeader, raw: bytes, records: list[Record], expired: bool) -> bytes | None:
        """:meth:`clean_batch` record by record (keyless records, folds)."""
        latest, partial = self.offset_map.latest, self.offset_map.partial
        kept: list[Record] = []
        changed = False
        for record in records:
            key = record.key
            if key is None:
                kept.append(record)
                continue
            emitted = record
            if key in partial:
                if self.fold is None:  # nothing can be folded, so nothing of the key may go
                    kept.append(record)
                    continue
                emitted = self._track(record)
            if latest.get(key) != record.offset:
                changed = True
                continue
            if record.value is None and expired:
                self.stats.tombstones_removed += 1
                changed = True
                continue
            if emitted is not record:
                self.stats.folded += 1
                changed = True
            kept.append(emitted)
        self.stats.records_read += len(records)
        self.stats.records_kept += len(kept)
        if not kept:
            return None
        if not changed:
            return raw
        self.stats.batches_rewritten += 1
        return encode_records(header.base_offset, header.last_offset_delta, kept, header.append_time_ms)
