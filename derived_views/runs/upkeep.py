"""Which view tables need maintenance, and when a continuous sync does it.

The tasks themselves (compaction, vacuum; checkpoints are Delta's) are
:mod:`derived_views.engine.maintenance`; here they are found for every Delta table of the chosen views
(current, history, dead-letter, index, entity and copy tables) and handed out one at a time.

**Scheduling.** A continuous sync (:func:`derived_views.runs.runner.continuous`) looks at its tables'
health every :attr:`~derived_views.engine.maintenance.MaintenancePolicy.interval_s` seconds and queues
the tasks due. It does them in its own loop, between steps, one table's task at a time: after each step
at most one task, and while the log is idle one task per poll, the watermark read again before the next.
So maintenance never runs beside a step (no Delta conflict with the view's own writes), and a change
reaching the log waits at most for one table's task besides the step that applies it.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from derived_views.engine.delta_sql import is_local
from derived_views.engine.maintenance import COMPACT, MaintenancePolicy, Task, tasks_for
from derived_views.engine.table_health import TableHealth, table_health
from derived_views.runs.status import delta_tables
from derived_views.source.watermark import LogWatermark
from derived_views.views import cache, search, warehouse
from derived_views.write.context import ViewContext
from derived_views.write.failures import summary

log = logging.getLogger("cdc.views")


def view_table_paths(ctx: ViewContext, names: list[str], watermark: LogWatermark | None) -> list[str]:
    """Every Delta table of the views ``names``: each table below their directories on local disk; on
    object storage the warehouse's current and history tables of the tables captured as of ``watermark``,
    and each index's and entity's own tables."""
    paths: list[str] = []
    for name in names:
        directory = ctx.path(*name.split(".", 1))
        if is_local(directory):
            paths.extend(str(table) for table in delta_tables(Path(directory.removeprefix("file://"))))
        elif name == warehouse.NAME:
            kept = [
                n
                for n, s in (ctx.schemas(watermark) if watermark else {}).items()
                if ctx.definitions.warehouse.keeps(s.dotted_name)
            ]
            paths.extend(warehouse.current_path(ctx, table) for table in kept)
            paths.extend(warehouse.history_path(ctx, table) for table in kept)
        else:
            kind = name.split(".", 1)[0]
            paths.extend(f"{directory}/{table}" for table in (search.TABLES if kind == search.NAME else cache.TABLES))
    return paths


def matching(paths: list[str], views_dir: str, wanted: list[str]) -> list[str]:
    """The ``paths`` named by ``wanted``: a table's path relative to the views directory
    (``warehouse/current/public.orders``), or a directory above tables (``warehouse/history``); all when empty."""
    if not wanted:
        return paths
    root = views_dir.rstrip("/") + "/"
    prefixes = [name.strip("/") for name in wanted]
    return [
        path
        for path in paths
        if any(path[len(root) :] == prefix or path[len(root) :].startswith(f"{prefix}/") for prefix in prefixes)
    ]


def health_of(paths: list[str], policy: MaintenancePolicy) -> dict[str, TableHealth]:
    """The health of each table at ``paths`` (:mod:`derived_views.engine.table_health`); a table that cannot
    be read is left out, with a warning."""
    found: dict[str, TableHealth] = {}
    for path in paths:
        try:
            found[path] = table_health(path, policy.small_file_bytes)
        except Exception as exc:  # noqa: BLE001 - one unreadable table must not stop the others' maintenance
            log.warning("cannot read the health of the view table %s: %s", path, summary(exc))
    return found


def tasks_due(health: dict[str, TableHealth], policy: MaintenancePolicy) -> list[Task]:
    """The tasks due on the tables whose ``health`` is known, compactions first (a vacuum after them
    removes the files they replaced once those age past the retention); a table whose old files cannot be
    read is skipped, with a warning."""
    tasks: list[Task] = []
    for path, table in health.items():
        try:
            tasks.extend(tasks_for(path, policy, table))
        except Exception as exc:  # noqa: BLE001 - one unreadable table must not stop the others' maintenance
            log.warning("cannot read the health of the view table %s: %s", path, summary(exc))
    return sorted(tasks, key=lambda task: task.action != COMPACT)


def due_tasks(paths: list[str], policy: MaintenancePolicy) -> list[Task]:
    """The tasks due on the tables at ``paths`` (:func:`tasks_due`)."""
    return tasks_due(health_of(paths, policy), policy)


@dataclass
class Upkeep:
    """The maintenance a continuous sync does between its steps (see the module docstring), and the
    tables' health it reads for it, handed to ``on_health`` after each look and each task. With
    ``maintain`` false it only reads the health, at the same interval."""

    policy: MaintenancePolicy
    maintain: bool = True
    on_health: Callable[[list[TableHealth]], None] = lambda health: None
    queue: deque[Task] = field(default_factory=deque)
    next_check: float = 0.0
    health: dict[str, TableHealth] = field(default_factory=dict)

    def next_task(self, ctx: ViewContext, names: list[str], watermark: LogWatermark | None) -> Task | None:
        """The next task due, looking at the tables' health again once the interval has passed."""
        if not self.queue and time.monotonic() >= self.next_check:
            self.health = health_of(view_table_paths(ctx, names, watermark), self.policy)
            if self.maintain:
                self.queue.extend(tasks_due(self.health, self.policy))
            self.next_check = time.monotonic() + self.policy.interval_s
            self.on_health(list(self.health.values()))
        return self.queue.popleft() if self.queue else None

    def done(self, task: Task) -> None:
        """``task`` was done (or failed): its table's health is read again."""
        self.health.update(health_of([task.path], self.policy))
        self.on_health(list(self.health.values()))
