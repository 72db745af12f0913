"""The rebuild a corruption error describes, followed step by step, gives a log equal to the source."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import psycopg
import pytest

from log_store.segment import FILE_HEADER_SIZE
from tests.cdc.helpers import replay, source_table

pytestmark = [pytest.mark.pg, pytest.mark.slow]

CDC = str(Path(__file__).resolve().parents[3] / ".venv" / "bin" / "cdc")
TOPIC = "cdc.public.categories"


def _cdc(url: str, data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CDC_")}
    env.update(CDC_DATABASE_URL=url, CDC_DATA_DIR=str(data_dir))
    return subprocess.run([CDC, *args], env=env, capture_output=True, text=True, timeout=300, cwd="/")


def test_the_described_rebuild_replaces_a_damaged_log(reference_db: str, tmp_path: Path) -> None:
    with psycopg.connect(reference_db, autocommit=True) as conn:
        conn.execute("INSERT INTO categories (name) SELECT 'c' || g FROM generate_series(1, 300) g")
    assert _cdc(reference_db, tmp_path, "capture", "--once").returncode == 0
    with psycopg.connect(reference_db, autocommit=True) as conn:
        conn.execute("DELETE FROM categories WHERE id <= 100")
        conn.execute("UPDATE categories SET name = 'renamed' WHERE id > 250")
    segment = sorted((tmp_path / "log" / "topics" / TOPIC / "0").glob("*.log"))[0]
    data = bytearray(segment.read_bytes())
    data[FILE_HEADER_SIZE + 100] ^= 0xFF
    segment.write_bytes(bytes(data))

    described = _cdc(reference_db, tmp_path, "log", "describe", TOPIC)
    assert described.returncode == 4, described.stderr
    (error,) = described.stderr.splitlines()
    assert error.startswith(f"error: corrupt segment {segment} at byte {FILE_HEADER_SIZE} (log offset 0)")
    log_dir = tmp_path / "log"
    assert f"stop `cdc capture`, move {log_dir} aside, run `cdc capture`" in error

    # the steps, as the message gives them (capture is not running)
    shutil.move(log_dir, tmp_path / "log.damaged")
    captured = _cdc(reference_db, tmp_path, "capture", "--once")
    assert captured.returncode == 0, captured.stderr
    assert replay(tmp_path, TOPIC) == source_table(reference_db, "categories")
    assert _cdc(reference_db, tmp_path, "log", "describe", TOPIC).returncode == 0
    # and the new log streams on from the new slot
    with psycopg.connect(reference_db, autocommit=True) as conn:
        conn.execute("UPDATE categories SET name = 'again' WHERE id = 200")
    assert _cdc(reference_db, tmp_path, "capture", "--once").returncode == 0
    assert replay(tmp_path, TOPIC) == source_table(reference_db, "categories")
