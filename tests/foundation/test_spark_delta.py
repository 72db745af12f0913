"""A local SparkSession writes, MERGEs and reads back a Delta table with the jars fetched at set-up."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.spark


def test_write_merge_read_delta(spark: SparkSession, tmp_path: Path) -> None:
    from delta.tables import DeltaTable

    path = str(tmp_path / "people")
    spark.createDataFrame([(1, "ada"), (2, "bob")], "id INT, name STRING").write.format("delta").save(path)
    changes = spark.createDataFrame([(2, "bea"), (3, "cy")], "id INT, name STRING")
    (
        DeltaTable.forPath(spark, path)
        .alias("t")
        .merge(changes.alias("s"), "t.id = s.id")
        .whenMatchedUpdateAll()
        .whenNotMatchedInsertAll()
        .execute()
    )
    rows = sorted((r.id, r.name) for r in spark.read.format("delta").load(path).collect())
    assert rows == [(1, "ada"), (2, "bea"), (3, "cy")]
    history = DeltaTable.forPath(spark, path).history().select("operation").collect()
    assert [h.operation for h in history] == ["MERGE", "WRITE"]


def test_session_uses_local_jars_not_the_network(spark: SparkSession) -> None:
    from derived_views.engine.spark_jars import installed_jars

    jars = spark.sparkContext.getConf().get("spark.jars") or ""
    assert any("delta-spark" in jar for jar in jars.split(","))
    assert spark.sparkContext.getConf().get("spark.jars.packages") is None
    assert installed_jars()
