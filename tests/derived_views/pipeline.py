"""The whole pipeline in one test process: SQL on the source, capture, a sync step, verify (real parts)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.cdc.helpers import execute, settings_for

__all__ = [
    "capture",
    "context",
    "data_files_on_disk",
    "dead_letters",
    "execute",
    "in_process",
    "read_every_view_table",
    "rows",
    "settings_for",
    "sync",
    "synced",
    "through",
    "verify_views",
    "view_files_holding",
    "view_versions",
]

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from cdc.config.settings import Settings
    from derived_views.runs.runner import StepReport
    from derived_views.source.watermark import LogWatermark
    from derived_views.write.context import ViewContext


def capture(settings: Settings) -> None:
    """Capture up to the WAL position current now (snapshot first when the log has none)."""
    from cdc.run.coordinator import Capture

    Capture(settings, once=True).run()


def context(spark: SparkSession, settings: Settings) -> ViewContext:
    from cdc.config.view_arguments import context_from_settings

    return context_from_settings(settings, spark)


def sync(ctx: ViewContext, views: list[str], *, replace: bool = False) -> StepReport:
    """One sync step of ``views``; fails the test when a table failed."""
    from derived_views.runs import runner

    report = runner.step(ctx, views, replace=replace)
    assert not report.failures, [failure.line() for failure in report.failures]
    return report


def synced(
    spark: SparkSession, url: str, data_dir: Path, views: tuple[str, ...] = ("warehouse",), **extra: object
) -> tuple[ViewContext, LogWatermark]:
    """Capture what the source at ``url`` holds into ``data_dir`` (``extra``: more settings), sync ``views``
    once; the view context and the watermark the views are synced to."""
    from derived_views.runs import runner

    ctx = context(spark, settings := settings_for(url, data_dir, **extra))
    capture(settings)
    sync(ctx, list(views))
    watermark = runner.latest(ctx)
    assert watermark is not None
    return ctx, watermark


def verify_views(ctx: ViewContext, url: str, views: list[str], *, mask_key: bytes | None = None) -> int:
    """Verify ``views`` against the source; fails the test on any difference; returns rows compared."""
    from derived_views.runs import runner
    from derived_views.runs.verify import verify

    watermark = runner.latest(ctx)
    assert watermark is not None
    compared = 0
    for view in views:
        report = verify(ctx, view, url, watermark, mask_key=mask_key)
        assert report.ok, report.differences[:10]
        compared += report.compared
    return compared


def through(settings: Settings, ctx: ViewContext, views: list[str] | None = None) -> int:
    """Capture what the source holds, sync ``views`` (the warehouse by default) and verify them."""
    views = views or ["warehouse"]
    capture(settings)
    sync(ctx, views)
    return verify_views(ctx, settings.database_url, views)


def rows(spark: SparkSession, path: str, where: str = "true") -> list[dict[str, Any]]:
    """The rows of the Delta table at ``path`` matching ``where``, as dicts."""
    return [row.asDict(recursive=True) for row in spark.read.format("delta").load(path).filter(where).collect()]


def dead_letters(spark: SparkSession, ctx: ViewContext) -> list[dict[str, Any]]:
    """Every poison event the warehouse recorded (none when it has no dead-letter table)."""
    from delta.tables import DeltaTable

    from derived_views.views import warehouse

    path = warehouse.dead_letter_path(ctx)
    return rows(spark, path) if DeltaTable.isDeltaTable(spark, path) else []


def read_every_view_table(data_dir: Path) -> dict[str, int]:
    """Rows of every Delta table under ``data_dir`` read with ``deltalake`` (no JVM), by table path;
    a table ``deltalake`` cannot read (a reader feature it lacks) fails the test."""
    from deltalake import DeltaTable

    counts = {}
    for log_dir in sorted(data_dir.rglob("_delta_log")):
        counts[str(log_dir.parent.relative_to(data_dir))] = len(DeltaTable(str(log_dir.parent)).to_pandas())
    return counts


def data_files_on_disk(table: str | Path) -> list[Path]:
    """Every data file under the Delta table at ``table``, in its partition directories too (not its log's
    checkpoints)."""
    return [file for file in Path(table).rglob("*.parquet") if "_delta_log" not in file.parts]


def _pieces(value: str) -> list[str]:
    """``value`` in 12-character pieces (itself when shorter): a piece found is a trace of the value even
    when compression split it or a Delta log's statistics cut it short (at 32 characters)."""
    return [value[i : i + 12] for i in range(0, max(len(value) - 11, 1), 12)]


def view_files_holding(data_dir: Path, values: list[str]) -> dict[str, list[str]]:
    """Every file of the views under ``data_dir`` (all but the log and the views file: every file of every
    view table, their Delta logs included) holding a trace of one of ``values``, with the values traced."""
    found: dict[str, list[str]] = {}
    log = data_dir / "log"
    for path in sorted(p for p in data_dir.rglob("*") if p.is_file() and log not in p.parents and p.suffix != ".toml"):
        data = path.read_bytes()
        held = [value for value in values if any(piece.encode() in data for piece in _pieces(value))]
        if held:
            found[str(path.relative_to(data_dir))] = held
    return found


def view_versions(data_dir: Path) -> dict[str, int]:
    """The version of every Delta table of the views under ``data_dir``."""
    from deltalake import DeltaTable

    log = data_dir / "log"
    return {
        str(table.parent.relative_to(data_dir)): DeltaTable(str(table.parent)).version()
        for table in sorted(data_dir.rglob("_delta_log"))
        if log not in table.parents
    }


def in_process(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], settings: Settings, *args: str
) -> tuple[int, str, str]:
    """``cdc ARGS`` run in this process (its Spark session) with ``settings``' source, data directory, views
    file, tables and mask key: its exit status, stdout and stderr."""
    from cdc.cli import cli, run
    from cdc.commands import register

    register(cli)
    environment = {
        "CDC_DATABASE_URL": settings.database_url,
        "CDC_DATA_DIR": str(settings.data_dir),
        "CDC_VIEWS_FILE": str(settings.views_file),
        "CDC_TABLES": ",".join(settings.tables),
        "CDC_MASK_KEY": settings.mask_key_bytes.decode() if settings.mask_key_bytes else "",
    }
    for name, value in environment.items():
        if value:
            monkeypatch.setenv(name, value)
        else:
            monkeypatch.delenv(name, raising=False)
    capsys.readouterr()
    status = run(cli, list(args))
    shown = capsys.readouterr()
    return status, shown.out, shown.err
