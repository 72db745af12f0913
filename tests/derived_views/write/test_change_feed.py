"""With ``CDC_CHANGE_DATA_FEED`` on, a user's Spark job streams a warehouse table's changes with
``readChangeFeed``: the inserts, updates (before and after) and deletes each sync step applied."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.derived_views.conftest import EXAMPLE_VIEWS
from tests.derived_views.log_builder import LogBuilder, product

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.spark


def test_a_users_stream_reads_inserts_updates_and_deletes_from_the_change_feed(
    spark: SparkSession, log: LogBuilder, data_dir: Path, tmp_path: Path
) -> None:
    from derived_views.definitions import load
    from derived_views.runs import runner
    from derived_views.source.log_location import LogLocation
    from derived_views.views import warehouse
    from derived_views.write.context import ViewContext

    ctx = ViewContext(
        spark, str(data_dir), LogLocation.of(data_dir / "log"), "cdc", definitions=load(EXAMPLE_VIEWS), change_data_feed=True
    )
    try:
        with log.transaction() as tx:
            tx.insert("public.products", product(1, "Lamp"))
            tx.insert("public.products", product(2, "Chair"))
        runner.step(ctx, ["warehouse"])
        with log.transaction() as tx:
            tx.update("public.products", product(1, "Desk lamp"))
            tx.delete("public.products", {"id": 2})
            tx.insert("public.products", product(3, "Table"))
        runner.step(ctx, ["warehouse"])
    finally:
        spark.conf.set("spark.databricks.delta.properties.defaults.enableChangeDataFeed", "false")

    # the user's job: a stream of the current table's changes from its first version
    changes = (
        spark.readStream.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", 0)
        .load(warehouse.current_path(ctx, "public.products"))
        .select("id", "name", "_change_type")
    )
    query = (
        changes.writeStream.format("memory")
        .queryName("product_changes")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    seen = sorted((r["_change_type"], r["id"], r["name"]) for r in spark.sql("SELECT * FROM product_changes").collect())
    assert seen == [
        ("delete", 2, "Chair"),
        ("insert", 1, "Lamp"),
        ("insert", 2, "Chair"),
        ("insert", 3, "Table"),
        ("update_postimage", 1, "Desk lamp"),
        ("update_preimage", 1, "Lamp"),
    ]
