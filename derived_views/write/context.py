"""What a view needs to run one sync step: the session, where things live, source schemas, progress.

:class:`ViewContext` is built once per process (:func:`cdc.config.view_arguments.context_from_settings`) and
caches what only this process changes: each table's progress after it commits, and the source schemas
until the schema topic moves. The log is read only through :mod:`derived_views.source.log_source`.
"""

from __future__ import annotations

import queue
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from derived_views.definitions import ViewDefinitions
from derived_views.engine.positions import table_position
from derived_views.engine.progress import Progress
from derived_views.engine.spark_session import PARQUET_TIMESTAMPS, new_session
from derived_views.errors import SourceSchemaError
from derived_views.events.schema import TableSchema, schemas_topic
from derived_views.source.log_location import LogLocation
from derived_views.source.schema_records import read_schemas
from derived_views.source.watermark import LogWatermark, Offsets
from derived_views.write.table_evolution import TableTypes

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


#: Whether new tables get deletion vectors: off by default, so every Delta reader can open them (delta-rs,
#: hence ``deltalake``'s ``to_pandas()`` / ``to_pyarrow_table()``, pandas and Polars, refuses a table whose
#: protocol names that reader feature). On (``CDC_DELETION_VECTORS``), a MERGE marks the rows it replaces in
#: a small side file instead of rewriting every file it touches, so its cost follows the change; the tables
#: are then read by Spark (Delta 2.3 and later), Delta Kernel readers and ``deltalake``'s SQL
#: ``QueryBuilder`` (which the read-only commands use).
DELETION_VECTORS = "spark.databricks.delta.properties.defaults.enableDeletionVectors"

#: Whether new tables record Delta's Change Data Feed (``CDC_CHANGE_DATA_FEED``, off by default): each commit
#: then also writes the rows it inserted, updated (before and after) and deleted, which a user's Spark job
#: reads with ``readStream.option("readChangeFeed", "true")`` (or ``table_changes``) from the table's
#: first version on. It costs the MERGEs extra files; ``VACUUM`` removes those with the rest.
CHANGE_DATA_FEED = "spark.databricks.delta.properties.defaults.enableChangeDataFeed"

#: Session settings the views rely on: timestamps stored in microseconds
#: (:data:`~derived_views.engine.spark_session.PARQUET_TIMESTAMPS`), and these. Every MERGE source is a local
#: relation, a locally checkpointed batch or a Delta read, hence deterministic, so Delta need not
#: materialize it again. New view tables get a Delta checkpoint every 100 commits instead of 10: a
#: checkpoint is written by the commit that reaches it (a multi-second pause of that sync step), and a
#: view syncing continuously commits once per table and step. A write that changes no row (a MERGE that
#: matches nothing, an append of no row) still commits: its commit carries the table's new progress, which
#: Delta would otherwise drop with the empty commit, leaving the table to read the same events again.
SESSION_CONF = {
    "spark.databricks.delta.merge.materializeSource": "none",
    "spark.databricks.delta.skipRecordingEmptyCommits": "false",
    "spark.databricks.delta.properties.defaults.checkpointInterval": "100",
    # also in a session this process did not build (a Spark Connect server started with other settings)
    **PARQUET_TIMESTAMPS,
}


@dataclass
class ViewContext:
    """Shared state of the views run by one process."""

    spark: SparkSession
    views_dir: str
    log: LogLocation
    prefix: str
    _progress: dict[str, Progress] = field(default_factory=dict)
    definitions: ViewDefinitions = field(default_factory=ViewDefinitions)
    _schemas: dict[str, TableSchema] = field(default_factory=dict)
    _schemas_at: Offsets | None = None
    _beside: ViewContext | None = None
    deletion_vectors: bool = False
    """Whether tables this context creates use deletion vectors (``CDC_DELETION_VECTORS``, an opt-in: see
    :data:`DELETION_VECTORS`)."""
    change_data_feed: bool = False
    """Whether tables this context creates record the Change Data Feed (``CDC_CHANGE_DATA_FEED``, an opt-in:
    see :data:`CHANGE_DATA_FEED`)."""
    writer: str = field(default_factory=lambda: uuid.uuid4().hex)
    """This context's name as the last writer of tables other processes write too (see
    :func:`derived_views.runs.runner.shared_copies_lock`)."""
    _applying: dict[str, threading.Lock] = field(default_factory=dict)
    _lanes: queue.SimpleQueue[ViewContext] = field(default_factory=queue.SimpleQueue)
    _siblings: list[ViewContext] = field(default_factory=list)
    types: TableTypes = field(default_factory=TableTypes)
    """The view tables' columns as this context and its siblings know them (:mod:`derived_views.write.table_evolution`)."""

    def __post_init__(self) -> None:
        for key, value in SESSION_CONF.items():
            self.spark.conf.set(key, value)
        self.spark.conf.set(DELETION_VECTORS, "true" if self.deletion_vectors else "false")
        self.spark.conf.set(CHANGE_DATA_FEED, "true" if self.change_data_feed else "false")
        self._lanes.put(self)

    def beside(self) -> ViewContext:
        """A context for applying tables beside this one's, in a session of its own.

        A MERGE carries its progress in a session-wide setting (:func:`~derived_views.engine.commit_progress.committing`),
        so two MERGEs in one session wait for each other; in two sessions of the same Spark application
        (same context, shared cache) they run side by side. The progress this process committed is
        shared with this context, so both know every table's position.
        """
        if self._beside is None:
            self._beside = self._sibling()
        return self._beside

    def _sibling(self) -> ViewContext:
        """A context in a session of its own that shares this one's progress, definitions and locks."""
        sibling = ViewContext(
            new_session(self.spark),
            self.views_dir,
            self.log,
            self.prefix,
            self._progress,
            self.definitions,
            deletion_vectors=self.deletion_vectors,
            change_data_feed=self.change_data_feed,
            writer=self.writer,
            _applying=self._applying,
            types=self.types,
        )
        self._siblings.append(sibling)
        return sibling

    def keep_alive(self) -> None:
        """Send each Spark session of this context (its own, and its siblings') a request.

        A Spark Connect server drops a session after an hour without one
        (``spark.connect.session.manager.defaultSessionTimeout``); a continuous sync whose source is idle
        sends none while it only polls the watermark (:func:`derived_views.runs.runner.continuous`)."""
        self.spark.conf.get("spark.sql.session.timeZone")
        for sibling in self._siblings:  # a sibling's own siblings too: a lane's beside session
            sibling.keep_alive()

    @contextmanager
    def lane(self) -> Iterator[ViewContext]:
        """A context (this one, or one of its siblings) that no other thread uses until this one is done.

        Views applied side by side (:func:`derived_views.runs.runner.step`) each take a lane: a MERGE carries
        its progress in a session-wide setting, so no two threads may commit through one session."""
        try:
            lane = self._lanes.get_nowait()
        except queue.Empty:
            lane = self._sibling()
        try:
            yield lane
        finally:
            self._lanes.put(lane)

    @contextmanager
    def applying(self, path: str) -> Iterator[None]:
        """Hold this process's lock of the table at ``path`` while bringing it forward.

        Views applied side by side may read the same shared state copy (the warehouse's current table,
        :func:`derived_views.views.composite_sync.state_path`) and both find it behind: the second waits, then
        finds it current, so no range is applied twice (an insert-only batch is appended, not merged)."""
        with self._applying.setdefault(path, threading.Lock()):
            yield

    @property
    def schemas_topic(self) -> str:
        """The topic holding every source table's column list."""
        return schemas_topic(self.prefix)

    def path(self, *parts: str) -> str:
        """A Delta table path below the views directory."""
        return "/".join([self.views_dir.rstrip("/"), *parts])

    def progress(self, path: str) -> Progress:
        """Applied progress of the table at ``path`` (empty when it does not exist)."""
        if path not in self._progress:
            self._progress[path] = table_position(self.spark, path) or Progress()
        return self._progress[path]

    def set_progress(self, path: str, progress: Progress) -> None:
        """Remember what this process just committed to ``path``."""
        self._progress[path] = progress

    def forget(self) -> None:
        """Drop cached progress and column types (another process may have written)."""
        self._progress.clear()
        self.types.forget()

    def schemas(self, watermark: LogWatermark) -> dict[str, TableSchema]:
        """Latest column list of every source table as of ``watermark``, by log name.

        The log name (``schema.table`` for plain names, :func:`log_store.topic_names.log_name`) is taken
        from the schema and table the record holds, never from its key, and the table's topic is the one
        the record names: two tables whose ``schema.table`` text is the same (a dot in a name) stay apart.
        """
        ends = watermark.offsets.get(self.schemas_topic, {})
        if self._schemas_at == {self.schemas_topic: ends}:
            return self._schemas
        schemas = read_schemas(self.log, self.schemas_topic, ends)
        self._schemas = schemas
        self._schemas_at = {self.schemas_topic: dict(ends)}
        return schemas

    def schema(self, watermark: LogWatermark, name: str) -> TableSchema:
        """One table's schema by log name (``schema.table`` for plain names); a clear error when capture has
        not described it."""
        schemas = self.schemas(watermark)
        if name not in schemas:
            raise SourceSchemaError(
                f"the schema topic {self.schemas_topic} has no columns for {name}: "
                f"check that {name} is captured (CDC_TABLES / the publication) and run `cdc capture`"
            )
        return schemas[name]
