"""The progress each Delta commit of a view table carries, stored in the same commit as the data.

Every commit that applies log events to a view table carries, as its commit-info ``userMetadata``, the
JSON text of a :class:`~derived_views.engine.progress.Progress`: the next log offset of every
topic-partition the table consumes, and the commit watermark those offsets belong to. Data and offsets
are therefore one atomic Delta commit: after a crash, the table's newest commit that carries progress
tells exactly which events are in it, and the next sync reads from there. Commits without progress
(schema changes, table creation, maintenance) are skipped when looking it up.

This is also the view's as-of watermark (promise 5): ``cdc`` reads it with :func:`read_progress`. A step
that has nothing to apply to a table records its newer watermark without a commit, in a file beside its
log (:mod:`derived_views.engine.positions`): :func:`~derived_views.engine.positions.table_position` reads both.

The value itself is pure and lives in :mod:`derived_views.engine.progress`; this module is what Spark
and Delta do with it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from derived_views.engine.progress import Progress

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: Spark session setting whose value Delta writes as the next commit's ``userMetadata``.
USER_METADATA_CONF = "spark.databricks.delta.commitInfo.userMetadata"

#: Delta write option with the same effect for one write, over the session setting.
USER_METADATA_OPTION = "userMetadata"

_LOOKBACK = 100


def read_progress(spark: SparkSession, path: str) -> Progress | None:
    """The progress of the table at ``path``'s newest commit that has one; ``None`` if there is no table,
    an empty :class:`Progress` when none of its commits has one.

    A table on local disk is read with ``deltalake`` (:func:`committed_progress`: tens of milliseconds,
    where Spark's ``DESCRIBE HISTORY`` takes about a second); other stores through Spark, which holds
    their credentials. Both read the same commits of the Delta log."""
    from derived_views.engine.delta_sql import history, is_delta_table, is_local

    if is_local(path):
        from deltalake import DeltaTable as LocalTable

        local = path.removeprefix("file://")
        return (committed_progress(local) or Progress()) if LocalTable.is_deltatable(local) else None
    if not is_delta_table(spark, path):
        return None
    recent = history(spark, path, _LOOKBACK).select("version", "userMetadata").collect()
    for row in sorted(recent, key=lambda r: -r["version"]):
        progress = Progress.from_json(row["userMetadata"])
        if progress is not None:
            return progress
    if len(recent) == _LOOKBACK:
        for row in history(spark, path).orderBy("version", ascending=False).collect():
            progress = Progress.from_json(row["userMetadata"])
            if progress is not None:
                return progress
    return Progress()


def committed_progress(path: str) -> Progress | None:
    """The progress of the newest commit that has one of the Delta table at ``path`` (read with
    ``deltalake``: no JVM, no Spark job; any store ``deltalake`` opens); ``None`` when none has."""
    from deltalake import DeltaTable

    table = DeltaTable(path)
    for limit in (_LOOKBACK, None):
        history = table.history(limit)
        for commit in sorted(history, key=lambda c: -int(c.get("version", 0))):
            progress = Progress.from_json(commit.get("userMetadata"))
            if progress is not None:
                return progress
        if limit is not None and len(history) < limit:
            break
    return None


_SESSION_LOCKS: dict[int, threading.Lock] = {}
_SESSION_LOCKS_GUARD = threading.Lock()


def _session_lock(spark: SparkSession) -> threading.Lock:
    with _SESSION_LOCKS_GUARD:
        return _SESSION_LOCKS.setdefault(id(spark), threading.Lock())


@contextmanager
def committing(spark: SparkSession, progress: Progress | None) -> Iterator[None]:
    """Within the block, Delta commits carry ``progress`` (or no progress) as their ``userMetadata``.

    The setting is session-wide, so the blocks of one session that commit to view tables are
    serialized across threads: a commit can never pick up another table's progress (blocks of
    different sessions, see :meth:`~derived_views.write.context.ViewContext.beside`, run side by side).
    Reading and reducing batches runs outside these blocks, concurrently, and so do writes through a
    ``DataFrameWriter`` that carry their progress as the :data:`USER_METADATA_OPTION` write option (see
    :func:`with_progress`), which Delta takes over the session setting.
    """
    with _session_lock(spark):
        if progress is None:
            spark.conf.unset(USER_METADATA_CONF)
        else:
            spark.conf.set(USER_METADATA_CONF, progress.to_json())
        try:
            yield
        finally:
            spark.conf.unset(USER_METADATA_CONF)


def with_progress(writer: Any, progress: Progress) -> Any:
    """A Delta ``DataFrameWriter`` whose commit carries ``progress`` as its ``userMetadata`` (whatever the
    session setting says at that moment, so it needs no :func:`committing` block)."""
    return writer.option(USER_METADATA_OPTION, progress.to_json())
