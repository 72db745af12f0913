"""The PostgreSQL fixtures and the reference migrations, against a real server."""

from __future__ import annotations

import psycopg

from cdc import migrate


def test_server_is_configured_for_logical_decoding(pg_url: str) -> None:
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SHOW wal_level").fetchone() == ("logical",)
        assert int(conn.execute("SHOW max_replication_slots").fetchone()[0]) >= 10


def test_each_test_gets_its_own_database(pg_url: str, pg_server: object) -> None:
    with psycopg.connect(pg_url) as conn:
        name = conn.execute("SELECT current_database()").fetchone()[0]
    assert name.startswith("cdc_test_")
    assert pg_url.endswith("/" + name)


def test_reference_schema_and_bootstrap(reference_db: str) -> None:
    with psycopg.connect(reference_db) as conn:
        published = {
            row[0] for row in conn.execute("SELECT tablename FROM pg_publication_tables WHERE pubname = 'cdc_publication'")
        }
        assert published == {"customers", "categories", "products", "orders", "order_items"}
        assert conn.execute("SELECT pubviaroot FROM pg_publication WHERE pubname = 'cdc_publication'").fetchone() == (True,)
        role = conn.execute("SELECT rolreplication, rolcanlogin, rolsuper FROM pg_roles WHERE rolname = 'cdc_reader'").fetchone()
        assert role == (True, True, False)
        for table in published:
            assert conn.execute(
                "SELECT has_table_privilege('cdc_reader', %s, 'SELECT'), has_table_privilege('cdc_reader', %s, 'INSERT')",
                (f"public.{table}", f"public.{table}"),
            ).fetchone() == (True, False)
        types = dict(
            conn.execute("SELECT column_name, data_type FROM information_schema.columns WHERE table_name = 'products'").fetchall()
        )
        assert types["price"] == "numeric"
        assert types["attributes"] == "jsonb"
        assert types["tags"] == "ARRAY"


def test_capture_role_can_read_a_published_table(reference_db: str) -> None:
    user_url = reference_db.replace("postgres@", "cdc_reader@", 1)
    with psycopg.connect(reference_db, autocommit=True) as admin:
        admin.execute("INSERT INTO categories (name) VALUES ('books')")
    with psycopg.connect(user_url) as conn:
        assert conn.execute("SELECT name FROM categories").fetchall() == [("books",)]
        try:
            conn.execute("INSERT INTO categories (name) VALUES ('nope')")
        except psycopg.errors.InsufficientPrivilege:
            pass
        else:  # pragma: no cover - would mean the role is not least-privilege
            raise AssertionError("the capture role could write to a source table")


def test_migrations_are_idempotent_and_reversible(pg_url: str) -> None:
    migrate.upgrade(pg_url)
    migrate.upgrade(pg_url)
    migrate.downgrade(pg_url, "base")
    with psycopg.connect(pg_url) as conn:
        assert conn.execute(
            "SELECT count(*) FROM pg_tables WHERE schemaname = 'public' AND tablename <> 'alembic_version'"
        ).fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM pg_publication").fetchone() == (0,)


def test_tables_created_later_are_readable_by_the_capture_role(reference_db: str) -> None:
    with psycopg.connect(reference_db, autocommit=True) as admin:
        admin.execute("CREATE TABLE later (id int PRIMARY KEY)")
        assert admin.execute("SELECT has_table_privilege('cdc_reader', 'public.later', 'SELECT')").fetchone() == (True,)
