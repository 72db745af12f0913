"""``cdc demo`` and ``cdc migrate``: show the whole pipeline on a throwaway PostgreSQL."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import click
import psycopg
from rich.console import Console

from cdc import migrate as migrations
from cdc.local_postgres import LocalPostgres
from cdc.settings import load_settings


@click.command("migrate")
@click.option("--revision", default="head", show_default=True, help="Alembic revision to upgrade to.")
def migrate(revision: str) -> None:
    """Apply the reference schema and the CDC bootstrap (publication, capture role) to CDC_DATABASE_URL."""
    settings = load_settings()
    migrations.upgrade(settings.database_url, revision, publication=settings.publication)
    click.echo(f"migrated {settings.safe_database_url()} to {revision}")


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
    from migrations.sample_data import insert_sample_data

    console = Console()
    data_dir = data_dir or Path(tempfile.mkdtemp(prefix="cdc-demo-"))
    data_dir.mkdir(parents=True, exist_ok=True)
    server = LocalPostgres()
    console.print("[bold]1.[/] starting a throwaway PostgreSQL with wal_level=logical ...")
    url = server.start()
    try:
        console.print(f"   server at {url} (data in {server.root})")
        console.print("[bold]2.[/] applying the reference schema and the CDC bootstrap (Alembic) ...")
        migrations.upgrade(url)
        console.print("[bold]3.[/] writing sample data ...")
        counts = insert_sample_data(url)
        console.print("   " + ", ".join(f"{table}: {rows}" for table, rows in counts.items()))
        with psycopg.connect(url) as conn:
            published = [row[0] for row in conn.execute(
                "SELECT schemaname || '.' || tablename FROM pg_publication_tables ORDER BY 1"
            )]
        console.print(f"   publication cdc_publication covers {', '.join(published)}")
        console.print(f"[bold]done.[/] log and views under {data_dir}")
    finally:
        if keep_postgres:
            console.print(f"   PostgreSQL left running at {url}; stop it with pg_ctl -D {server.data_dir} stop")
        else:
            server.stop()
    if not any(data_dir.iterdir()):
        shutil.rmtree(data_dir, ignore_errors=True)
