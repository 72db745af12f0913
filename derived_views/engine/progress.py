"""What each Delta table of a view has applied, stored in the same Delta commit as the data.

Every commit that applies log events to a view table carries, as its commit-info ``userMetadata``, the
JSON text of a :class:`Progress`: the next log offset of every topic-partition the table consumes, and
the commit watermark those offsets belong to (its LSN as ``"%016X"`` and its time). Data and offsets are
therefore one atomic Delta commit: after a crash, the table's newest commit that carries progress tells
exactly which events are in it, and the next sync reads from there. Commits without progress (schema
changes, table creation, maintenance) are skipped when looking it up.

This is also the view's as-of watermark (promise 5): ``cdc`` reads it with :func:`read_progress`. A step
that has nothing to apply to a table records its newer watermark without a commit, in a file beside its
log (:mod:`derived_views.engine.positions`): :func:`~derived_views.engine.positions.table_position` reads both.

A commit's progress also bounds the positions its data is exact as of, for reads of older versions
(:mod:`derived_views.engine.exact_versions`): :attr:`Progress.since`, the commit LSN of the newest event the
data holds (the data equals the source as of every position from there to :attr:`Progress.position`),
and :attr:`Progress.prior`, the position the table's previous data was last recorded exact as of (its
position file's, when a step left it idle before this commit).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: Spark session setting whose value Delta writes as the next commit's ``userMetadata``.
USER_METADATA_CONF = "spark.databricks.delta.commitInfo.userMetadata"

#: Delta write option with the same effect for one write, over the session setting.
USER_METADATA_OPTION = "userMetadata"

_MARK = "cdc-progress"
_LOOKBACK = 100


@dataclass(frozen=True)
class Progress:
    """Applied position of one table: next offsets per topic-partition plus the watermark they end at."""

    offsets: dict[str, dict[str, int]] = field(default_factory=dict)
    position: str = ""
    watermark_ts_ms: int = 0
    definition: str = ""
    """Fingerprint of the views-file definition the table was computed with (search indexes and cache
    entities, :attr:`derived_views.views.composite.Composite.fingerprint`; empty for other tables)."""
    base: str = ""
    """Position of the commit this progress extends when it was recorded without a commit of its own, in
    the table's position file (:mod:`derived_views.engine.positions`); empty when a commit carries it."""
    since: str = ""
    """Commit LSN (``"%016X"``) of the newest event the table's data holds: no event of its topics lies
    after it up to :attr:`position`, so the data is exact as of every position in between. Empty when
    the step did not learn it (a rebuild in one pass, a commit of an earlier version): :attr:`position`
    alone is known."""
    prior: str = ""
    """The position the table's previous data (as its preceding commit with progress left it) was last
    recorded exact as of when this commit replaced it: that data holds for every position from its own
    commit's up to this one. Empty for a table's first commit and for a rebuild."""

    @property
    def lsn(self) -> int:
        """As-of commit LSN (0 before the first sync)."""
        return int(self.position, 16) if self.position else 0

    @property
    def since_lsn(self) -> int:
        """The commit LSN of the newest event the data holds (:attr:`since`; the as-of LSN when unknown)."""
        return int(self.since, 16) if self.since else self.lsn

    def next_offset(self, topic: str, partition: str) -> int:
        """First offset of ``topic``/``partition`` not yet applied."""
        return int(self.offsets.get(topic, {}).get(partition, 0))

    def to_json(self) -> str:
        """The ``userMetadata`` text."""
        data: dict[str, Any] = {
            _MARK: 1,
            "position": self.position,
            "watermark_ts_ms": self.watermark_ts_ms,
            "offsets": self.offsets,
        }
        if self.definition:
            data["definition"] = self.definition
        if self.since:
            data["since"] = self.since
        if self.prior:
            data["prior"] = self.prior
        return json.dumps(
            data,
            sort_keys=True,
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str | None) -> Progress | None:
        """Parse ``userMetadata``; ``None`` when the commit carries no progress."""
        if not text:
            return None
        try:
            data: dict[str, Any] = json.loads(text)
        except json.JSONDecodeError:
            return None
        if not isinstance(data, dict) or _MARK not in data:
            return None
        return cls(
            offsets={t: {p: int(o) for p, o in parts.items()} for t, parts in data["offsets"].items()},
            position=str(data.get("position", "")),
            watermark_ts_ms=int(data.get("watermark_ts_ms", 0)),
            definition=str(data.get("definition", "")),
            since=str(data.get("since", "")),
            prior=str(data.get("prior", "")),
        )


def min_offsets(progresses: list[Progress], topics: list[str]) -> dict[str, dict[str, int]]:
    """Per topic-partition, the smallest next offset over ``progresses`` (where a shared read must start)."""
    out: dict[str, dict[str, int]] = {topic: {} for topic in topics}
    for topic in topics:
        partitions = {p for progress in progresses for p in progress.offsets.get(topic, {})}
        for partition in partitions:
            out[topic][partition] = min(progress.next_offset(topic, partition) for progress in progresses)
    return out


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
