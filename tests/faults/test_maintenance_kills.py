"""``kill -9`` of ``cdc sync --continuous`` inside its own maintenance: once during a compaction (Delta
``OPTIMIZE``), once during a vacuum (Delta ``VACUUM``), each caught by the line the sync logs as the task
starts and checked in the table's Delta log (no ``OPTIMIZE`` or ``VACUUM END`` commit: the process died
inside the task). The next run finishes the work, its metrics show the compaction, and then nothing is
lost: ``cdc verify warehouse`` finds the warehouse equal to the source."""

from __future__ import annotations

import os
import re
import shutil
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import psycopg
import pytest

from cdc.config.settings import load_settings
from cdc.run.coordinator import Capture
from local_servers.postgres import free_port
from tests.derived_views.pipeline import data_files_on_disk
from tests.faults.harness import Running, cdc_env, poll, seed, verify_warehouse
from tests.observability.test_sync_metrics import table_figures

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.faults, pytest.mark.pg, pytest.mark.spark, pytest.mark.slow]


def _operations(path: Path) -> list[str]:
    from deltalake import DeltaTable

    return [str(commit.get("operation")) for commit in DeltaTable(str(path)).history()]


def _add_categories(url: str, run: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("INSERT INTO categories (name) SELECT %s || g FROM generate_series(1, 5) g", (f"run {run} ",))


def _started(process_stderr: Path, verb: str) -> Path | None:
    """The table whose ``verb`` (``compacting``, ``vacuuming``) the sync logged as started, if it did."""
    found = re.search(rf"{verb} (\S+?):", process_stderr.read_text(errors="replace"))
    return Path(found[1]) if found else None


def test_kill_9_during_compaction_and_during_vacuum_then_a_run_loses_nothing(
    spark: SparkSession, reference_db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from cdc.config import view_arguments
    from derived_views.runs import runner

    data_dir = tmp_path / "data"
    # compaction from two small files on, vacuum of files older than an hour; the health read every half second
    maintenance = {"maintenance_small_files": "2", "maintenance_interval_s": "0.5", "vacuum_retention_hours": "1"}
    settings = load_settings(database_url=reference_db, data_dir=data_dir, **maintenance)
    seed(reference_db, products=20, orders=5)
    Capture(settings, once=True).run()
    runner.step(view_arguments.context_from_settings(settings, spark), ["warehouse"])
    env = cdc_env(reference_db, data_dir, **maintenance)
    running = Running()
    try:
        # 1. killed during a compaction: its first step appends a second file to the categories
        _add_categories(reference_db, 1)
        Capture(settings, once=True).run()
        first = running.cdc(env, ["sync", "--continuous", "--interval", "0.1"], tmp_path / "sync-1.err")
        poll(lambda: _started(first.stderr_path, "compacting") is not None or not first.running(), 300, "a compaction")
        assert first.kill9(), f"the sync ended before its compaction: {first.stderr()}"
        compacted = _started(first.stderr_path, "compacting")
        assert compacted is not None and "OPTIMIZE" not in _operations(compacted), "killed after the compaction's commit"

        # 2. the next run compacts (its metrics show it), then is killed during a vacuum of a file a failed
        # write left two days ago, which only then appears
        _add_categories(reference_db, 2)
        Capture(settings, once=True).run()
        port = free_port()
        continuous = ["sync", "--continuous", "--interval", "0.1"]
        second = running.cdc({**env, "CDC_METRICS_PORT": str(port)}, continuous, tmp_path / "sync-2.err")
        name = str(compacted.relative_to(data_dir))

        def maintained() -> bool:
            figures = table_figures(port)
            return name in figures.get("cdc_view_table_seconds_since_maintenance", {}) or not second.running()

        poll(maintained, 300, f"the compaction of {name} in the metrics")
        figures = table_figures(port)
        assert figures["cdc_view_table_files"][name] == 1 and figures["cdc_view_table_versions_since_compaction"][name] == 0
        assert 0 <= figures["cdc_view_table_seconds_since_maintenance"][name] < 600, figures
        assert "OPTIMIZE" in _operations(compacted)
        left = compacted / f"part-00000-{uuid.uuid4()}-c000.snappy.parquet"
        shutil.copy(data_files_on_disk(compacted)[0], left)
        two_days_ago = time.time() - 2 * 24 * 3600
        os.utime(left, (two_days_ago, two_days_ago))
        poll(lambda: _started(second.stderr_path, "vacuuming") is not None or not second.running(), 300, "a vacuum")
        assert second.kill9(), f"the sync ended before its vacuum: {second.stderr()}"
        assert _started(second.stderr_path, "vacuuming") == compacted
        assert "VACUUM END" not in _operations(compacted), "killed after the vacuum's end"
    finally:
        running.close()

    # 3. a run: what is due is done, and the warehouse equals the source
    _add_categories(reference_db, 3)
    Capture(settings, once=True).run()
    ctx = view_arguments.context_from_settings(settings, spark)
    done = runner.maintain(ctx, ["warehouse"], settings.maintenance_policy(), [name], dry_run=False)
    assert "vacuum" in [task.action for task in done] and not left.exists(), done
    assert runner.maintain(ctx, ["warehouse"], settings.maintenance_policy(), [name], dry_run=True) == []
    verify_warehouse(reference_db, data_dir, monkeypatch, capsys)
