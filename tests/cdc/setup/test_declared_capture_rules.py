"""Capture rules declared in the views file (``[capture."<schema>.<table>"]``): ``cdc setup`` checks each
one (one error each, nothing created) and makes them the publication's column lists and row filters,
which capture then honours like any publication's; a changed rule is applied by the next setup."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from cdc.run.coordinator import Capture
from tests.cdc.capture.test_publication_rules import files_holding, insert_person, published_people, secret
from tests.cdc.helpers import execute, replay, run_cdc, settings_for, slot_names

pytestmark = pytest.mark.pg

TABLES = "public.people,public.plain"


def _tables(url: str) -> None:
    execute(
        url,
        "CREATE TABLE people (id int, region text, name text, ssn text, PRIMARY KEY (id, region))",
        "CREATE TABLE plain (id int PRIMARY KEY, v text)",
        "INSERT INTO plain VALUES (1, 'one')",
    )
    for n in range(1, 7):
        insert_person(url, n, "eu" if n % 2 else "us")


def _rules(url: str) -> dict[str, tuple[list[str] | None, str | None]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT schemaname || '.' || tablename, attnames, rowfilter FROM pg_publication_tables "
            "WHERE pubname = 'cdc_publication' ORDER BY 1"
        ).fetchall()
    return {str(r[0]): (r[1], r[2]) for r in rows}


def test_each_bad_rule_gets_one_error_and_nothing_is_created(pg_url: str, tmp_path: Path) -> None:
    _tables(pg_url)
    execute(pg_url, "CREATE TABLE regions (code text PRIMARY KEY, name text)")
    views = tmp_path / "views.toml"
    views.write_text(
        '[capture."public.people"]\nexclude = ["region", "ssn"]\n'  # a key column left out
        '[capture."public.plain"]\ncolumns = ["id", "nope"]\n'  # no such column
        '[capture."public.regions"]\nwhere = "name = "\n'  # does not parse
        '[capture."public.ghost"]\ncolumns = ["id"]\n'  # no such table
    )
    tables = TABLES + ",public.regions"
    for args in (("--check-only",), ()):
        result = run_cdc(pg_url, tmp_path, "setup", *args, views_file=str(views), tables=tables)
        assert result.returncode == 3, result.stdout + result.stderr
        errors = result.stderr.strip().splitlines()
        assert [line.split("]: ", 1)[0].rsplit("[", 1)[1] for line in errors] == [
            'capture."public.ghost"',
            'capture."public.people"',
            'capture."public.plain"',
            'capture."public.regions"',
        ], errors
        assert "public.ghost is not a table capture publishes" in errors[0]
        assert "leave out region of the replica identity of public.people" in errors[1]
        assert "nope is not a column of public.plain" in errors[2]
        assert "PostgreSQL refuses the rule: syntax error" in errors[3]
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT pubname FROM pg_publication").fetchall() == []
    assert slot_names(pg_url) == []

    # a filter on a column outside the replica identity, while updates are published
    views.write_text('[capture."public.regions"]\nwhere = "name = \'x\'"\n')
    result = run_cdc(pg_url, tmp_path, "setup", views_file=str(views), tables=tables)
    assert result.returncode == 3, result.stdout + result.stderr
    (error,) = result.stderr.strip().splitlines()
    assert "the rule filters the rows of public.regions on name, which the replica identity" in error, error


def test_declared_rules_become_the_publications_and_a_changed_rule_is_applied(pg_url: str, tmp_path: Path) -> None:
    _tables(pg_url)
    views = tmp_path / "views.toml"
    views.write_text('[capture."public.people"]\nexclude = ["ssn"]\nwhere = "region = \'eu\'"\n')
    result = run_cdc(pg_url, tmp_path, "setup", views_file=str(views), tables=TABLES)
    assert result.returncode == 0, result.stdout + result.stderr
    assert _rules(pg_url) == {
        "public.people": (["id", "region", "name"], "(region = 'eu'::text)"),
        "public.plain": (["id", "v"], None),
    }
    settings = settings_for(pg_url, tmp_path, views_file=str(views), tables=TABLES.split(","))
    Capture(settings, once=True).run()
    assert replay(tmp_path, "cdc.public.people") == published_people(pg_url)
    assert files_holding(tmp_path, [secret("ssn", n) for n in range(1, 7)]) == {}

    # a rule changed in the file is applied by the next setup, and capture reads the table again under it
    views.write_text('[capture."public.people"]\ncolumns = ["id", "region"]\nwhere = "region = \'eu\' AND id > 1"\n')
    result = run_cdc(pg_url, tmp_path, "setup", views_file=str(views), tables=TABLES)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "public.people given the rule the views file declares" in result.stdout
    assert _rules(pg_url)["public.people"] == (["id", "region"], "((region = 'eu'::text) AND (id > 1))")
    assert Capture(settings, once=True).run().tables_added == 1
    assert replay(tmp_path, "cdc.public.people") == published_people(pg_url, ("id", "region"), "region = 'eu' AND id > 1")
    # applied once: setup again changes nothing
    result = run_cdc(pg_url, tmp_path, "setup", views_file=str(views), tables=TABLES)
    assert result.returncode == 0 and "given the rule" not in result.stdout, result.stdout + result.stderr
