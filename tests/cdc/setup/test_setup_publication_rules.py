"""``cdc setup`` refuses a publication whose row filter or column list makes PostgreSQL refuse the
application's updates and deletes, with the fix, and creates nothing; the same publication made safe passes."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from tests.cdc.helpers import execute, run_cdc, slot_names

pytestmark = pytest.mark.pg


def _refused(url: str, statement: str) -> str:
    """The error PostgreSQL gives for ``statement`` (fails the test when it succeeds)."""
    with psycopg.connect(url, autocommit=True) as conn, pytest.raises(psycopg.Error) as refused:
        conn.execute(statement)
    return str(refused.value)


def _errors(url: str, data_dir: Path, *args: str, **settings: str) -> list[str]:
    result = run_cdc(url, data_dir, "setup", *args, **settings)
    assert result.returncode == 3, result.stdout + result.stderr
    return result.stderr.strip().splitlines()


def test_a_row_filter_outside_the_replica_identity_is_refused(pg_url: str, tmp_path: Path) -> None:
    execute(
        pg_url,
        "CREATE TABLE people (id int PRIMARY KEY, name text, region text, ssn text)",
        "INSERT INTO people VALUES (1, 'a', 'eu', 'x')",
        "CREATE PUBLICATION cdc_publication FOR TABLE people (id, name, region) WHERE (region = 'eu')",
    )
    assert "not part of the replica identity" in _refused(pg_url, "UPDATE people SET name = 'b'")
    for args in (("--check-only",), ()):
        (error,) = _errors(pg_url, tmp_path, *args)
        assert error.startswith(
            "error: publication cdc_publication filters the rows of public.people on region, which the replica "
            "identity of public.people does not hold: PostgreSQL refuses every UPDATE and DELETE of it"
        ), error
        assert "ALTER TABLE public.people REPLICA IDENTITY USING INDEX" in error
    assert slot_names(pg_url) == []
    # capture makes the same check before it touches the slot or the log (the rule may come later)
    result = run_cdc(pg_url, tmp_path, "capture", "--once")
    assert result.returncode == 3, result.stdout + result.stderr
    (error,) = result.stderr.strip().splitlines()
    assert "filters the rows of public.people on region" in error and "`cdc setup --check-only`" in error, error
    assert slot_names(pg_url) == [] and not (tmp_path / "log").exists()

    # an identity holding the filter's column: the application's writes work, and setup passes
    execute(pg_url, "CREATE UNIQUE INDEX people_id_region ON people (id, region)")
    execute(pg_url, "ALTER TABLE people ALTER COLUMN region SET NOT NULL")
    execute(pg_url, "ALTER TABLE people REPLICA IDENTITY USING INDEX people_id_region")
    execute(pg_url, "UPDATE people SET name = 'b'")
    result = run_cdc(pg_url, tmp_path, "setup")
    assert result.returncode == 0, result.stdout + result.stderr
    assert slot_names(pg_url) == ["cdc_slot"]


def test_a_column_list_leaving_out_replica_identity_columns_is_refused(pg_url: str, tmp_path: Path) -> None:
    execute(
        pg_url,
        "CREATE TABLE accounts (region text, id int, note text, PRIMARY KEY (region, id))",
        "CREATE TABLE logged (id int PRIMARY KEY, v text, secret text)",
        "ALTER TABLE logged REPLICA IDENTITY FULL",
        "INSERT INTO accounts VALUES ('eu', 1, 'n')",
        "INSERT INTO logged VALUES (1, 'v', 's')",
        "CREATE PUBLICATION cdc_publication FOR TABLE accounts (id, note), TABLE logged (id, v)",
    )
    assert "does not cover the replica identity" in _refused(pg_url, "DELETE FROM accounts")
    assert "does not cover the replica identity" in _refused(pg_url, "UPDATE logged SET v = 'w'")
    errors = _errors(pg_url, tmp_path, "--check-only")
    assert [line.split(":", 2)[1] for line in errors] == [
        " publication cdc_publication publishes only the columns id, note of public.accounts, which leave out region of "
        "the replica identity of public.accounts",
        " publication cdc_publication publishes a column list of public.logged, and the replica identity of "
        "public.logged is FULL",
    ]
    assert "add region to the column list" in errors[0]
    # under FULL, a list naming every column is refused too: the fix is no list, or an identity by key
    execute(pg_url, "ALTER PUBLICATION cdc_publication SET TABLE accounts, TABLE logged (id, v, secret)")
    assert "does not cover the replica identity" in _refused(pg_url, "UPDATE logged SET v = 'w'")
    (error,) = _errors(pg_url, tmp_path, "--check-only")
    assert "a column list of public.logged, and the replica identity of public.logged is FULL" in error, error
    assert "ALTER PUBLICATION cdc_publication SET TABLE public.logged)" in error, error

    # a publication of inserts only leaves updates and deletes alone
    execute(pg_url, "ALTER PUBLICATION cdc_publication SET (publish = 'insert')")
    execute(pg_url, "DELETE FROM accounts", "UPDATE logged SET v = 'w'")
    result = run_cdc(pg_url, tmp_path, "setup", "--check-only")
    assert "publication rules" not in result.stdout + result.stderr


def test_a_view_of_a_column_the_publication_leaves_out_is_refused(pg_url: str, tmp_path: Path) -> None:
    """Capture never reads an unpublished column, so a view naming one could never be built."""
    execute(
        pg_url,
        "CREATE TABLE people (id int, region text, name text, ssn text, PRIMARY KEY (id, region))",
        "CREATE PUBLICATION cdc_publication FOR TABLE people (id, region, name)",
    )
    views = tmp_path / "views.toml"
    views.write_text('[search.people]\nroot = "public.people"\ntext = ["name", "ssn"]\n')
    (error,) = _errors(pg_url, tmp_path, "--check-only", views_file=str(views))
    assert "[search.people] text: 'ssn' is not a column of the document" in error, error
    views.write_text('[search.people]\nroot = "public.people"\ntext = ["name"]\n')
    result = run_cdc(pg_url, tmp_path, "setup", "--check-only", views_file=str(views))
    assert result.returncode == 0, result.stdout + result.stderr
