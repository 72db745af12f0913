"""One writer at a time: a second writer gets LogLockedError naming the holder's pid."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from log_store import LogStore
from log_store.errors import CleanerLockedError, LogLockedError
from log_store.lock import FileLock, holder_pid

_HOLD = """
import sys
from pathlib import Path
from log_store import LogStore
log = LogStore.open(Path(sys.argv[1]), writer=True)
print("locked", flush=True)
sys.stdin.readline()
log.close()
print("released", flush=True)
"""


def test_second_writer_in_the_same_process(tmp_path: Path) -> None:
    with LogStore.open(tmp_path, writer=True):
        with pytest.raises(LogLockedError) as caught:
            LogStore.open(tmp_path, writer=True)
        assert caught.value.pid == os.getpid()
        assert str(tmp_path / "writer.lock") in str(caught.value)
        assert f"process {os.getpid()}" in str(caught.value)
    LogStore.open(tmp_path, writer=True).close()  # released on close


def test_second_writer_in_another_process(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).parents[2],
    )
    try:
        assert holder.stdout is not None and holder.stdin is not None
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(LogLockedError) as caught:
            LogStore.open(tmp_path, writer=True)
        assert caught.value.pid == holder.pid
        with LogStore.open(tmp_path) as reader:  # readers are never locked out
            assert reader.topics() == []
        holder.stdin.write("\n")
        holder.stdin.flush()
        assert holder.stdout.readline().strip() == "released"
    finally:
        holder.wait(timeout=30)
    LogStore.open(tmp_path, writer=True).close()


def test_lock_of_a_dead_process_is_free(tmp_path: Path) -> None:
    code = (
        "import sys; from pathlib import Path; from log_store import LogStore; "
        "LogStore.open(Path(sys.argv[1]), writer=True); sys.exit(0)"
    )
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=True, cwd=Path(__file__).parents[2])
    LogStore.open(tmp_path, writer=True).close()


def test_cleaner_lock(tmp_path: Path) -> None:
    lock = FileLock(tmp_path / "cleaner.lock", CleanerLockedError)
    lock.acquire()
    assert holder_pid(tmp_path / "cleaner.lock") == os.getpid()
    with LogStore.open(tmp_path, writer=True) as log:
        with pytest.raises(CleanerLockedError, match="cleaner lock"):
            log.compact()
    lock.release()
    free = FileLock(tmp_path / "cleaner.lock")
    assert free.try_acquire() and free.held
    free.release()
