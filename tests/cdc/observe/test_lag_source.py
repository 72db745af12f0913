"""``cdc lag`` against a real PostgreSQL slot: it grows with writes and falls when the slot advances."""

from __future__ import annotations

import re
from pathlib import Path

import jsonschema
import psycopg
import pytest

from cdc.config.settings import load_settings
from cdc.observe.lag import measure
from cdc.observe.lag_report import JSON_SCHEMA


@pytest.fixture
def slot_settings(reference_db: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    with psycopg.connect(reference_db, autocommit=True) as conn:
        conn.execute("SELECT pg_create_logical_replication_slot('lag_slot', 'pgoutput')")
    return load_settings(database_url=reference_db, slot="lag_slot", data_dir=tmp_path)


def _write(url: str, rows: int) -> None:
    with psycopg.connect(url) as conn:
        conn.execute("INSERT INTO categories (name) SELECT 'c' || g FROM generate_series(1, %s) g", (rows,))


def test_missing_slot_is_reported(reference_db: str, tmp_path: Path) -> None:
    report = measure(load_settings(database_url=reference_db, slot="no_such_slot", data_dir=tmp_path))
    assert report.source.exists is False
    assert any("no_such_slot does not exist" in w for w in report.warnings)
    jsonschema.validate(report.to_dict(), JSON_SCHEMA)


def test_lag_grows_with_writes_and_falls_when_confirmed(slot_settings) -> None:  # type: ignore[no-untyped-def]
    before = measure(slot_settings).source
    assert before.exists and not before.active
    _write(slot_settings.database_url, 500)
    grown = measure(slot_settings, max_wal_bytes=0, max_lag_seconds=3600)
    assert grown.source.wal_bytes_behind > before.wal_bytes_behind
    assert grown.source.retained_wal_bytes >= grown.source.wal_bytes_behind
    assert grown.source.catalog_xmin_age is not None and grown.source.catalog_xmin_age >= 1
    assert grown.source.oldest_unconfirmed_age_seconds is not None
    assert 0 <= grown.source.oldest_unconfirmed_age_seconds < 600
    assert not grown.ok and any("WAL bytes behind" in v for v in grown.violations)
    jsonschema.validate(grown.to_dict(), JSON_SCHEMA)

    with psycopg.connect(slot_settings.database_url, autocommit=True) as conn:
        conn.execute("SELECT pg_replication_slot_advance('lag_slot', pg_current_wal_lsn())")
    caught_up = measure(slot_settings, max_wal_bytes=0)
    assert caught_up.source.wal_bytes_behind == 0
    assert caught_up.source.oldest_unconfirmed_age_seconds == 0.0
    assert caught_up.ok


def test_unreachable_source_is_one_clear_error(tmp_path: Path) -> None:
    from cdc.capture.errors import SourceError

    settings = load_settings(database_url="postgresql://app:s3cret@127.0.0.1:1/shop", data_dir=tmp_path)
    with pytest.raises(SourceError) as info:
        measure(settings)
    assert "s3cret" not in str(info.value)
    assert "CDC_DATABASE_URL" in str(info.value)


def test_watch_refreshes_until_interrupted(slot_settings) -> None:  # type: ignore[no-untyped-def]
    import os
    import queue
    import signal
    import subprocess
    import sys
    import threading

    cdc = Path(sys.executable).with_name("cdc")
    env = {
        **os.environ,
        "CDC_DATABASE_URL": slot_settings.database_url,
        "CDC_SLOT": "lag_slot",
        "CDC_DATA_DIR": str(slot_settings.data_dir),
        "COLUMNS": "120",
    }
    process = subprocess.Popen(
        [str(cdc), "lag", "--watch", "--interval", "0.2"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    lines: queue.Queue[str] = queue.Queue()
    assert process.stdout is not None
    threading.Thread(target=lambda: [lines.put(line) for line in process.stdout], daemon=True).start()  # type: ignore[union-attr]
    seen = ""
    try:
        while seen.count("source → log") < 2:
            seen += lines.get(timeout=60)
        assert "lag_slot (inactive)" in seen
        assert re.search(r"catalog_xmin age[ │]+[0-9]+ transactions", seen), seen
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=30)
    assert process.returncode == 0
