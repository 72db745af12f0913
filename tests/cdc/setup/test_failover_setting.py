"""``CDC_SLOT_FAILOVER=true`` on a server without failover slots (before 17): one error, nothing created."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from tests.cdc.helpers import run_cdc, slot_names

pytestmark = pytest.mark.pg


@pytest.mark.parametrize("command", [["setup"], ["capture", "--once"]])
def test_failover_true_before_17_is_one_error_and_creates_nothing(reference_db: str, tmp_path: Path, command: list[str]) -> None:
    with psycopg.connect(reference_db) as conn:
        if conn.info.server_version >= 170000:
            pytest.skip("the server has failover slots")
        conn.execute("DROP PUBLICATION IF EXISTS cdc_publication")
        conn.commit()
        if command[0] == "capture":
            conn.execute("CREATE PUBLICATION cdc_publication FOR ALL TABLES")
            conn.commit()
    result = run_cdc(reference_db, tmp_path / "data", *command, slot_failover="true")
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 2, result.stdout + result.stderr
    assert len(errors) == 1 and "CDC_SLOT_FAILOVER=true needs PostgreSQL 17 or newer" in errors[0], result.stderr
    assert slot_names(reference_db) == []
    with psycopg.connect(reference_db) as conn:
        publications = conn.execute("SELECT count(*) FROM pg_publication").fetchone()
    assert publications == ((0,) if command[0] == "setup" else (1,))
