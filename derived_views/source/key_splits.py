"""Key splits: one log partition reduced by several Spark tasks, each for its share of the keys.

A log partition is the unit of the per-key reduction (every event of a key is in it, in log order), so
a read of the log runs one task per partition, and Spark cores beyond the partition count sit idle: one
partition on 2 cores, or the default 3 on a cluster of 16. A partition can instead be read by
``splits`` tasks (:func:`splits_per_partition`): each reads the whole partition and keeps the records
of the keys whose hash falls in its split (:func:`records_of_split`). Every event of a key still meets
in one task, in log order, so the reduction of each split is the reduction of the partition restricted
to its keys, and the splits together yield the same rows.

Records that belong to no one key are *shared*: a truncate marker (keyless, or under a truncate key on
a log that places records by key) ends the earlier events of every key of its partition, so every split
reads it and reduces with it; so does any other keyless record. Shared rows are yielded by split 0 alone
(:func:`yielded_by_split`), so each one appears once.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from event_format import TRUNCATE_KEY_PREFIX

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: At most this many tasks read one partition: each reads the whole partition, so that reading is paid
#: once per split.
MAX_SPLITS = 4

_LOCAL_MASTER = re.compile(r"local\[(\d+|\*)(?:,\d+)?\]")


def task_slots(spark: SparkSession) -> int:
    """How many tasks ``spark`` runs at once: its default parallelism, or (over Spark Connect, where no
    context is at hand) ``spark.default.parallelism`` or the thread count of a ``local[N]`` master; 1
    when neither says."""
    import os

    from derived_views.engine.spark_session import is_remote

    if not is_remote(spark):
        return max(1, int(spark.sparkContext.defaultParallelism))
    given = spark.conf.get("spark.default.parallelism", None)
    if given and given.isdigit():
        return max(1, int(given))
    local = _LOCAL_MASTER.fullmatch(spark.conf.get("spark.master", None) or "")
    if local is None:
        return 1
    return max(1, os.cpu_count() or 1) if local.group(1) == "*" else max(1, int(local.group(1)))


def splits_per_partition(partitions: int, slots: int) -> int:
    """Splits per partition when the partitions alone would leave some of the ``slots`` idle: enough for
    a task per slot (1 partition on 2 slots: 2 splits; 3 on 8: 3), at most :data:`MAX_SPLITS`. With at
    least as many partitions as slots, none: the partitions keep every slot busy already, and splitting
    them would read each partition again for a shorter last round only (measured slower on 3 partitions
    and 2 slots)."""
    if partitions < 1 or partitions >= slots:
        return 1
    return min(MAX_SPLITS, -(-slots // partitions))


def _shared(keys: Any) -> Any:
    """Mask of the keys that belong to no one key: null, or a truncate marker's key."""
    import pyarrow.compute as pc

    marker = pc.starts_with(keys, pattern=TRUNCATE_KEY_PREFIX.decode())
    return pc.fill_null(marker, True)


def _split_of(keys: Any, splits: int) -> Any:
    """The split of every key (a null one counts as the empty key), as numpy ``int64``.

    The bits above the 16 lowest of Kafka's key hash are used, so the split is independent of the
    partition the hash's remainder chose, whatever the partition count."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from log_store import positive_hashes_arrow

    present = pc.fill_null(keys, "")
    if isinstance(present, pa.ChunkedArray):
        present = present.combine_chunks()
    return (positive_hashes_arrow(present) >> 16) % splits


def records_of_split(rows: Any, split: int, splits: int) -> Any:
    """The raw rows (an Arrow batch or table with a ``key`` column) split ``split`` of ``splits`` reads:
    those of its keys, and the shared ones."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if splits <= 1 or rows.num_rows == 0:
        return rows
    keys = rows.column("key")
    return rows.filter(pc.or_(pa.array(_split_of(keys, splits) == split), _shared(keys)))


def yielded_by_split(rows: Any, split: int) -> Any:
    """The reduced rows split ``split`` yields: all of them for split 0; the others leave the shared
    rows, which every split reduced, to split 0."""
    import pyarrow.compute as pc

    if split == 0 or rows.num_rows == 0:
        return rows
    return rows.filter(pc.invert(_shared(rows.column("key"))))
