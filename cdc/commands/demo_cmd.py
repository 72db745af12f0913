"""``cdc demo`` and ``cdc migrate``: show the whole pipeline on a throwaway PostgreSQL.

The demo runs the same commands a user runs (``cdc setup``, ``cdc capture --once``, ``cdc sync --once``,
``cdc search``, ``cdc cache get``, ``cdc verify``, ``cdc lag``) in this process, so that one Spark session
serves every view step, against a cluster it starts and removes itself.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import click
import psycopg
from rich.console import Console

from cdc.capture.errors import SourceError
from cdc.config.settings import load_settings
from cdc.errors import CdcError

#: The reference schema's views (a search index of products, a cache of orders), which the demo syncs.
EXAMPLE_VIEWS = Path(__file__).resolve().parents[2] / "views.example.toml"


@click.command("migrate")
@click.option("--revision", default="head", show_default=True, help="Alembic revision to upgrade to.")
def migrate(revision: str) -> None:
    """Apply the reference schema and the CDC bootstrap (publication, capture role) to CDC_DATABASE_URL."""
    settings = load_settings()
    from cdc.setup import migrate as migration_steps  # Alembic: only for the commands that migrate

    migration_steps.upgrade(settings.database_url, revision, publication=settings.publication)
    click.echo(f"migrated {settings.safe_database_url()} to {revision}")


@contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    """Point every ``cdc`` command run in this process at the demo's server and data directory."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _cdc(console: Console, *args: str) -> None:
    """Run one ``cdc`` command as a user would, failing the demo when it fails."""
    from cdc.commands.run_command import run

    console.print(f"[bold cyan]$ cdc {' '.join(args)}[/]")
    root = click.get_current_context().find_root().command  # the ``cdc`` group this command runs under
    status = run(root, list(args))
    if status != 0:
        raise CdcError(f"`cdc {' '.join(args)}` exited with status {status}")


def _change_one_product(url: str) -> tuple[int, str]:
    """Rename a category, reprice one of its products and add a line to an order holding it."""
    with psycopg.connect(url) as conn:
        product_id, category_id = conn.execute(
            "SELECT p.id, p.category_id FROM products p JOIN order_items i ON i.product_id = p.id ORDER BY p.id LIMIT 1"
        ).fetchone()  # type: ignore[misc]
        conn.execute("UPDATE categories SET name = 'vintage lamps' WHERE id = %s", (category_id,))
        conn.execute("UPDATE products SET price = 12.34, name = 'brass lantern' WHERE id = %s", (product_id,))
        order_id = conn.execute(
            "SELECT order_id FROM order_items WHERE product_id = %s ORDER BY order_id LIMIT 1", (product_id,)
        ).fetchone()[0]  # type: ignore[index]
        conn.execute(
            "INSERT INTO order_items (order_id, line_no, product_id, quantity, unit_price) "
            "SELECT %s, max(line_no) + 1, %s, 2, 12.34 FROM order_items WHERE order_id = %s",
            (order_id, product_id, order_id),
        )
        conn.execute("DELETE FROM customers WHERE id NOT IN (SELECT customer_id FROM orders)")
    return product_id, str(order_id)


@click.command("demo")
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where the log and the Delta tables go (default: a new temporary directory, kept afterwards).",
)
@click.option("--keep-postgres/--stop-postgres", default=False, help="Leave the throwaway server running.")
def demo(data_dir: Path | None, keep_postgres: bool) -> None:
    """Start a throwaway PostgreSQL, write sample data, and run the pipeline end to end."""
    from cdc.setup import migrate as migration_steps
    from local_servers.postgres import LocalPostgres, PostgresUnavailable
    from migrations.sample_data import insert_sample_data

    console = Console()
    data_dir = (data_dir or Path(tempfile.mkdtemp(prefix="cdc-demo-"))).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    console.rule("1. a throwaway PostgreSQL with wal_level=logical")
    try:
        server = LocalPostgres()
        url = server.start()
    except PostgresUnavailable as exc:
        raise SourceError(str(exc)) from exc
    try:
        console.print(f"server at {url}, data directory {server.root}")
        console.rule("2. reference schema and CDC bootstrap (Alembic), sample data")
        migration_steps.upgrade(url)
        counts = insert_sample_data(url)
        console.print(", ".join(f"{table}: {rows} rows" for table, rows in counts.items()))
        settings = load_settings()  # the user's views file when they set one, else the example's
        views_file = settings.views_file if "views_file" in settings.model_fields_set else EXAMPLE_VIEWS
        environment = {
            "CDC_DATABASE_URL": url,
            "CDC_DATA_DIR": str(data_dir),
            "CDC_PARTITIONS": "3",
            "CDC_VIEWS_FILE": str(views_file),
        }
        with _environment(environment):
            console.rule("3. check the source and create the slot")
            _cdc(console, "setup")
            console.rule("4. initial snapshot into the log, then every view")
            _cdc(console, "capture", "--once")
            _cdc(console, "log", "topics")
            _cdc(console, "sync", "--once")
            console.rule("5. the application writes; capture and sync carry it everywhere")
            product_id, order_id = _change_one_product(url)
            console.print(
                f"renamed a category, repriced product {product_id} as 'brass lantern' (12.34), "
                f"added it to order {order_id}, deleted customers without orders"
            )
            _cdc(console, "lag")
            _cdc(console, "capture", "--once")
            _cdc(console, "sync", "--once")
            _cdc(console, "search", "brass lantern", "--limit", "3")
            _cdc(console, "cache", "get", "order", order_id)
            _cdc(console, "verify", "warehouse", "--no-sync")
            _cdc(console, "lag")
        console.rule("done")
        console.print(f"log and Delta tables are under {data_dir}")
    finally:
        if keep_postgres:
            console.print(f"PostgreSQL left running at {url}; stop it with pg_ctl -D {server.data_dir} stop")
        else:
            server.stop()
