"""What ``cdc views`` shows: every view table, what it holds, where it lives and what it is as of.

Read without Spark: the captured tables come from the schema topic (read in this process), each
table's as-of point from its newest Delta commit's progress and its position file (``deltalake``,
:func:`~derived_views.runs.status.table_progress`), so the listing answers in well under a second and
works while a sync runs.

The listing is also what a view must have: ``cdc lag`` and ``cdc wait`` judge a view by every table it
lists, so a table its first sync has not created yet holds the view back (it is not synced), instead of
being left out.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from derived_views.definitions import ViewDefinitions
from derived_views.engine.maintenance import MaintenancePolicy
from derived_views.engine.progress import Progress
from derived_views.engine.table_health import TableHealth, table_health
from derived_views.errors import ViewsFileError
from derived_views.events.column_names import stored_columns
from derived_views.events.schema import TableSchema, schemas_topic
from derived_views.runs.status import readable_progress
from derived_views.source.log_location import LogLocation
from derived_views.source.schema_records import read_schemas
from derived_views.source.watermark import read_watermark
from derived_views.views import kinds
from derived_views.views.composite import SourceTable, checked, source_tables
from log_store.topic_names import dir_name

log = logging.getLogger("cdc.views")


@dataclass(frozen=True)
class ViewTable:
    """One Delta table of a view: what it holds, its path, the LSN it is as of (``None``: not synced yet)."""

    view: str
    holds: str
    path: str
    as_of_lsn: str | None
    stored_columns: dict[str, str] = field(default_factory=dict)
    """``{source column: the name the table stores it under}`` for names stored under another name: names
    Delta refuses and case-only twins (:mod:`derived_views.events.column_names`); as the table holds them, or, for
    a column it does not hold yet, as its next sync will store it."""
    topics: tuple[str, ...] = ()
    """The log topics the table consumes."""
    progress: Progress = field(default_factory=Progress)
    """What the table has applied (empty: not synced yet)."""
    health: TableHealth | None = None
    """Its files, size, versions and last maintenance (``None``: no table yet, or unreadable)."""

    def shown(self) -> dict[str, Any]:
        """The table as ``cdc views --json`` shows it."""
        health = self.health
        return {
            "view": self.view,
            "holds": self.holds,
            "path": self.path,
            "as_of_lsn": self.as_of_lsn,
            "stored_columns": self.stored_columns,
            "files": health.files if health else None,
            "bytes": health.bytes if health else None,
            "version": health.version if health else None,
            "versions_since_compaction": health.versions_since_compaction if health else None,
            "compacted_at": health.compacted_at if health else None,
            "vacuumed_at": health.vacuumed_at if health else None,
        }


def _table(
    view: str, holds: str, path: Path, columns: Iterable[str] = (), topics: Iterable[str] = (), *, health: bool = False
) -> ViewTable:
    progress = readable_progress(path) if (path / "_delta_log").is_dir() else None
    as_of = f"{progress.lsn >> 32:X}/{progress.lsn & 0xFFFFFFFF:X}" if progress is not None and progress.position else None
    columns = list(columns)
    held = _columns(path) if (path / "_delta_log").is_dir() else []
    renamed = {name: stored for name, stored in stored_columns(columns, held).items() if stored != name}
    found = _health(path) if health and (path / "_delta_log").is_dir() else None
    return ViewTable(view, holds, str(path), as_of, renamed, tuple(sorted(set(topics))), progress or Progress(), found)


def _health(path: Path) -> TableHealth | None:
    """The table's health (``None``, with a warning, when its reader cannot open it)."""
    try:
        return table_health(str(path), MaintenancePolicy().small_file_bytes)
    except Exception as exc:  # noqa: BLE001 - deltalake raises its own error kinds for a damaged log
        log.warning("cannot read the files of the Delta table %s: %s", path, str(exc).splitlines()[0])
        return None


def _columns(path: Path) -> list[str]:
    """The column names of the Delta table at ``path`` (from its log's newest schema, ``deltalake``); none,
    with a warning, when its reader cannot open it (a damaged log: the table's sync reports it)."""
    from deltalake import DeltaTable

    try:
        return [f.name for f in DeltaTable(str(path)).schema().fields]
    except Exception as exc:  # noqa: BLE001 - deltalake raises its own error kinds for a damaged log
        log.warning("cannot read the columns of the Delta table %s: %s", path, str(exc).splitlines()[0])
        return []


def captured_tables(location: LogLocation | str, prefix: str) -> list[TableSchema]:
    """Every table the log describes, by name (none before the first capture)."""
    location = LogLocation.of(location)
    watermark = read_watermark(location) if location.exists() else None
    if watermark is None:
        return []
    topic = schemas_topic(prefix)
    return sorted(read_schemas(location, topic, watermark.offsets.get(topic, {})).values(), key=lambda s: s.dotted_name)


def view_tables(
    views_dir: Path, captured: list[TableSchema], definitions: ViewDefinitions, *, lenient: bool = False, health: bool = False
) -> list[ViewTable]:
    """Every table of every view: the warehouse's for the ``captured`` tables the definitions keep, then
    each search index's and cache entity's (and the copies of the tables they read, their own or the
    warehouse's current tables, once the log names those tables).

    The definitions are checked against the ``captured`` tables first (:func:`derived_views.views.composite.checked`);
    ``lenient``: a views file that does not fit them lists each index's and entity's own tables only;
    ``health``: each table's files, size, versions and last maintenance are read too."""
    tables = _warehouse_tables(views_dir, captured, definitions, health=health)
    try:
        plans = {plan.view: plan for plan in checked(definitions, source_tables(captured))} if captured else {}
    except ViewsFileError:
        if not lenient:
            raise
        plans = {}
    topic_of = {schema.log_name: schema.topic for schema in captured}
    for kind, outputs_of, names in (
        (kinds.SEARCH, kinds.SEARCH_TABLES, definitions.search),
        (kinds.CACHE, kinds.CACHE_TABLES, definitions.cache),
    ):
        for name, definition in names.items():
            view = f"{kind}.{name}"
            outputs = plans[view].output_columns if view in plans and kind == kinds.SEARCH else ()
            read = plans[view].tables if view in plans else ()
            for table, holds in outputs_of.items():
                tables.append(
                    _table(
                        view,
                        holds.replace("root row", f"{definition.root} row"),
                        views_dir / kind / name / table,
                        outputs if table == "documents" else (),
                        [topic_of[source.log_name] for source in read if source.log_name in topic_of],
                        health=health,
                    )
                )
            for source in read:
                tables.append(
                    _read_table(views_dir, definitions, kind, name, view, source, topic_of.get(source.log_name), health)
                )
    return tables


def tables_of(tables: list[ViewTable], view: str) -> list[ViewTable]:
    """The tables of ``view``: a view's name, or a kind (``search``, ``cache``) for every view of it."""
    return [table for table in tables if table.view == view or table.view.startswith(f"{view}.")]


def view_as_of_lsn(tables: list[ViewTable]) -> int | None:
    """The commit LSN a view whose tables are ``tables`` is as of (its least advanced table); ``None`` when
    it has none or one of them is not synced yet."""
    if not tables or any(not table.progress.position for table in tables):
        return None
    return min(table.progress.lsn for table in tables)


def _warehouse_tables(
    views_dir: Path, captured: list[TableSchema], definitions: ViewDefinitions, *, health: bool
) -> list[ViewTable]:
    """The warehouse's current (and, where kept, history) table of each captured table it keeps."""
    tables = []
    for schema in captured:
        qualified = schema.dotted_name
        if not definitions.warehouse.keeps(qualified):
            continue
        for kind in ("current", "history"):
            if kind == "history" and not definitions.warehouse.keeps_history(qualified):
                continue
            path = views_dir / kinds.WAREHOUSE / kind / dir_name(schema.log_name)
            tables.append(_table(kinds.WAREHOUSE, f"{qualified} ({kind})", path, schema.names, [schema.topic], health=health))
    return tables


def _read_table(
    views_dir: Path,
    definitions: ViewDefinitions,
    module: str,
    name: str,
    view: str,
    source: SourceTable,
    topic: str | None,
    health: bool,
) -> ViewTable:
    """A source table a search index or cache entity reads: the warehouse's current table when the
    warehouse keeps it, else the view's own copy."""
    topics = [topic] if topic else []
    if definitions.warehouse.keeps(source.dotted_name):
        path = views_dir / kinds.WAREHOUSE / "current" / dir_name(source.log_name)
        return _table(view, f"reads {source.dotted_name} (current)", path, source.columns, topics, health=health)
    path = views_dir / module / name / "_state" / dir_name(source.log_name)
    return _table(view, f"copy of {source.dotted_name}", path, source.columns, topics, health=health)
