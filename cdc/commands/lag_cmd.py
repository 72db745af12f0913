"""``cdc lag`` (how far behind every stage is) and ``cdc wait`` (read-your-writes for one view)."""

from __future__ import annotations

import signal
import sys
import threading
import time

import click
import orjson
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from cdc.capture.lsn import Lsn
from cdc.commands.interrupts import interrupt_on
from cdc.config.settings import Settings, load_settings
from cdc.errors import CdcError, ConfigError
from cdc.observe.lag import measure
from cdc.observe.lag_report import LagReport, SourceLag


class WaitTimeoutError(CdcError):
    """The view did not reach the LSN in time."""

    exit_code = 4


def _human_bytes(value: int | None) -> str:
    if value is None:
        return "-"
    size = float(value)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(size) < 1024 or unit == "TB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return str(value)


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}s"


def _failover_ready(source: SourceLag) -> str:
    """Whether a promotion keeps the slot, and why not."""
    if not source.exists:
        return "-"
    if source.failover is None:
        return "no (no failover slots before PostgreSQL 17)"
    if not source.failover:
        return "no (not a failover slot: CDC_SLOT_FAILOVER, then `cdc setup`)"
    if source.synced_on_standby is None:
        return "failover slot (set CDC_STANDBY_URL to see whether it is synced)"
    return "yes (failover slot, synced on the standby)" if source.synced_on_standby else "no (not synced on the standby yet)"


def render(report: LagReport) -> Group:
    """The report as tables (source, log, views, the view tables' files and maintenance, reads beside the
    stream) and its warnings."""
    source = report.source
    src = Table(title="source → log", title_justify="left", show_header=False)
    src.add_column("what", style="bold")
    src.add_column("value")
    rows = [
        ("server", f"{source.server} ({source.role})"),
        ("slot", f"{source.slot} ({'missing' if not source.exists else ('active' if source.active else 'inactive')})"),
        ("failover-ready", _failover_ready(source)),
        ("wal_status", source.wal_status or "-"),
        ("confirmed flush LSN", source.confirmed_flush_lsn or "-"),
        ("current WAL LSN", source.current_lsn or "-"),
        ("WAL behind", _human_bytes(source.wal_bytes_behind)),
        ("oldest unconfirmed change", _seconds(source.oldest_unconfirmed_age_seconds)),
        ("WAL retained by the slot", _human_bytes(source.retained_wal_bytes)),
        ("catalog_xmin age", "-" if source.catalog_xmin_age is None else f"{source.catalog_xmin_age} transactions"),
        (
            "WAL left before invalidation",
            "unlimited (max_slot_wal_keep_size = -1)"
            if source.max_slot_wal_keep_size_bytes is None
            else _human_bytes(source.safe_wal_size_bytes),
        ),
    ]
    for name, value in rows:
        src.add_row(name, value)
    log = Table(title="log", title_justify="left")
    for column in ("topic", "partition", "end offset"):
        log.add_column(column)
    for part in report.log.partitions:
        log.add_row(part.topic, str(part.partition), str(part.end_offset))
    watermark = report.log.watermark
    log.caption = (
        f"watermark {watermark['lsn']} (#{watermark['sequence']}, appended {watermark['appended_at']})"
        if watermark
        else "no watermark yet: nothing captured"
    )
    groups = Table(title="log → consumer groups", title_justify="left")
    for column in ("group", "topic", "committed", "end", "lag"):
        groups.add_column(column)
    for group in report.log.groups:
        groups.add_row(group.group, group.topic, str(group.committed), str(group.end), str(group.lag))
    views = Table(title="log → views", title_justify="left")
    views.add_column("view", no_wrap=True, min_width=14)  # search.<index>, cache.<entity>
    for column in ("tables", "as of", "events pending", "WAL behind", "seconds behind"):
        views.add_column(column)
    for view in report.views:
        views.add_row(
            view.view,
            str(view.tables),
            view.as_of_lsn or "-",
            str(view.events_pending),
            _human_bytes(view.wal_bytes_behind),
            _seconds(view.seconds_behind),
        )
    if not report.views:
        views.caption = "no view has synced yet"
    tables = Table(title="view tables", title_justify="left")
    tables.add_column("table", no_wrap=True)
    for column in ("files", "size", "version", "since compaction", "last maintenance"):
        tables.add_column(column)
    for table in report.tables:
        since = table.seconds_since_maintenance
        tables.add_row(
            table.table,
            str(table.files),
            _human_bytes(table.bytes),
            str(table.version),
            f"{table.versions_since_compaction} versions",
            "never" if since is None else f"{_seconds(since)} ago",
        )
    reads = Table(title="tables read beside the stream", title_justify="left")
    for column in ("table", "rows", "estimated", "rows/s", "time left"):
        reads.add_column(column)
    for read in report.reads:
        rate, left = read["rows_per_second"], read["eta_seconds"]
        reads.add_row(
            str(read["table"]),
            str(read["rows"]),
            str(read["estimated_rows"] or "-"),
            f"{rate:,.0f}" if rate is not None else "-",
            _seconds(left) if left is not None else "-",
        )
    notes = [f"[yellow]warning:[/] {w}" for w in report.warnings]
    notes += [f"[red]over limit:[/] {v}" for v in report.violations]
    optional = ([groups] if report.log.groups else [], [tables] if report.tables else [], [reads] if report.reads else [])
    return Group(src, log, *optional[0], views, *optional[1], *optional[2], *notes)


def _watch(settings: Settings, interval: float, max_lag_seconds: float | None, max_wal_bytes: int | None) -> None:
    """Refresh the report until Ctrl-C (SIGINT) or SIGTERM: in place on a terminal, one report after
    another otherwise. Either signal ends it with status 0, also when it was started with SIGINT ignored
    (as a shell starts a background job)."""
    console = Console()

    def current() -> Group:
        return render(measure(settings, max_lag_seconds=max_lag_seconds, max_wal_bytes=max_wal_bytes))

    try:
        with interrupt_on(signal.SIGINT, signal.SIGTERM):
            if not console.is_terminal:
                while True:
                    console.print(current())
                    console.file.flush()
                    time.sleep(interval)
            with Live(console=console, auto_refresh=False) as live:
                while True:
                    live.update(current(), refresh=True)
                    time.sleep(interval)
    except KeyboardInterrupt:
        return


def _serve(settings: Settings, port: int, address: str) -> None:
    """Serve the metrics until SIGTERM or SIGINT (:mod:`cdc.observe.lag_exporter`)."""
    from cdc.observe.lag_exporter import run

    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda signum, frame: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        run(settings, port, address, stop)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@click.command("lag")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document (schema in cdc/observe/lag_report.py).")
@click.option("--watch", is_flag=True, help="Refresh in place until interrupted (Ctrl-C or SIGTERM).")
@click.option(
    "--interval", type=click.FloatRange(min=0.2), default=2.0, show_default=True, help="Seconds between refreshes with --watch."
)
@click.option(
    "--max-lag-seconds", type=click.FloatRange(min=0), default=None, help="Exit 1 when any stage is more seconds behind."
)
@click.option("--max-wal-bytes", type=click.IntRange(min=0), default=None, help="Exit 1 when the slot is more WAL bytes behind.")
@click.option(
    "--serve",
    "serve_port",
    type=click.IntRange(min=1, max=65535),
    default=None,
    metavar="PORT",
    help="Serve the slot's, the log's and the views' lag as Prometheus metrics on PORT until stopped.",
)
@click.option("--address", default="0.0.0.0", show_default=True, help="The address --serve listens on.")
def lag(
    as_json: bool,
    watch: bool,
    interval: float,
    max_lag_seconds: float | None,
    max_wal_bytes: int | None,
    serve_port: int | None,
    address: str,
) -> None:
    """Show how far behind the slot, the log and each view are."""
    settings = load_settings()
    if watch and as_json:
        raise ConfigError("--watch and --json do not go together: use --json alone for a probe")
    if serve_port is not None:
        if watch or as_json or max_lag_seconds is not None or max_wal_bytes is not None:
            raise ConfigError("--serve goes alone: alert rules over its metrics stand in for --max-* (deploy/prometheus)")
        _serve(settings, serve_port, address)
        return
    if watch:
        _watch(settings, interval, max_lag_seconds, max_wal_bytes)
        return
    report = measure(settings, max_lag_seconds=max_lag_seconds, max_wal_bytes=max_wal_bytes)
    if as_json:
        sys.stdout.write(orjson.dumps(report.to_dict(), option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        Console().print(render(report))
    if not report.ok:
        sys.exit(1)


@click.command("wait")
@click.argument("view")
@click.option("--lsn", "lsn_text", required=True, help="LSN to wait for, as pg_current_wal_lsn() prints it.")
@click.option(
    "--timeout", type=click.FloatRange(min=0), default=30.0, show_default=True, help="Seconds before giving up (exit 4)."
)
@click.option("--poll", type=click.FloatRange(min=0.05), default=0.2, show_default=True, help="Seconds between checks.")
def wait(view: str, lsn_text: str, timeout: float, poll: float) -> None:
    """Block until VIEW is as of at least LSN: read-your-writes after a commit.

    \f
    Pass ``pg_current_wal_lsn()`` read after the commit. A view as of position P holds every transaction
    whose commit LSN is <= P; the commit record of a transaction that committed before the LSN was read
    starts below it, so the view is far enough once P >= LSN - 1. A view is as of its least advanced
    table, counting every table it has over the captured tables: one its first sync has not written yet
    leaves the view not synced, and so does one whose source table is being read (a new log's first
    reads, a table added or read again): its rows are in the log only in part until the read ends.
    """
    from cdc.config.view_arguments import listed_tables
    from cdc.observe.read_status import topics_being_read
    from derived_views import tables_of, view_as_of_lsn
    from derived_views.definitions import load
    from derived_views.errors import UnknownViewError

    try:
        target = Lsn.parse(lsn_text)
    except ValueError as exc:
        raise ConfigError(f"--lsn: {exc}") from None
    settings = load_settings()
    definitions = load(settings.views_file)
    known = definitions.view_names()
    if view not in known and not any(name.startswith(f"{view}.") for name in known):
        raise UnknownViewError(view, known, definitions.source)
    deadline = time.monotonic() + timeout
    while True:
        tables = tables_of(listed_tables(settings), view)
        reading = topics_being_read(settings) & {topic for table in tables for topic in table.topics}
        as_of = None if reading else view_as_of_lsn(tables)
        if as_of is not None and as_of + 1 >= target:
            click.echo(f"{view} is as of {Lsn(as_of)}: it holds every commit before {target}")
            return
        if time.monotonic() >= deadline:
            shown = "nothing yet" if as_of is None else str(Lsn(as_of))
            if reading:
                shown = f"nothing yet: {', '.join(sorted(reading))} being read"
            raise WaitTimeoutError(
                f"view {view} did not reach {target} within {timeout:g}s (it is as of {shown}); "
                "check that capture and `cdc sync` are running (`cdc lag`)"
            )
        time.sleep(poll)
