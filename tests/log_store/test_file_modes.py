"""Every file the log writes is 0600 and every directory 0700, whatever the process umask: they hold full rows."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from derived_views.runs.runner import view_locks
from log_store import LogConfig, LogStore, TopicPartition
from tests.log_store.helpers import rec


@pytest.fixture(params=[0o000, 0o022])
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    previous = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(previous)


def _modes(root: Path) -> dict[str, int]:
    """Mode of ``root`` and of everything below it, by path relative to ``root``'s parent."""
    out = {root.name: stat.S_IMODE(root.stat().st_mode)}
    for directory, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            path = Path(directory, name)
            out[str(path.relative_to(root.parent))] = stat.S_IMODE(path.lstat().st_mode)
    return out


def test_the_log_is_its_owners_only(tmp_path: Path, umask: int) -> None:
    data_dir = tmp_path / "data"
    root = data_dir / "log"
    with LogStore.open(root, LogConfig(segment_bytes=1024), writer=True) as log:
        log.ensure_topic("t", 2)
        log.ensure_topic("plain", 1, compacted=False)
        for g in range(20):
            log.append_group([rec("t", f"k{i}", f"v{g}" * 20) for i in range(6)], f"{g:016X}")
        log.roll()
        log.compact()
        log.commit_offsets("group", {TopicPartition("t", 0): 3})
    with LogStore.open(root, writer=True):  # a second open: clean-shutdown marker, published watermark again
        pass
    modes = _modes(data_dir)
    files = {path: mode for path, mode in modes.items() if (tmp_path / path).is_file()}
    dirs = {path: mode for path, mode in modes.items() if (tmp_path / path).is_dir()}
    assert {
        "data/log/writer.lock",
        "data/log/watermarks.log",
        "data/log/watermark.pub",
        "data/log/store.json",
        "data/log/consumer_offsets/group.json",
        "data/log/topics/t/0/cleaner.checkpoint",
    } <= set(files)
    assert any(path.endswith(".log") and "/topics/" in path for path in files)
    assert any(path.endswith(".index") for path in files)
    assert {path: mode for path, mode in files.items() if mode != 0o600} == {}
    assert {path: mode for path, mode in dirs.items() if mode != 0o700} == {}


def test_the_data_dir_and_view_locks_are_their_owners_only(tmp_path: Path, umask: int) -> None:
    from cdc.config.data_dir import secure_data_dir

    data_dir = tmp_path / "new" / "data"
    secure_data_dir(data_dir)
    assert stat.S_IMODE(data_dir.stat().st_mode) == 0o700
    opened = tmp_path / "opened"
    opened.mkdir(mode=0o777)
    opened.chmod(0o755)
    secure_data_dir(opened)  # made by hand with access for others: narrowed to its owner
    assert stat.S_IMODE(opened.stat().st_mode) == 0o700
    where = SimpleNamespace(views_dir=str(data_dir))  # the locks need only the views directory
    with view_locks(where, ["warehouse"]):  # type: ignore[arg-type]
        pass
    assert _modes(data_dir / "_locks") == {"_locks": 0o700, "_locks/warehouse.lock": 0o600}
