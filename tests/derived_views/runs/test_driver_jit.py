"""A one-shot run with small work starts its driver JVM with C1 alone, and completes; larger work keeps
the default compilers."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from cdc.commands.demo_cmd import _change_one_product
from derived_views.engine import evaluation
from derived_views.runs import short_run
from derived_views.runs.status import delta_tables
from derived_views.source.log_location import LogLocation
from derived_views.source.log_source import read_watermark
from migrations.sample_data import insert_sample_data
from tests.derived_views.conftest import EXAMPLE_VIEWS
from tests.derived_views.pipeline import capture, context, settings_for, sync

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.pg, pytest.mark.spark, pytest.mark.slow]

CDC = str(Path(sys.executable).with_name("cdc"))
VIEWS = ["warehouse", "search", "cache"]


def _pending(location: LogLocation, data_dir: Path, prefix: str) -> int | None:
    return short_run.pending_everywhere(location, delta_tables(data_dir), prefix)


def test_a_small_one_shot_sync_of_every_view_compiles_with_c1_alone_and_the_estimate_follows_the_work(
    spark: SparkSession,
    reference_db: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    data_dir = tmp_path / "data"
    settings = settings_for(reference_db, data_dir, views_file=EXAMPLE_VIEWS)
    where = (LogLocation(path=str(settings.log_dir)), data_dir, settings.topic_prefix)
    assert _pending(*where) is None  # no log yet: the run itself says why
    assert not short_run.short_run(*where)

    insert_sample_data(reference_db, customers=20, products=40, orders=30)
    capture(settings)
    watermark = read_watermark(where[0])
    assert watermark is not None
    logged = sum(
        end
        for topic, partitions in watermark.offsets.items()
        if not topic.startswith(f"{settings.topic_prefix}.__")
        for end in partitions.values()
    )
    assert logged >= 90
    assert _pending(*where) == logged  # no view table has applied any of it
    assert short_run.short_run(*where)
    monkeypatch.setattr(short_run, "SMALL_BATCH_EVENTS", logged - 1)
    assert not short_run.short_run(*where)  # one event too many
    monkeypatch.undo()

    sync(context(spark, settings), VIEWS)
    assert _pending(*where) == 0
    _change_one_product(reference_db)
    capture(settings)
    assert _pending(*where) > 0
    assert short_run.short_run(*where)
    monkeypatch.setattr(evaluation, "SMALL_TABLE_BYTES", 0)
    assert not short_run.short_run(*where)  # the view tables are not small
    monkeypatch.undo()

    # the change into every view in a fresh process, as a scheduled run makes it: C1 alone, and no
    # warning that the JVM ran out of room for compiled code (see driver_jit.C1_ONLY)
    env = {**os.environ, "CDC_DATABASE_URL": reference_db, "CDC_DATA_DIR": str(data_dir), "CDC_VIEWS_FILE": str(EXAMPLE_VIEWS)}
    result = subprocess.run([CDC, "sync", "--once"], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert re.findall(r"driver_jit=(\S+)", result.stderr) == ["C1"], result.stderr
    assert "CodeCache" not in result.stderr, result.stderr
    assert _pending(*where) == 0
