"""``cdc capture`` on a data directory it cannot use: one error line, nothing confirmed, nothing lost.

Each test makes the condition for real (a file where the directory should be, permission bits that a
non-root user meets, a tmpfs that fills up), checks the one ``error:`` line and the slot, removes the
cause, and checks that the next run brings the log to exactly the source rows.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import psycopg
import pytest

from cdc.capture.lsn import Lsn
from log_store import LogStore
from tests.cdc.helpers import replay, source_table
from tests.fix_fs import SmallFilesystem, Unprivileged

pytestmark = [pytest.mark.pg, pytest.mark.slow]

CDC = str(Path(__file__).resolve().parents[3] / ".venv" / "bin" / "cdc")
TOPIC = "cdc.public.categories"


def _env(url: str, data_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CDC_")}
    env.update(CDC_DATABASE_URL=url, CDC_DATA_DIR=str(data_dir))
    return env


def _capture(url: str, data_dir: Path, prefix: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*(prefix or []), CDC, "capture", "--once"], env=_env(url, data_dir), capture_output=True, text=True, timeout=300, cwd="/"
    )


def _insert(url: str, rows: int, width: int = 10) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("INSERT INTO categories (name) SELECT repeat('x', %s) || g FROM generate_series(1, %s) g", (width, rows))


def _one_error(result: subprocess.CompletedProcess[str]) -> str:
    """The single ``error:`` line of a failed run: besides it only the run's own log lines, no traceback."""
    assert result.returncode == 5, result.stderr
    lines = [line for line in result.stderr.strip().splitlines() if not line.startswith("ts=")]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def _slot_confirmed(url: str) -> Lsn | None:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'cdc_slot'").fetchone()
    return Lsn.parse(row[0]) if row and row[0] else None


def _log_position(data_dir: Path) -> int:
    with LogStore.open(data_dir / "log") as log:
        watermark = log.latest_watermark()
    return int(watermark.position, 16) if watermark is not None else 0


def _assert_exact(url: str, data_dir: Path) -> None:
    assert replay(data_dir, TOPIC) == source_table(url, "categories")


def test_a_data_dir_that_is_a_file(reference_db: str, tmp_path: Path) -> None:
    _insert(reference_db, 20)
    data_dir = tmp_path / "data"
    data_dir.write_text("not a directory\n")
    line = _one_error(_capture(reference_db, data_dir))
    assert f"{data_dir} is a file, not a directory" in line
    assert "CDC_DATA_DIR" in line and "nothing was confirmed to the source" in line
    assert _slot_confirmed(reference_db) is None  # not even a slot: nothing was read
    assert data_dir.read_text() == "not a directory\n"
    data_dir.unlink()
    result = _capture(reference_db, data_dir)
    assert result.returncode == 0, result.stderr
    _assert_exact(reference_db, data_dir)


def test_a_read_only_data_dir(reference_db: str, tmp_path: Path, unprivileged: Unprivileged) -> None:
    _insert(reference_db, 20)
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    unprivileged.own(data_dir)
    data_dir.chmod(0o555)
    line = _one_error(_capture(reference_db, data_dir, unprivileged.command([])))
    assert f"{data_dir / 'log'}" in line and "permission denied" in line
    assert f"user {unprivileged.user}" in line and "nothing was confirmed to the source" in line
    assert _slot_confirmed(reference_db) is None
    data_dir.chmod(0o700)
    result = _capture(reference_db, data_dir, unprivileged.command([]))
    assert result.returncode == 0, result.stderr
    _assert_exact(reference_db, data_dir)


def test_a_read_only_log(reference_db: str, tmp_path: Path, unprivileged: Unprivileged) -> None:
    _insert(reference_db, 20)
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    unprivileged.own(data_dir)
    runner = unprivileged.command([])
    assert _capture(reference_db, data_dir, runner).returncode == 0
    confirmed = _slot_confirmed(reference_db)
    _insert(reference_db, 30)
    subprocess.run(["chmod", "-R", "a-w", str(data_dir / "log")], check=True)
    line = _one_error(_capture(reference_db, data_dir, runner))
    assert f"{data_dir / 'log' / 'writer.lock'}" in line and "permission denied" in line
    assert "nothing was confirmed to the source" in line and "cdc capture" in line
    assert _slot_confirmed(reference_db) == confirmed
    subprocess.run(["chmod", "-R", "u+w", str(data_dir / "log")], check=True)
    result = _capture(reference_db, data_dir, runner)
    assert result.returncode == 0, result.stderr
    _assert_exact(reference_db, data_dir)


def test_a_full_disk_during_the_first_read(reference_db: str, small_filesystem: SmallFilesystem) -> None:
    _insert(reference_db, 12_000, width=300)  # several MiB of events: more than the 2 MiB filesystem
    data_dir = small_filesystem.path / "data"
    line = _one_error(_capture(reference_db, data_dir))
    # the log's files, or the holding file of the table's changes during its read
    assert "no space left" in line and (str(data_dir / "log") in line or str(data_dir / "held") in line), line
    assert "nothing was confirmed to the source past LSN" in line and "cdc capture" in line
    small_filesystem.resize("64m")
    result = _capture(reference_db, data_dir)
    assert result.returncode == 0, result.stderr
    _assert_exact(reference_db, data_dir)


def test_a_full_disk_while_streaming(reference_db: str, small_filesystem: SmallFilesystem) -> None:
    small_filesystem.resize("8m")
    data_dir = small_filesystem.path / "data"
    _insert(reference_db, 50)
    assert _capture(reference_db, data_dir).returncode == 0
    filler = small_filesystem.fill(leave=256 << 10)  # room to open the log, not for the changes
    with psycopg.connect(reference_db, autocommit=True) as conn:
        conn.execute("UPDATE categories SET name = name || '!' WHERE id <= 10")
        conn.execute("DELETE FROM categories WHERE id > 45")
    _insert(reference_db, 3000, width=300)
    line = _one_error(_capture(reference_db, data_dir))
    assert "no space left" in line and str(data_dir / "log") in line
    assert "nothing was confirmed to the source past LSN" in line
    # durable before confirmed: the slot was not told of anything the log does not hold
    confirmed = _slot_confirmed(reference_db)
    assert confirmed is not None and confirmed <= _log_position(data_dir) + 1
    filler.unlink()
    result = _capture(reference_db, data_dir)
    assert result.returncode == 0, result.stderr
    _assert_exact(reference_db, data_dir)
