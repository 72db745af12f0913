"""Run views: one sync step to the latest watermark, a continuous loop, and rebuild by replay.

A sync step reads the log's latest commit watermark once and brings every table of the chosen views to
it; each table commits its data together with its new progress, so a process killed at any point
resumes exactly (tables already at the watermark are skipped, the others re-read only what they lack).

One writer per view: a step, a continuous loop and a rebuild hold the view's lock file
(``<views dir>/_locks/<view>.lock``, an exclusive ``flock`` the kernel releases when the holder exits)
for as long as they write it, and a second process gets :class:`ViewBusyError` at once. Two processes
applying the same pending range would otherwise both see it as pending; a blind append (an
insert-only batch) would then land twice. The lock needs a local (or POSIX-locking) views directory;
with a views directory on object storage the scheduler must not start overlapping runs of one view.

Search indexes and cache entities read the warehouse's current tables of the tables the warehouse keeps
(:func:`derived_views.views.composite_sync.state_path`), and bring them to the step's watermark themselves.
A step applies the warehouse first, then the search indexes and cache entities side by side
(:data:`VIEWS_SIDE_BY_SIDE`), each in a Spark session of its own; two of them that find one shared copy
behind bring it forward once (:meth:`derived_views.write.context.ViewContext.applying`).
Every step that writes those tables (one of the warehouse, or of such a view) holds one more lock for
its duration, waiting for it while another process's step holds it (:func:`shared_copies_lock`), and
reads the watermark once it holds it: no view is computed from a copy that moves under it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from derived_views.definitions import ViewDefinitions
from derived_views.definitions import check as check_definitions
from derived_views.engine.delta_sql import is_local
from derived_views.engine.maintenance import MaintenancePolicy, Task
from derived_views.engine.maintenance import run as run_task
from derived_views.engine.table_health import TableHealth
from derived_views.errors import (
    DefinitionChangedError,
    LogUnavailableError,
    UnknownViewError,
    ViewBusyError,
    ViewError,
    ViewsFileError,
)
from derived_views.runs.purge import PurgedTable
from derived_views.runs.purge import purge as purge_tables
from derived_views.runs.upkeep import Upkeep, due_tasks, matching, view_table_paths
from derived_views.source.as_of import LogAsOf
from derived_views.source.watermark import LogWatermark, read_watermark
from derived_views.views import cache, search, warehouse
from derived_views.views.composite import Composite, checked, plan_for, source_tables
from derived_views.write.context import ViewContext
from derived_views.write.failures import TableFailure, summary
from derived_views.write.failures import record as record_failures
from derived_views.write.steps import TableResult
from event_format import SNAPSHOT_POSITION
from log_store.atomic_file import make_dirs, write_atomic
from log_store.errors import LogLockedError
from log_store.lock import FileLock, holder_pid

log = logging.getLogger("cdc.views")

#: The kinds of views the views file defines by name: a search index is the view ``search.<index>``,
#: a cache entity the view ``cache.<entity>``; ``search`` / ``cache`` alone name all of a kind.
KINDS = (search.NAME, cache.NAME)


@dataclass(frozen=True)
class StepReport:
    """One sync step: the watermark reached, how many events each view applied, and the tables that
    failed (each stays as of its last sync, see :mod:`derived_views.write.failures`)."""

    watermark: LogWatermark | None
    events: dict[str, int]
    failures: tuple[TableFailure, ...] = ()


def resolve(names: list[str] | tuple[str, ...], definitions: ViewDefinitions) -> list[str]:
    """Validate view names (all views when empty); ``search`` and ``cache`` stand for every index or
    entity of that kind."""
    known = definitions.view_names()
    chosen: list[str] = []
    for name in names:
        matching = [view for view in known if view == name or (name in KINDS and view.startswith(f"{name}."))]
        if not matching:
            raise UnknownViewError(name, known, definitions.source)
        chosen.extend(view for view in matching if view not in chosen)
    return chosen or known


def latest(ctx: ViewContext) -> LogWatermark | None:
    """The log's latest commit watermark; ``None`` before capture wrote a complete initial snapshot.

    While the first snapshot is copied, capture publishes its groups at position
    :data:`event_format.SNAPSHOT_POSITION`: those hold part of the tables and no source commit, so a view never
    syncs to them (promise 5: a view equals the source as of the commit it records).
    """
    watermark = read_watermark(ctx.log)
    if watermark is None or watermark.position == SNAPSHOT_POSITION:
        return None
    return watermark


@contextmanager
def view_locks(ctx: ViewContext, names: list[str]) -> Iterator[None]:
    """Hold the lock of every named view (see the module docstring); raise :class:`ViewBusyError` at once
    when another process holds one. Nothing is locked when the views directory is not a local path."""
    with ExitStack() as stack:
        for name in sorted(set(names)):
            lock = _lock_file(ctx, name)
            if lock is None:
                break
            try:
                lock.acquire()
            except LogLockedError as exc:
                raise ViewBusyError(name, str(exc.lock_path), exc.pid) from None
            stack.callback(lock.release)
        yield


def _lock_file(ctx: ViewContext, name: str) -> FileLock | None:
    """The lock of the view ``name`` (``<views dir>/_locks/<view>.lock``); ``None`` when the views
    directory is not a local path."""
    if not is_local(ctx.views_dir):
        return None
    directory = Path(ctx.views_dir.removeprefix("file://")) / "_locks"
    make_dirs(directory)  # owner only, like the log (log_store.atomic_file); lock files are 0600 too
    return FileLock(directory / f"{name}.lock")


def step(ctx: ViewContext, names: list[str], *, replace: bool = False) -> StepReport:
    """Bring the named views to the latest watermark (rebuild them from offset 0 when ``replace``),
    holding their locks."""
    with view_locks(ctx, resolve(names, ctx.definitions)):
        return _step(ctx, names, replace=replace)


#: Lock held for one step by every process that writes the warehouse's current tables: a step of the
#: warehouse, and a step of a search index or cache entity that reads them (they are its state copies).
TABLES_LOCK = "warehouse.tables"


@contextmanager
def shared_copies_lock(ctx: ViewContext, names: list[str]) -> Iterator[None]:
    """Hold :data:`TABLES_LOCK` for one step of ``names`` when it writes the warehouse's current tables,
    waiting while another process's step holds it.

    The progress this process cached is dropped when another process wrote those tables since this
    one last did (``<lock>.writer`` names the last writer), so a table another process moved on is
    never applied again from where this process left it."""
    if not ctx.definitions.warehouse.keeps_any or not names:
        yield
        return
    lock = _lock_file(ctx, TABLES_LOCK)
    if lock is None:
        yield
        return
    if not lock.try_acquire():
        log.info("waiting for the warehouse's current tables: process %s is writing them", holder_pid(lock.path))
        lock.acquire(blocking=True)
    writer = lock.path.with_suffix(".writer")
    last = writer.read_text() if writer.exists() else None
    try:
        if last != ctx.writer:
            ctx.forget()
        yield
    finally:
        try:
            if last != ctx.writer:
                write_atomic(writer, ctx.writer.encode())
        finally:
            lock.release()


def _step(ctx: ViewContext, names: list[str], *, replace: bool = False) -> StepReport:
    chosen = resolve(names, ctx.definitions)
    with shared_copies_lock(ctx, chosen):
        return _step_holding_locks(ctx, chosen, replace=replace)


def _step_holding_locks(ctx: ViewContext, chosen: list[str], *, replace: bool) -> StepReport:
    watermark = latest(ctx)
    if watermark is None:
        if replace:
            raise LogUnavailableError(f"the log at {ctx.log} holds no complete snapshot yet: run `cdc capture` before a rebuild")
        return StepReport(None, {})
    plans, broken = _plans(ctx, watermark, chosen)
    synced = _sync_all(ctx, _Sync(LogAsOf(ctx.log, watermark), plans, broken, replace), chosen)
    events = {}
    failed: list[TableFailure] = []
    for name in chosen:
        results = synced[name]
        events[name] = sum(r.events for r in results)
        failures = {
            _table_name(ctx, r.path): TableFailure(name, _table_name(ctx, r.path), r.error, "", watermark.position)
            for r in results
            if r.error is not None
        }
        record_failures(ctx.views_dir, name, failures)
        failed.extend(failures.values())
    return StepReport(watermark, events, tuple(failed))


#: Search indexes and cache entities applied at once in a step (most of a small MERGE's time is the
#: driver planning it and Delta committing it, single-threaded, so two views overlap well on two cores).
VIEWS_SIDE_BY_SIDE = 2


@dataclass(frozen=True)
class _Sync:
    """What one step brings every chosen view to: the log as of the step's watermark (made once, in
    :func:`_step_holding_locks`), the plans of the chosen search indexes and cache entities, the views
    whose definition no longer fits the source, and whether the views are rebuilt."""

    as_of: LogAsOf
    plans: dict[str, Composite]
    broken: dict[str, ViewsFileError]
    replace: bool


def _sync_all(ctx: ViewContext, run: _Sync, chosen: list[str]) -> dict[str, list[TableResult]]:
    """Each chosen view's results: the warehouse first (the others read its current tables), then the
    search indexes and cache entities side by side, each in a session of its own
    (:meth:`~derived_views.write.context.ViewContext.lane`). A rebuild applies them one at a time."""
    synced = {name: _sync_view(ctx, run, name) for name in chosen if name == warehouse.NAME}
    others = [name for name in chosen if name != warehouse.NAME]
    if run.replace or len(others) < 2:
        synced.update({name: _sync_view(ctx, run, name) for name in others})
        return synced
    pool = ThreadPoolExecutor(max_workers=VIEWS_SIDE_BY_SIDE, thread_name_prefix="views")
    try:
        futures = {name: pool.submit(_sync_view, ctx, run, name, in_lane=True) for name in others}
        synced.update({name: future.result() for name, future in futures.items()})
    except BaseException:
        pool.shutdown(wait=True, cancel_futures=True)  # a view error stops the step: start no other view
        raise
    pool.shutdown(wait=True)
    return synced


def _sync_view(ctx: ViewContext, run: _Sync, name: str, *, in_lane: bool = False) -> list[TableResult]:
    """The view's table results (``in_lane``: applied in a lane of ``ctx``, see :meth:`ViewContext.lane`); a
    failure of the view as a whole becomes one failed result, except a :class:`ViewError` the user must
    act on, which stops the step."""
    try:
        if name in run.broken:
            raise run.broken[name]
        if in_lane:
            with ctx.lane() as lane:
                return _sync(lane, run, name)
        return _sync(ctx, run, name)
    except (DefinitionChangedError, ViewsFileError) as exc:
        log.error("%s", exc)
        return [TableResult(ctx.path(*name.split(".", 1)), 0, 0, str(exc))]
    except ViewError:
        raise
    except Exception as exc:  # noqa: BLE001 - one view's failure must not stop the others
        log.error("view %s failed: %s", name, summary(exc))
        return [TableResult(ctx.path(*name.split(".", 1)), 0, 0, summary(exc))]


def plans_at(ctx: ViewContext, watermark: LogWatermark) -> dict[str, Composite]:
    """The search indexes and cache entities by view name, checked against the tables captured as of
    ``watermark`` (the whole views file is checked, warehouse included)."""
    return {plan.view: plan for plan in checked(ctx.definitions, source_tables(ctx.schemas(watermark).values()))}


def _plans(
    ctx: ViewContext, watermark: LogWatermark, chosen: list[str]
) -> tuple[dict[str, Composite], dict[str, ViewsFileError]]:
    """The plans of the ``chosen`` views, and the errors of those whose definition no longer fits the source.

    A mistake in the views file stops the step before anything is written (the warehouse section, or a
    view never synced); a view synced before whose definition the source no longer fits (a column it
    names was renamed or dropped) fails alone, like a failed table, so the other views go on.
    """
    tables = source_tables(ctx.schemas(watermark).values())
    check_definitions(ctx.definitions, list(tables))
    plans: dict[str, Composite] = {}
    broken: dict[str, ViewsFileError] = {}
    for view in chosen:
        if view == warehouse.NAME:
            continue
        try:
            plans[view] = plan_for(ctx.definitions, view, tables)
        except ViewsFileError as exc:
            kind, name = view.split(".", 1)
            outputs = search.TABLES if kind == search.NAME else cache.TABLES
            if not any(ctx.progress(ctx.path(kind, name, table)).position for table in outputs):
                raise
            broken[view] = exc
    return plans, broken


def _sync(ctx: ViewContext, run: _Sync, name: str) -> list[TableResult]:
    """Bring the view ``name`` to the range's watermark."""
    if name == warehouse.NAME:
        return warehouse.sync(ctx, run.as_of, replace=run.replace)
    plan = run.plans[name]
    module = search if plan.kind == search.NAME else cache
    return module.sync(ctx, run.as_of, plan, replace=run.replace)


def _table_name(ctx: ViewContext, path: str) -> str:
    """A table's path relative to the views directory (``warehouse/current/public.orders``)."""
    root = ctx.views_dir.rstrip("/") + "/"
    return path[len(root) :] if path.startswith(root) else path


#: Seconds a continuous sync may go without a request to its Spark sessions (a Spark Connect server drops
#: a session after an hour without one; see :meth:`ViewContext.keep_alive`).
KEEP_ALIVE_S = 600.0


def continuous(
    ctx: ViewContext,
    names: list[str],
    interval: float,
    *,
    should_stop: Callable[[], bool] = lambda: False,
    on_step: Callable[[StepReport], None] = lambda report: None,
    maintenance: MaintenancePolicy | None = None,
    maintain: bool = True,
    on_health: Callable[[list[TableHealth]], None] | None = None,
) -> None:
    """Sync whenever the watermark moves, polling it every ``interval`` seconds until ``should_stop()``;
    the views' locks are held throughout. With a ``maintenance`` policy (and ``maintain``) the loop also
    keeps the views' tables healthy, between its steps (:mod:`derived_views.runs.upkeep`). ``on_health``
    gets the tables' health after each look at it (every ``interval_s`` of the policy, or of the default
    one) and after each maintenance task."""
    upkeep = None
    if maintenance is not None or on_health is not None:
        upkeep = Upkeep(maintenance or MaintenancePolicy(), maintain=maintain and maintenance is not None)
        if on_health is not None:
            upkeep.on_health = on_health
    with view_locks(ctx, resolve(names, ctx.definitions)):
        _loop(ctx, names, interval, should_stop, on_step, upkeep)


def maintain(ctx: ViewContext, names: list[str], policy: MaintenancePolicy, only: list[str], *, dry_run: bool) -> list[Task]:
    """Do (or, ``dry_run``, only list) every maintenance task due on the tables of the views ``names``
    (those ``only`` names, see :func:`derived_views.runs.upkeep.matching`), holding the views' locks."""
    chosen = resolve(names, ctx.definitions)
    with view_locks(ctx, chosen):
        tasks = due_tasks(matching(view_table_paths(ctx, chosen, latest(ctx)), ctx.views_dir, only), policy)
        if not dry_run:
            for task in tasks:
                _run_task(ctx, chosen, task, policy)
        return tasks


def purge(
    ctx: ViewContext, names: list[str], tables: list[str], database_url: str, publication: str, read_at: Mapping[str, int]
) -> list[PurgedTable]:
    """Bring the views ``names`` to the log's latest watermark, then apply the capture rule of the source
    tables ``tables`` (``schema.table``) to every version of the view tables over them and drop their
    earlier versions (:mod:`derived_views.runs.purge`), holding the views' locks throughout. Nothing is
    purged when a table of the step fails."""
    chosen = resolve(names, ctx.definitions)
    with view_locks(ctx, chosen):
        report = _step(ctx, chosen)
        if report.watermark is None:
            raise LogUnavailableError(f"the log at {ctx.log} holds no complete snapshot yet: run `cdc capture` first")
        if report.failures:
            lines = " | ".join(failure.line() for failure in report.failures)
            raise ViewError(f"nothing was purged: the views could not be brought up to date first: {lines}")
        schemas = {schema.dotted_name: schema for schema in ctx.schemas(report.watermark).values()}
        unknown = [table for table in tables if table not in schemas]
        if unknown:
            raise ViewError(f"nothing was purged: the log does not capture {', '.join(unknown)}")
        plans = plans_at(ctx, report.watermark)
        with shared_copies_lock(ctx, chosen):
            return purge_tables(ctx, [schemas[table] for table in tables], plans, database_url, publication, read_at)


def _run_task(ctx: ViewContext, names: list[str], task: Task, policy: MaintenancePolicy) -> None:
    """Do ``task``, holding the lock of the warehouse's current tables when other views' steps write them."""
    with shared_copies_lock(ctx, names):
        run_task(ctx.spark, task, policy)


def _maintain_one(ctx: ViewContext, names: list[str], upkeep: Upkeep | None, watermark: LogWatermark | None) -> bool:
    """Do the next maintenance task due, if any; whether one was done (a failed task is logged and
    comes back at a later pass while it is still due)."""
    task = upkeep.next_task(ctx, names, watermark) if upkeep else None
    if task is None or upkeep is None:
        return False
    try:
        _run_task(ctx, names, task, upkeep.policy)
    except ViewError:
        raise
    except Exception as exc:  # noqa: BLE001 - maintenance must never stop the stream of changes
        log.warning("%s of %s failed: %s; it is retried at a later pass", task.action, task.path, summary(exc))
    upkeep.done(task)
    return True


def _loop(
    ctx: ViewContext,
    names: list[str],
    interval: float,
    should_stop: Callable[[], bool],
    on_step: Callable[[StepReport], None],
    upkeep: Upkeep | None = None,
) -> None:
    seen: str | None = None
    last_request = time.monotonic()
    while not should_stop():
        watermark = latest(ctx)
        if watermark is not None and watermark.position != seen:
            report = _step(ctx, names)
            seen = report.watermark.position if report.watermark else None
            on_step(report)
            _maintain_one(ctx, names, upkeep, report.watermark)  # at most one task after a step
            last_request = time.monotonic()
            continue
        if _maintain_one(ctx, names, upkeep, watermark):  # idle: one task, then the watermark again
            last_request = time.monotonic()
            continue
        if time.monotonic() - last_request > KEEP_ALIVE_S:
            ctx.keep_alive()
            last_request = time.monotonic()
        time.sleep(interval)
