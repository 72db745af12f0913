"""The views on a log kept in Kafka: synced from the driver and through Spark's Kafka source, verified exact."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.derived_views.test_end_to_end import ALL, CHANGES, _capture, _context, _exec, _seed, _verify_all

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.pg, pytest.mark.spark, pytest.mark.kafka, pytest.mark.slow]


def test_views_build_and_sync_from_kafka_exactly(
    spark: SparkSession,
    reference_db: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    kafka_bootstrap: str,
    kafka_prefix: str,
) -> None:
    """The first sync builds every view table from Kafka's offset 0 through Spark's Kafka source; the next step
    reads from offsets past commit markers through the Kafka client in the driver; every view then equals the
    source, `cdc lag` measures each view against Kafka's end offsets, and `cdc rebuild` replays Kafka into the
    same rows in one commit."""
    from cdc.cli import cli, run
    from cdc.commands import register
    from cdc.config.settings import load_settings
    from cdc.observe.lag import measure
    from derived_views.runs import runner
    from derived_views.source import pending
    from derived_views.views import warehouse
    from tests.derived_views.conftest import EXAMPLE_VIEWS

    settings = load_settings(
        database_url=reference_db,
        data_dir=str(tmp_path),
        views_file=str(EXAMPLE_VIEWS),
        log=f"kafka://{kafka_bootstrap}",
        topic_prefix=kafka_prefix,
    )
    _seed(reference_db)
    _capture(settings)
    ctx = _context(spark, settings)
    assert ctx.log.kafka is not None and not (tmp_path / "log").exists()
    with monkeypatch.context() as patched:
        patched.setattr(pending, "DRIVER_READ_LIMIT", 0)  # every range through Spark's Kafka source
        runner.step(ctx, ALL)
    # (verified below, with the second step: every row the second step leaves alone is this step's)

    _exec(reference_db, *CHANGES)
    _capture(settings)
    behind = {view.view: view.events_pending for view in measure(settings).views}  # `cdc lag`: Kafka's end offsets
    assert set(behind) == set(ALL) and all(pending > 0 for pending in behind.values()), behind
    runner.step(ctx, ALL)  # small batches: read in the driver through the Kafka client
    _verify_all(ctx, reference_db)
    row = spark.read.format("delta").load(warehouse.current_path(ctx, "public.products")).filter("id = 1").first()
    assert row is not None and len(row["description"]) == 3200 * 32 and str(row["price"]) == "12.00"
    progress = ctx.progress(warehouse.current_path(ctx, "public.products"))
    assert progress.position == runner.latest(ctx).position  # type: ignore[union-attr]
    report = measure(settings)
    assert not report.violations and {view.view: view.events_pending for view in report.views} == dict.fromkeys(ALL, 0)

    # `cdc rebuild` replays Kafka from offset 0 (here in the driver) into the rows verified above, through the CLI
    # (same process, same Spark session)
    before = spark.read.format("delta").load(warehouse.current_path(ctx, "public.products")).collect()
    for name, value in {
        "DATABASE_URL": reference_db,
        "DATA_DIR": str(tmp_path),
        "VIEWS_FILE": str(EXAMPLE_VIEWS),
        "LOG": f"kafka://{kafka_bootstrap}",
        "TOPIC_PREFIX": kafka_prefix,
    }.items():
        monkeypatch.setenv(f"CDC_{name}", value)
    register(cli)
    versions = len(spark.sql(f"DESCRIBE HISTORY delta.`{warehouse.current_path(ctx, 'public.products')}`").collect())
    assert run(cli, ["rebuild", "warehouse"]) == 0
    history = spark.sql(f"DESCRIBE HISTORY delta.`{warehouse.current_path(ctx, 'public.products')}`").collect()
    assert len(history) == versions + 1  # one commit
    rebuilt = spark.read.format("delta").load(warehouse.current_path(ctx, "public.products")).collect()
    by_key = {row["_cdc_key"]: row.asDict() for row in before}  # by name: a rebuild may order columns otherwise
    assert {row["_cdc_key"]: row.asDict() for row in rebuilt} == by_key and len(by_key) == 19
