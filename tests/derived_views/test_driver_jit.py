"""A one-shot run with small work starts its driver JVM with C1 alone; larger work keeps the default."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from derived_views import driver_jit, evaluation
from derived_views.log_location import LogLocation
from derived_views.log_source import read_watermark
from tests.derived_views.pipeline import capture, execute, settings_for

pytestmark = [pytest.mark.pg, pytest.mark.spark, pytest.mark.slow]

CDC = str(Path(sys.executable).with_name("cdc"))


def test_a_small_one_shot_sync_compiles_with_c1_alone_and_the_estimate_follows_the_work(
    reference_db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    data_dir = tmp_path / "data"
    settings = settings_for(reference_db, data_dir)
    location = LogLocation(path=str(settings.log_dir))
    where = (location, data_dir, settings.topic_prefix)
    assert driver_jit.pending_everywhere(*where) is None  # no log yet: the run itself says why
    assert not driver_jit.short_run(*where)

    execute(reference_db, "INSERT INTO categories (name) SELECT 'c' || n FROM generate_series(1, 40) n")
    capture(settings)
    watermark = read_watermark(location)
    assert watermark is not None
    logged = sum(end for topic, partitions in watermark.offsets.items() if not topic.startswith(f"{settings.topic_prefix}.__")
                 for end in partitions.values())
    assert logged >= 40
    assert driver_jit.pending_everywhere(*where) == logged  # no view table has applied any of it
    assert driver_jit.short_run(*where)
    monkeypatch.setattr(driver_jit, "SMALL_BATCH_EVENTS", logged - 1)
    assert not driver_jit.short_run(*where)  # one event too many
    monkeypatch.undo()

    env = {**os.environ, "CDC_DATABASE_URL": reference_db, "CDC_DATA_DIR": str(data_dir)}
    result = subprocess.run([CDC, "sync", "warehouse", "--once"], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert re.findall(r"driver_jit=(\S+)", result.stderr) == ["C1"], result.stderr

    assert driver_jit.pending_everywhere(*where) == 0  # the warehouse reads every topic
    execute(reference_db, "UPDATE categories SET name = name || '!' WHERE id % 2 = 0")
    capture(settings)
    assert driver_jit.pending_everywhere(*where) == 20
    assert driver_jit.short_run(*where)
    monkeypatch.setattr(evaluation, "SMALL_TABLE_BYTES", 0)
    assert not driver_jit.short_run(*where)  # the view tables are not small
