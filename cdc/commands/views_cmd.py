"""``cdc sync``, ``cdc rebuild``, ``cdc verify``, ``cdc search`` and ``cdc cache get``: the derived views.

Every command starts one local Spark session (or uses the one ``spark-submit`` provides) and works on
the Delta tables below ``CDC_DATA_DIR``; see :mod:`derived_views` for what each view holds.
"""

from __future__ import annotations

import json
import logging
import signal
import threading
from types import FrameType
from typing import TYPE_CHECKING

import click

from cdc.commands.command_context import pass_context
from cdc.config.data_dir import secure_data_dir
from cdc.observe.metrics import SyncMetrics, TableFigures, serve

log = logging.getLogger("cdc.views")

if TYPE_CHECKING:
    from cdc.config.settings import Settings
    from derived_views import StepReport, TableHealth, VersionsAsOf, ViewContext, ViewTable
    from derived_views.definitions import ViewDefinitions


def _context(ctx: object, *, one_shot: bool = False) -> ViewContext:
    """The view context, after one log line stating the job's configuration (password redacted).
    ``one_shot``: the command runs one step and ends (see :mod:`derived_views.runs.job`)."""
    from cdc.config.view_arguments import context_from_settings
    from derived_views import session_facts

    settings = ctx.settings  # type: ignore[attr-defined]
    if "://" not in str(settings.views_dir):
        secure_data_dir(settings.data_dir)  # Spark writes the tables by the umask: see cdc.config.data_dir
    view_ctx = context_from_settings(settings, one_shot=one_shot)
    # a failed task reaches the user as this command's one error line (cdc.cli.run): session_facts
    # quiets Spark's own log of the same failure
    facts = session_facts(view_ctx.spark)
    log.info(
        "view job",
        extra={
            "fields": {
                "source": settings.database_url,
                "data_dir": str(settings.data_dir),
                "log": settings.log_location(),
                "spark_master": facts.master,
                "spark_app_id": facts.app_id,
                "driver_jit": facts.compilers,
            }
        },
    )
    return view_ctx


def _definitions(ctx: object) -> ViewDefinitions:
    """The views file's definitions (checked for shape; checked against the source when a step runs)."""
    from derived_views.definitions import load

    return load(ctx.settings.views_file)  # type: ignore[attr-defined]


def _describe(report: StepReport) -> str:
    if report.watermark is None:
        return "the log holds no complete snapshot yet: nothing to apply"
    applied = ", ".join(f"{name}: {count} events" for name, count in report.events.items())
    return f"as of LSN {report.watermark.position}: {applied}"


def _fail_on(report: StepReport) -> None:
    """Raise when tables of the step failed (after the other tables were applied)."""
    from derived_views.errors import TablesFailedError

    if report.failures:
        raise TablesFailedError([failure.line() for failure in report.failures])


@click.command("sync")
@click.argument("views", nargs=-1)
@click.option("--once", "mode", flag_value="once", default=True, help="Drain to the latest watermark, then exit.")
@click.option("--continuous", "mode", flag_value="continuous", help="Keep syncing as the log grows.")
@click.option(
    "--interval",
    type=click.FloatRange(min=0.05),
    default=0.25,
    show_default=True,
    help="Seconds between watermark polls in --continuous mode.",
)
@pass_context
def sync(ctx: object, views: tuple[str, ...], mode: str, interval: float) -> None:
    """Apply the log to VIEWS (default: all) up to the latest commit watermark."""
    from derived_views import runner

    names = runner.resolve(views, _definitions(ctx))
    view_ctx = _context(ctx, one_shot=mode == "once")
    if mode == "once":
        report = runner.step(view_ctx, names)
        click.echo(_describe(report), err=True)
        _fail_on(report)
        return
    stop = threading.Event()

    def _request_stop(signum: int, frame: FrameType | None) -> None:
        stop.set()

    metrics = SyncMetrics()
    server = serve(metrics.registry, ctx.settings.metrics_port)  # type: ignore[attr-defined]

    def _on_step(report) -> None:  # type: ignore[no-untyped-def]
        if report.watermark is not None:
            for name, count in report.events.items():
                metrics.observe(name, count, report.watermark.lsn)
        for failure in report.failures:
            metrics.errors.labels(view=failure.view).inc()
        click.echo(_describe(report), err=True)

    root = view_ctx.views_dir.rstrip("/") + "/"

    def _on_health(tables: list[TableHealth]) -> None:
        metrics.tables({table.path.removeprefix(root): _figures(table) for table in tables})

    previous = {sig: signal.signal(sig, _request_stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        settings = ctx.settings  # type: ignore[attr-defined]
        runner.continuous(
            view_ctx,
            names,
            interval,
            should_stop=stop.is_set,
            on_step=_on_step,
            maintenance=settings.maintenance_policy(),
            maintain=settings.maintenance,
            on_health=_on_health,
        )
    except Exception:
        for name in names:
            metrics.errors.labels(view=name).inc()
        raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if server is not None:
            server.shutdown()


def _figures(table: TableHealth) -> TableFigures:
    """A table's health as the metrics show it."""
    from datetime import datetime

    last = table.last_maintenance_at
    return TableFigures(
        table.files,
        table.bytes,
        table.version,
        table.versions_since_compaction,
        datetime.fromisoformat(last).timestamp() if last else None,
    )


@click.command("rebuild")
@click.argument("view")
@pass_context
def rebuild(ctx: object, view: str) -> None:
    """Replay the log from offset 0 and replace VIEW's tables, each in one Delta commit."""
    from derived_views import runner

    names = runner.resolve([view], _definitions(ctx))
    report = runner.step(_context(ctx), names, replace=True)
    click.echo(f"rebuilt {view} {_describe(report)}", err=True)
    _fail_on(report)


@click.command("verify")
@click.argument("view")
@click.option("--no-sync", is_flag=True, help="Compare the view as it is, without syncing it first.")
@pass_context
def verify(ctx: object, view: str, no_sync: bool) -> None:
    """Compare VIEW with the source tables (one consistent snapshot); exit 4 on any difference. ``search``
    or ``cache`` compares every index or entity."""
    from derived_views import runner, shown
    from derived_views import verify as run_verify
    from derived_views.errors import LogUnavailableError, VerifyMismatchError

    names = runner.resolve([view], _definitions(ctx))
    view_ctx = _context(ctx, one_shot=True)
    if not no_sync:
        _fail_on(runner.step(view_ctx, names))
    watermark = runner.latest(view_ctx)
    if watermark is None:
        raise LogUnavailableError(f"the log at {view_ctx.log} holds no complete snapshot yet: run `cdc capture`")
    differing = []
    settings = ctx.settings  # type: ignore[attr-defined]
    for name in names:
        report = run_verify(view_ctx, name, settings.database_url, watermark, settings.publication, settings.mask_key_bytes)
        for line in shown(report):
            click.echo(line)
        if report.ok:
            click.echo(f"{name} equals the source: {report.compared} rows compared as of LSN {watermark.position}")
        else:
            differing.append(f"{name} differs from the source in {report.count} places")
    if differing:
        raise VerifyMismatchError(
            f"{'; '.join(differing)} (as of LSN {watermark.position}); run `cdc rebuild {view}` to replace it from the log"
        )


@click.command("search")
@click.argument("words", nargs=-1, required=True, metavar="[INDEX] QUERY")
@click.option("--limit", type=click.IntRange(min=1), default=10, show_default=True, help="How many documents.")
@click.option("--json", "as_json", is_flag=True, help="One JSON document: each hit's key, score and stored fields.")
@click.option("--as-of", "as_of", metavar="LSN|latest", help="Read the index as of LSN (see `cdc views as-of`).")
@pass_context
def search_cmd(ctx: object, words: tuple[str, ...], limit: int, as_json: bool, as_of: str | None) -> None:
    """Print the documents of search index INDEX that best match QUERY (BM25; no Spark). INDEX may be
    left out when the views file defines one index. With --as-of, the documents and terms are read at
    their versions exact as of LSN (`latest`: the newest LSN both have reached)."""
    from derived_views import search
    from derived_views.definitions import load
    from derived_views.errors import UnknownEntityError

    settings = ctx.settings  # type: ignore[attr-defined]
    definitions = load(settings.views_file)
    indexes = sorted(definitions.search)
    if len(words) > 2:
        raise click.UsageError('give the index and the query as two arguments: cdc search INDEX "QUERY"')
    if len(words) == 2:
        index, query = words
    elif len(indexes) == 1:
        index, query = indexes[0], words[0]
    elif not indexes:
        raise click.UsageError(
            f"{definitions.source} defines no search index: define one as [search.<index>] (views.example.toml shows how)"
        )
    else:
        raise click.UsageError(f'several search indexes are defined ({", ".join(indexes)}): name one, cdc search INDEX "QUERY"')
    if index not in definitions.search:
        raise UnknownEntityError(index, indexes, "search index")
    stored = definitions.search[index].stored
    views_dir = str(settings.views_dir.resolve())
    versions = None
    if as_of is not None:
        chosen = _versions(settings, search.tables(views_dir, index), as_of)
        versions = {table.path: table.version for table in chosen.tables.values()}
    hits = search.query(views_dir, index, query, limit, stored, versions)
    if as_json:
        click.echo(json.dumps([{"key": h.key, "score": h.score, "fields": h.fields} for h in hits], default=str, indent=2))
        return
    if not hits:
        click.echo("no matching documents", err=True)
    for rank, hit in enumerate(hits, 1):
        shown = "  ".join("-" if hit.fields[c] is None else str(hit.fields[c]) for c in stored)
        key = ",".join(str(v) for v in hit.key.values())
        click.echo(f"{rank}. [{hit.score:.3f}] {key}  {shown}".rstrip())


@click.group("cache")
def cache_group() -> None:
    """Read the cache entities."""


@cache_group.command("get")
@click.argument("entity")
@click.argument("key")
@click.option("--as-of", "as_of", metavar="LSN|latest", help="Read the entity as of LSN (see `cdc views as-of`).")
@pass_context
def cache_get(ctx: object, entity: str, key: str, as_of: str | None) -> None:
    """Print the cached value of ENTITY with key KEY as JSON; exit 1 when absent (no Spark). A key of
    several columns is given as its canonical JSON (``{"a":1,"b":2}``). With --as-of, the entries are
    read at their version exact as of LSN."""
    from derived_views import cache
    from derived_views.definitions import load
    from derived_views.errors import UnknownEntityError

    settings = ctx.settings  # type: ignore[attr-defined]
    entities = sorted(load(settings.views_file).cache)
    views_dir = str(settings.views_dir.resolve())
    version = None
    if as_of is not None:
        if entity not in entities:
            raise UnknownEntityError(entity, entities)
        name, path = cache.entries_table(views_dir, entity)
        version = _versions(settings, {name: path}, as_of).version(name)
    value = cache.get(views_dir, entity, key, entities, version)
    if value is None:
        raise click.ClickException(f"no cached {entity} with key {key}")
    click.echo(json.dumps(value, indent=2, sort_keys=False))


@click.group("views", invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON document instead of a table.")
@pass_context
@click.pass_context
def views_cmd(click_ctx: click.Context, ctx: object, as_json: bool) -> None:
    """List the views' tables: what each holds, the LSN it is as of, its files, size, versions and last
    maintenance, and its Delta path (no Spark)."""
    if click_ctx.invoked_subcommand is not None:
        return
    from cdc.config.view_arguments import listed_tables
    from derived_views.definitions import load

    settings = ctx.settings  # type: ignore[attr-defined]
    definitions = load(settings.views_file)
    tables = listed_tables(settings, health=True)
    if as_json:
        click.echo(json.dumps({"definitions": definitions.source, "tables": [t.shown() for t in tables]}, indent=2))
        return
    click.echo(f"views as defined by {definitions.source}")
    for table in tables:
        health = table.health
        size = f"{health.files} files {_size(health.bytes)} v{health.version}" if health else "no table"
        done = f"compacted {health.compacted_at or 'never'}, vacuumed {health.vacuumed_at or 'never'}" if health else ""
        click.echo(f"{table.view:<16} {table.holds:<40} {table.as_of_lsn or 'not synced':<14} {size:<24} {table.path}")
        if done:
            click.echo(" " * 17 + done)
        if table.stored_columns:
            click.echo(
                " " * 17
                + "columns stored under another name: "
                + ", ".join(f"{json.dumps(source)} as {stored}" for source, stored in table.stored_columns.items())
            )


def _size(size: int) -> str:
    """A byte count for people: ``812 kB``, ``3.4 MB``."""
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("kB", 1 << 10)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} B"


@views_cmd.command("maintain")
@click.argument("tables", nargs=-1)
@click.option("--dry-run", is_flag=True, help="Show what is due, do nothing.")
@pass_context
def views_maintain(ctx: object, tables: tuple[str, ...], dry_run: bool) -> None:
    """Compact and vacuum the view tables that need it, once (what `cdc sync --continuous` does by
    itself). TABLES: paths below CDC_DATA_DIR (warehouse/current/public.orders) or directories above
    tables (warehouse/history); default every view table."""
    from derived_views import runner

    settings = ctx.settings  # type: ignore[attr-defined]
    names = runner.resolve([], _definitions(ctx))
    view_ctx = _context(ctx, one_shot=True)
    tasks = runner.maintain(view_ctx, names, settings.maintenance_policy(), list(tables), dry_run=dry_run)
    root = str(settings.views_dir.resolve()).rstrip("/") + "/"
    for task in tasks:
        verb = {"compact": "compact", "vacuum": "vacuum", "retain": "retain"}[task.action]
        click.echo(f"{'would ' + verb if dry_run else verb + 'ed'} {task.path.removeprefix(root)}: {task.reason}")
    if not tasks:
        click.echo("every view table is healthy: nothing to do", err=True)


def _versions(settings: Settings, tables: dict[str, str], lsn: str) -> VersionsAsOf:
    """The versions of ``tables`` (name -> path) exact as of ``lsn``, after a line on stderr saying which."""
    from derived_views import select_versions

    chosen = select_versions(tables, lsn, retention_hours=settings.vacuum_retention_hours)
    shown = ", ".join(f"{name} v{table.version}" for name, table in chosen.tables.items())
    click.echo(f"as of {chosen.as_of} (every commit before {chosen.lsn}): {shown}", err=True)
    return chosen


@views_cmd.command("as-of")
@click.argument("lsn", default="latest", metavar="[LSN|latest]")
@click.option("--view", "views", multiple=True, help="Only the tables of this view (repeatable): warehouse, search.products...")
@click.option("--json", "as_json", is_flag=True, help="One JSON document instead of a table.")
@pass_context
def views_as_of(ctx: object, lsn: str, views: tuple[str, ...], as_json: bool) -> None:
    """Print, for each view table, the Delta version exact as of LSN (as pg_current_wal_lsn() prints it:
    the version holds every commit before it); `latest` (the default): the newest LSN every table has
    reached. Read each table at its version (deltalake: DeltaTable(path, version=v); Spark: versionAsOf)
    and they agree with each other and with the source (no Spark)."""
    from pathlib import Path

    from cdc.capture.lsn import Lsn
    from cdc.config.view_arguments import listed_tables
    from derived_views import select_versions, tables_of
    from derived_views.definitions import load
    from derived_views.errors import UnknownViewError

    settings = ctx.settings  # type: ignore[attr-defined]
    tables = listed_tables(settings)
    if views:
        known = load(settings.views_file).view_names()
        for view in views:
            if view not in known and not any(name.startswith(f"{view}.") for name in known):
                raise UnknownViewError(view, known, str(settings.views_file))
        tables = [table for view in views for table in tables_of(tables, view)]
    root = settings.views_dir.resolve()
    named: dict[str, ViewTable] = {}
    for table in tables:  # a table several views read (a warehouse current table) once, as first listed
        named.setdefault(str(Path(table.path).relative_to(root)), table)
    chosen = select_versions({name: t.path for name, t in named.items()}, lsn, retention_hours=settings.vacuum_retention_hours)
    rows = [
        {
            "table": name,
            "view": named[name].view,
            "holds": named[name].holds,
            "path": found.path,
            "version": found.version,
            "exact_from": str(Lsn(found.exact_from)),
            "exact_to": str(Lsn(found.exact_to)),
        }
        for name, found in chosen.tables.items()
    ]
    if as_json:
        click.echo(json.dumps({"lsn": chosen.lsn, "as_of": chosen.as_of, "tables": rows}, indent=2))
        return
    click.echo(f"every table as of {chosen.as_of}: it holds every commit before {chosen.lsn}")
    for row in rows:
        click.echo(f"{row['view']:<16} {row['holds']:<40} v{row['version']:<8} {row['path']}")


@views_cmd.command("purge")
@click.argument("tables", nargs=-1)
@click.option(
    "--yes-drop-history",
    "confirmed",
    is_flag=True,
    help="Confirm that every earlier version of the view tables over TABLES is dropped (no time travel to them).",
)
@pass_context
def views_purge(ctx: object, tables: tuple[str, ...], confirmed: bool) -> None:
    """Apply the capture rule of TABLES (schema.table; default every captured table) to every version of
    the view tables over them, history included, and drop their earlier versions and files, so that no
    value a column list, row filter or mask now leaves out stays in a view file."""
    from cdc.config.view_arguments import location_from_settings
    from cdc.errors import ConfigError
    from cdc.observe.lag import ledger_reads
    from derived_views import captured_tables, runner

    if not confirmed:
        raise click.UsageError(
            "a purge drops every earlier version of the view tables over the tables it purges (Delta time travel "
            "to them, and the history's values a rule now leaves out): add --yes-drop-history to go on"
        )
    settings = ctx.settings  # type: ignore[attr-defined]
    captured = {schema.dotted_name: schema for schema in captured_tables(location_from_settings(settings), settings.topic_prefix)}
    if not captured:
        raise ConfigError("the log captures no table yet: run `cdc capture` first; nothing was purged")
    unknown = [table for table in tables if table not in captured]
    if unknown:
        raise ConfigError(
            f"unknown table {', '.join(repr(t) for t in unknown)}: the log captures {', '.join(sorted(captured))}; "
            "name each as schema.table; nothing was purged"
        )
    chosen = list(dict.fromkeys(tables)) or sorted(captured)
    read_at, read_again = ledger_reads(settings)
    waiting = [name for name in chosen if captured[name].qualified in read_again]
    if waiting:
        raise ConfigError(
            f"the rule of {', '.join(waiting)} changed and capture has not read it again yet: run `cdc capture` until "
            "`cdc lag` no longer names it, then purge; nothing was purged"
        )
    names = runner.resolve([], _definitions(ctx))
    view_ctx = _context(ctx, one_shot=True)
    purged = runner.purge(view_ctx, names, chosen, settings.database_url, settings.publication, read_at)
    root = str(settings.views_dir.resolve()).rstrip("/") + "/"
    for table in purged:
        changes = f": {'; '.join(table.changes)}" if table.changes else ""
        dropped = f"kept version {table.version} alone ({table.log_files} files of its log deleted)"
        click.echo(f"purged {table.path.removeprefix(root)}, {dropped}{changes}")


@click.command("spark-server")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(1, 65535), default=15002, show_default=True, help="Port to listen on.")
@click.option(
    "--conf",
    "confs",
    multiple=True,
    metavar="KEY=VALUE",
    help="A Spark setting of the server (repeatable), e.g. spark.driver.memory=4g.",
)
def spark_server(host: str, port: int, confs: tuple[str, ...]) -> None:
    """Run a Spark Connect server that view commands attach to (CDC_SPARK_REMOTE=sc://HOST:PORT).

    It keeps one Spark warm between runs, so a scheduled `cdc sync --once` starts in a fraction of a
    second. Runs in the foreground until stopped (for systemd or compose)."""
    import os

    from derived_views import server_command, server_environment

    settings = {}
    for item in confs:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint="--conf")
        settings[key.strip()] = value
    command = server_command(port=port, host=host, conf=settings)
    master = command[command.index("--master") + 1]
    log.info("spark connect server", extra={"fields": {"url": f"sc://{host}:{port}", "master": master}})
    os.execve(command[0], command, server_environment())


#: The commands this module adds to ``cdc``.
COMMANDS = (sync, rebuild, verify, search_cmd, cache_group, views_cmd, spark_server)
