"""The embedded log's group commit: a group's records written a chunk at a time, its watermark made
durable with the segments it touched and then published; a group that fails part-way cut back.

Write path (writer only): :meth:`~log_store.store.LogStore.append_group` reads its records once, in chunks
of ``APPEND_CHUNK`` records (:mod:`log_store.store`): each chunk is placed (Kafka's murmur2 partitioner, round-robin for keyless
records), checked and encoded for every partition it touches (one or more batches each) before any of
it is written, then written, so memory stays bounded whatever the group's size and a bad record never
leaves part of its chunk on disk. After the last chunk a new watermark record (the group's opaque
``position`` and the end offset of *every* topic-partition) is written, the writeback of it and of the
touched segments is started from the writer's thread, and all of them are made durable with concurrent
``fdatasync`` calls (one on the writer's thread, the others on a small pool, :mod:`log_store.sync_pool`);
only then is the watermark published to readers (``watermark.pub``).

Per group the work is a fixed number of C-level passes over the records' fields (no Python code per
record, no per-record allocation the garbage collector tracks), the byte columns of each batch are
handed to one ``writev`` as they are, and the system calls are: one ``writev`` per batch, one small
``write`` (the watermark record), one ``sync_file_range`` and one ``fdatasync`` per file written, and the
``pwrite`` of the published slot (plus an 8-byte index ``write`` when an index entry is due, and one more
``sync_file_range`` every ``writeback_bytes`` a partition writes, see :meth:`~log_store.partition.Partition.write`).
The group is durable and visible when the call returns, and never visible in part: readers stop at the
previous watermark until then, and after a crash the next writer's recovery (:mod:`log_store.recovery`)
cuts everything past the last watermark whose data is whole, so a group cut mid-way disappears whole.
If a record of a later chunk fails validation, or the records' iterator raises, the chunks already
written are cut back to the last watermark (the same recovery, in process) and the log stays usable. If
a write fails half-way the store refuses further appends until it is reopened (recovery then cuts the
partial group).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from itertools import islice
from pathlib import Path

from log_store.config import LogConfig
from log_store.log_loader import LogLoader
from log_store.partition import Partition
from log_store.placement import ChunkEncoder
from log_store.producer_columns import ProducerColumns
from log_store.record import ProducerRecord, TopicPartition
from log_store.recovery import PartitionCut
from log_store.sync_pool import SyncPool
from log_store.topic import TopicConfig
from log_store.watermark import Watermark, WatermarkLog

log = logging.getLogger("log_store")


class GroupCommit:
    """The write path of :class:`~log_store.store.LogStore`, its base: the store's state it uses is
    declared here and set by the store's constructor. Called under the store's lock, by the writer only."""

    root: Path
    config: LogConfig
    _topics: dict[str, TopicConfig]
    _partitions: dict[TopicPartition, Partition]
    _watermarks: WatermarkLog
    _encoder: ChunkEncoder
    _failed: BaseException | None
    _sync_pool: SyncPool | None

    def _loader(self) -> LogLoader:
        return LogLoader(self.root, self.config, self._topics, self._partitions, self._watermarks)

    def _write_chunks(
        self, records: Iterable[ProducerRecord | ProducerColumns], chunk_records: int, now: int
    ) -> dict[TopicPartition, None]:
        """Write ``records`` a chunk at a time, each chunk placed and encoded whole before any of it is
        written; the partitions written to, in order. Nothing of it is visible yet."""
        # a list or tuple that fits one chunk is used as it is (no copy); anything else is read
        # chunk by chunk
        whole: Sequence[ProducerRecord | ProducerColumns] | None = None
        if isinstance(records, (list, tuple)) and len(records) <= chunk_records:
            whole = records
        iterator = iter(() if whole is not None else records)
        touched: dict[TopicPartition, None] = {}
        while True:
            try:
                if whole is not None:
                    chunk, whole = whole, ()
                else:
                    chunk = list(islice(iterator, chunk_records))
                encoded = self._encoder.encode_chunk(chunk, now) if chunk else []
            except BaseException:
                # The records themselves failed (a bad record, or the producer's iterator
                # raised): written chunks are cut back to the last watermark, the log stays usable.
                if touched:
                    self._undo_partial_group()
                raise
            if not chunk:
                return touched
            del chunk
            try:
                for partition, batches in encoded:
                    partition.write(batches, now)
                    touched[partition.tp] = None
            except BaseException as exc:
                self._failed = exc
                raise
            del encoded

    def _commit(self, position: str, now: int, touched: dict[TopicPartition, None]) -> Watermark:
        """The group's watermark at ``position``, made durable with the ``touched`` segments, then
        published to readers; a failure fails the writer."""
        try:
            previous = self._watermarks.current
            watermark = Watermark(
                (previous.sequence + 1) if previous is not None else 1,
                position,
                now,
                {tp: partition.next_offset for tp, partition in self._partitions.items()},
            )
            self._make_durable([self._partitions[tp] for tp in touched], watermark)
            self._watermarks.publish(watermark)
        except BaseException as exc:
            self._failed = exc
            raise
        return watermark

    def _make_durable(self, touched: list[Partition], watermark: Watermark) -> None:
        """Write ``watermark``'s record and make it and the ``touched`` segments durable.

        The record is written, this thread starts the writeback of every one of these files (so
        that their blocks are allocated in one journal transaction, see
        :func:`~log_store.atomic_file.start_writeback`), and then all of them are made durable
        concurrently (recovery drops a last watermark whose data did not make it; readers learn of it
        only when this returned): the first segment's ``fdatasync`` on this thread, the watermark's
        and the other segments' on pool threads started just before it. Returns only when every call
        finished, and raises the first error any of them raised.
        """
        self._watermarks.write(watermark)
        if not touched:
            self._watermarks.sync()
            return
        for partition in touched:
            partition.start_writeback()
        self._watermarks.start_writeback()
        pool = self._syncer()
        jobs = [pool.start(self._watermarks.sync)]
        jobs += [pool.start(partition.sync) for partition in touched[1:]]
        error: BaseException | None = None
        try:
            touched[0].sync()
        except BaseException as exc:
            error = exc
        for job in jobs:
            try:
                job.wait()
            except BaseException as exc:
                error = error or exc
        if error is not None:
            raise error

    def _undo_partial_group(self) -> None:
        """Cut every partition back to the current watermark (the writer's recovery, in process)."""
        try:
            for partition in self._partitions.values():
                partition.close()
            self._partitions.clear()
            cuts: list[PartitionCut] = []
            self._loader().recover_partitions(self._watermarks.current, False, False, cuts, [])
            log.warning(
                "an append group failed part-way; cut back to the last watermark: %s",
                ", ".join(f"{cut.tp} ({cut.truncated_records} records)" for cut in cuts),
            )
        except BaseException as exc:
            self._failed = exc
            raise

    def _syncer(self) -> SyncPool:
        if self._sync_pool is None:
            self._sync_pool = SyncPool(workers=4)
        return self._sync_pool
