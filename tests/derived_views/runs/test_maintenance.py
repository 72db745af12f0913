"""View tables kept healthy: a continuous sync compacts and vacuums its tables between steps by itself,
and ``cdc views maintain`` does the same once (``--dry-run`` only shows it); the views' data, positions and
readers of versions younger than the retention are untouched."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.derived_views.conftest import EXAMPLE_VIEWS
from tests.derived_views.log_builder import LogBuilder, product
from tests.derived_views.pipeline import data_files_on_disk

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from derived_views.runs.runner import StepReport
    from derived_views.write.context import ViewContext

pytestmark = pytest.mark.spark

STEPS = 4


def _ids(path: str) -> list[int]:
    from deltalake import DeltaTable

    return sorted(DeltaTable(path).to_pyarrow_table(columns=["id"]).column("id").to_pylist())


def test_a_continuous_sync_compacts_and_vacuums_its_tables_between_steps(
    ctx: ViewContext, log: LogBuilder, tmp_path: Path
) -> None:
    from deltalake import DeltaTable

    from derived_views.definitions import load
    from derived_views.engine.commit_progress import committed_progress
    from derived_views.engine.maintenance import MaintenancePolicy
    from derived_views.runs import runner
    from derived_views.runs.upkeep import due_tasks
    from derived_views.views import warehouse

    views = tmp_path / "views.toml"
    views.write_text('[warehouse]\ntables = ["public.products"]\n')
    ctx.definitions = load(views)  # the products alone: a lean run

    # retention 0: every file no current version needs goes at once (settings allow no less than an hour)
    policy = MaintenancePolicy(small_files=3, versions=1000, retention_hours=0, interval_s=0)
    current = warehouse.current_path(ctx, "public.products")
    history = warehouse.history_path(ctx, "public.products")
    reports: list[StepReport] = []

    def on_step(report: StepReport) -> None:  # a writer: one insert after each step
        reports.append(report)
        if len(reports) < STEPS:
            with log.transaction() as tx:
                tx.insert("public.products", product(len(reports) + 1, f"Lamp {len(reports) + 1}"))

    give_up = time.monotonic() + 400  # only so that a loop that never settles fails instead of hanging

    def settled() -> bool:
        return len(reports) >= STEPS and (not due_tasks([current, history], policy) or time.monotonic() > give_up)

    with log.transaction() as tx:
        tx.insert("public.products", product(1, "Lamp 1"))
    runner.continuous(ctx, ["warehouse"], 0.05, should_stop=settled, on_step=on_step, maintenance=policy)

    assert due_tasks([current, history], policy) == []
    for path in (current, history):
        assert _ids(path) == list(range(1, STEPS + 1)), path
        table = DeltaTable(path)
        files = {Path(uri).name for uri in table.file_uris()}
        assert len(files) < policy.small_files, path  # compacted
        assert {file.name for file in data_files_on_disk(path)} == files, path  # vacuumed, partitions too
        record = json.loads((Path(path) / "_cdc_maintenance.json").read_text())
        assert record["compacted_at"] and record["vacuumed_at"], path
        progress = committed_progress(path)
        assert progress is not None and progress.position == reports[-1].watermark.position  # type: ignore[union-attr]
        operations = [commit["operation"] for commit in table.history()]
        assert "OPTIMIZE" in operations and "VACUUM END" in operations, operations


def test_views_maintain_shows_then_compacts_and_keeps_old_versions_readable(
    ctx: ViewContext, log: LogBuilder, data_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from deltalake import DeltaTable

    from cdc.cli import cli, run
    from cdc.commands import register
    from derived_views.runs import runner
    from derived_views.views import warehouse

    for pid in range(1, 4):
        with log.transaction() as tx:
            tx.insert("public.products", product(pid, f"Lamp {pid}"))
        runner.step(ctx, ["warehouse"])
    current = warehouse.current_path(ctx, "public.products")
    history = warehouse.history_path(ctx, "public.products")
    versions = {path: DeltaTable(path).version() for path in (current, history)}

    register(cli)
    monkeypatch.setenv("CDC_DATA_DIR", str(data_dir))
    monkeypatch.setenv("CDC_VIEWS_FILE", str(EXAMPLE_VIEWS))
    monkeypatch.setenv("CDC_MAINTENANCE_SMALL_FILES", "2")
    capsys.readouterr()
    assert run(cli, ["views", "maintain", "--dry-run"]) == 0
    shown = capsys.readouterr().out
    assert "would compact warehouse/current/public.products: 3 small files" in shown, shown
    assert "would compact warehouse/history/public.products" in shown and "vacuum" not in shown, shown
    assert {path: DeltaTable(path).version() for path in versions} == versions  # nothing done

    assert run(cli, ["views", "maintain", "warehouse/current/public.products"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "compacted warehouse/current/public.products: 3 small files (compacted from 2)"
    ]
    assert len(DeltaTable(current).file_uris()) == 1 and _ids(current) == [1, 2, 3]
    assert DeltaTable(history).version() == versions[history]  # not named: left alone
    # a reader of an older version keeps working: its files are younger than the retention (7 days)
    assert _ids_as_of(current, 0) == [1]

    assert run(cli, ["views", "--json"]) == 0
    tables = json.loads(capsys.readouterr().out)["tables"]
    (listed,) = [t for t in tables if t["path"] == current and t["view"] == "warehouse"]
    assert listed["files"] == 1 and listed["version"] == versions[current] + 1 and listed["compacted_at"], listed
    assert listed["versions_since_compaction"] == 0 and listed["vacuumed_at"] is None, listed


def _ids_as_of(path: str, version: int) -> list[int]:
    from deltalake import DeltaTable

    return sorted(DeltaTable(path, version=version).to_pyarrow_table(columns=["id"]).column("id").to_pylist())


def test_dropping_earlier_versions_leaves_no_byte_of_them_with_deletion_vectors_and_change_files(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A table with deletion vectors and a change data feed, whose rows were deleted and updated: after
    :func:`drop_earlier_versions` no file under it holds a value only an earlier version held (data,
    change and deletion-vector files, Delta log statistics and checksums), the newest version reads as
    before, its commits carry the table's progress, and its own properties are as they were."""
    from deltalake import DeltaTable

    from derived_views.engine.commit_progress import committed_progress
    from derived_views.engine.earlier_versions import drop_earlier_versions
    from derived_views.engine.progress import Progress
    from tests.cdc.capture.test_publication_rules import secret
    from tests.derived_views.pipeline import view_files_holding

    path = str(tmp_path / "table")
    spark.sql(
        f"CREATE TABLE delta.`{path}` (id int, name string) USING delta TBLPROPERTIES "
        "('delta.enableDeletionVectors' = 'true', 'delta.enableChangeDataFeed' = 'true', 'delta.checkpointInterval' = '100')"
    )
    rows = [(n, secret("name", n)) for n in range(1, 5)]  # in one file, which the rows kept keep referenced
    spark.createDataFrame(rows, "id int, name string").coalesce(1).write.format("delta").mode("append").save(path)
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id = 1")
    spark.sql(f"UPDATE delta.`{path}` SET name = '{secret('renamed', 2)}' WHERE id = 2")
    gone, kept = [secret("name", 1), secret("name", 2)], [secret("renamed", 2), secret("name", 3)]
    assert set(sum(view_files_holding(tmp_path, gone).values(), [])) == set(gone)
    progress = Progress({"cdc.public.t": {"0": 7}}, "00000000016B3A58", 1)

    drop_earlier_versions(spark, path, progress)

    assert view_files_holding(tmp_path, gone) == {}
    assert set(sum(view_files_holding(tmp_path, kept).values(), [])) == set(kept)  # the search finds what is there
    read = spark.read.format("delta").load(path).collect()
    assert sorted((row["id"], row["name"]) for row in read) == [
        (2, secret("renamed", 2)),
        (3, secret("name", 3)),
        (4, secret("name", 4)),
    ]
    table = DeltaTable(path)
    assert committed_progress(path) == progress
    assert all(commit.get("userMetadata") == progress.to_json() for commit in table.history())
    assert table.metadata().configuration["delta.checkpointInterval"] == "100"
    assert "delta.logRetentionDuration" not in table.metadata().configuration
    assert not list(Path(path, "_change_data").glob("*.parquet"))
