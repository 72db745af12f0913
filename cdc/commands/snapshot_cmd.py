"""``cdc snapshot``: ask the running capture (or the next one) to read tables again, and show reads under way.

The request travels through PostgreSQL (:mod:`cdc.capture.reads.snapshot_requests`): no shell on the capture
host, no stop. Who may send one is who may execute ``pg_logical_emit_message``: on PostgreSQL 14 to 18
every role that can connect, unless that is revoked from ``PUBLIC`` (docs/commands.md says how).
``--where`` requests are signed with ``CDC_REQUEST_KEY`` and their condition is checked here first
(:mod:`cdc.capture.reads.read_conditions`; PostgreSQL plans it over the table), so a wrong one is an error
now rather than a warning in capture's log later. The status is read from the log: each chunk of a
read by key carries a progress record.
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, cast

import click
import orjson
from rich.console import Console
from rich.progress_bar import ProgressBar
from rich.table import Table

from cdc.capture.errors import PrivilegeError, SourceError
from cdc.capture.reads.read_conditions import SEARCH_PATH_OPTION, ConditionError, checked_condition, with_row_filter
from cdc.capture.reads.snapshot_requests import PREFIX, SnapshotRequest
from cdc.commands.command_context import pass_context
from cdc.config.settings import Settings
from cdc.errors import ConfigError
from cdc.observe.read_status import read_status
from cdc.setup.standby_source import writable_url

if TYPE_CHECKING:
    from cdc.capture.catalog import Catalog
    from cdc.capture.published_tables import PublishedTable


@click.command("snapshot")
@click.argument("tables", nargs=-1)
@click.option(
    "--status", is_flag=True, help="Show the reads under way: rows done, estimated, rate, ETA (a bar each on a terminal)."
)
@click.option("--json", "as_json", is_flag=True, help="With --status: one JSON object per read.")
@click.option(
    "--cancel", is_flag=True, help="Stop the reads of TABLE...; capture then leaves them out until asked to read them again."
)
@click.option(
    "--where",
    metavar="CONDITION",
    help="Read again only the rows of TABLE this SQL condition selects (one table; signed with CDC_REQUEST_KEY).",
)
@pass_context
def snapshot(ctx: object, tables: tuple[str, ...], status: bool, as_json: bool, cancel: bool, where: str | None) -> None:
    """Read TABLE... (schema.table) again beside the stream, as op=r events; or show reads under way."""
    settings: Settings = ctx.settings  # type: ignore[attr-defined]
    if status and where is not None:
        raise ConfigError("--where asks for a read; --status shows the reads under way: use one or the other")
    if status:
        reads = read_status(settings)
        if not as_json and sys.stdout.isatty():
            if reads:
                Console().print(status_bars(reads))
            return
        for read in reads:
            click.echo(orjson.dumps(read).decode() if as_json else _status_line(read))
        return
    if not tables:
        raise ConfigError("name at least one table to read again (schema.table), or ask for --status")
    if where is not None and (cancel or len(tables) != 1):
        raise ConfigError("--where reads the matching rows of one table: name exactly one table, without --cancel")
    lsn = request_snapshot(settings, tables, cancel=cancel, where=where)
    if cancel:
        click.echo(f"asked capture to stop reading {', '.join(tables)} (request at LSN {lsn})")
    elif where is not None:
        click.echo(f"asked capture to read the rows of {tables[0]} where {where} again (request at LSN {lsn})")
    else:
        click.echo(f"asked capture to read {', '.join(tables)} again (request at LSN {lsn})")


def request_snapshot(settings: Settings, tables: tuple[str, ...], *, cancel: bool = False, where: str | None = None) -> str:
    """Emit the request to read ``tables`` again (with ``where``: the one table's rows it selects), or with
    ``cancel`` to stop reading them (each a published table capture includes, none an outbox table the
    views file declares: its rows are routed as events, not captured); its LSN."""
    import psycopg

    from cdc.capture.catalog import Catalog
    from derived_views.definitions import load

    routed = {tuple(name.partition(".")[::2]) for name in load(settings.views_file).outbox}
    catalog = Catalog(settings.database_url)
    try:
        published = {t.log_name: t for t in catalog.published_tables(settings.publication)}
        included = set(settings.tables)
        for name in tables:
            table = published.get(name)
            if table is not None and (table.schema, table.table) in routed:
                raise ConfigError(
                    f"{name} is an outbox table ({settings.views_file} declares it): its inserts are routed as "
                    f"events to the {settings.outbox_message_prefix}<aggregatetype> topics, not captured, so there "
                    "is nothing of it to read again"
                )
            if name not in published or (included and name not in included):
                raise ConfigError(
                    f"{name} is not a table capture reads: name a table of publication {settings.publication} "
                    f"as schema.table{' that CDC_TABLES includes' if included else ''}"
                )
        request = SnapshotRequest(cancel=tables) if cancel else SnapshotRequest(tables)
        if where is not None:
            request = _signed(settings, catalog, published[tables[0]], where)
    finally:
        catalog.close()
    try:
        # a standby capture reads from takes no write: the request goes to its primary (cdc.setup.standby_source)
        with psycopg.connect(writable_url(settings), autocommit=True) as conn:
            row = conn.execute(
                "SELECT pg_logical_emit_message(true, %s, %s::bytea)::text", (PREFIX, request.content())
            ).fetchone()
    except psycopg.errors.InsufficientPrivilege:
        raise PrivilegeError(
            "this role may not send requests to capture: run GRANT EXECUTE ON FUNCTION pg_logical_emit_message"
            "(boolean, text, bytea) TO it (on PostgreSQL 17 and later (boolean, text, bytea, boolean))"
        ) from None
    except psycopg.Error as exc:
        raise SourceError(f"cannot send the request: {str(exc).strip().splitlines()[0]}") from None
    return str(row[0]) if row else "?"


def _signed(settings: Settings, catalog: Catalog, table: PublishedTable, where: str) -> SnapshotRequest:
    """The signed request to read the rows of ``table`` that ``where`` selects, once PostgreSQL planned it."""
    import psycopg

    key = settings.request_key_bytes
    if key is None:
        raise ConfigError("--where requests are signed: set CDC_REQUEST_KEY to the secret capture has (at least 16 characters)")
    condition = checked_condition(where, table, catalog)
    try:
        with psycopg.connect(settings.database_url, autocommit=True, options=SEARCH_PATH_OPTION) as conn:
            with conn.transaction():
                conn.execute("SET TRANSACTION READ ONLY")
                conn.execute("SET LOCAL statement_timeout = '10s'")
                qualified = ".".join('"' + part.replace('"', '""') + '"' for part in (table.schema, table.table))
                conn.execute(f"EXPLAIN SELECT 1 FROM {qualified} WHERE {with_row_filter(table.row_filter, condition.sql)}")  # type: ignore[arg-type]
    except psycopg.errors.InsufficientPrivilege:
        raise PrivilegeError(
            f"checking --where plans it over {table.log_name}, which this role may not read: run GRANT SELECT ON "
            f"{table.qualified} TO it"
        ) from None
    except psycopg.OperationalError as exc:
        raise SourceError(f"cannot check the condition: {str(exc).strip().splitlines()[0]}") from None
    except psycopg.Error as exc:
        raise ConditionError(f"--where {where!r} cannot be run on {table.log_name}: {str(exc).strip().splitlines()[0]}") from None
    return SnapshotRequest((table.log_name,), where=condition.sql).signed(key, time.time_ns() // 1_000_000)


def status_bars(reads: list[dict[str, object]]) -> Table:
    """The reads under way as a terminal shows them: per read a bar of rows done over rows estimated,
    the counts, the rate and the time left (a read without an estimate gets no bar)."""
    table = Table(box=None, show_header=True, header_style="bold")
    for name in ("table", "progress", "rows", "rate", "left"):
        table.add_column(name, justify="right" if name in ("rows", "rate", "left") else "left")
    for read in reads:
        rows, estimate = int(cast(int, read["rows"])), read["estimated_rows"]
        total = max(int(cast(int, estimate)), rows) if estimate else None
        rate, left = read["rows_per_second"], read["eta_seconds"]
        table.add_row(
            str(read["table"]),
            ProgressBar(total=total, completed=rows, width=30) if total else "",
            f"{rows:,}/{total:,}" if total else f"{rows:,}",
            f"{float(cast(float, rate)):,.0f} rows/s" if rate is not None else "",
            f"{float(cast(float, left)):.0f} s" if left is not None else "",
        )
    return table


def _status_line(read: dict[str, object]) -> str:
    rows, estimate, rate, left = read["rows"], read["estimated_rows"], read["rows_per_second"], read["eta_seconds"]
    done = f"{rows}/{estimate} rows" if estimate else f"{rows} rows"
    speed = f", {float(rate):,.0f} rows/s" if isinstance(rate, float) else ""
    eta = f", about {float(left):.0f} s left" if isinstance(left, float) else ""
    return f"{read['table']}: {done}{speed}{eta}"
