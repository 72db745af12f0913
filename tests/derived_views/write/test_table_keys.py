"""The driver-side key lookup of the append check, on real view tables written by Spark."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.derived_views.log_builder import LogBuilder, product

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from derived_views.write.context import ViewContext

pytestmark = pytest.mark.spark


def _deletion_vectors(path: str) -> int:
    """How many add actions in the table's log carry a deletion vector."""
    count = 0
    for commit in sorted(Path(path, "_delta_log").glob("*.json")):
        for line in commit.read_text().splitlines():
            add = json.loads(line).get("add")
            count += bool(add and add.get("deletionVector"))
    return count


@pytest.mark.parametrize("deletion_vectors", [False, True], ids=["new-tables", "tables-of-an-earlier-version"])
def test_keys_are_looked_up_without_spark_and_deleted_rows_are_not_seen(
    ctx: ViewContext, log: LogBuilder, deletion_vectors: bool
) -> None:
    """New view tables have no deletion vectors (deltalake reads them); tables an earlier version created
    with deletion vectors are still looked up right: a row a deletion vector marks is not seen."""
    from derived_views.runs import runner
    from derived_views.views import warehouse
    from derived_views.write.table_keys import holds_any

    with log.transaction() as tx:
        for pid in range(1, 11):
            tx.insert("public.products", product(pid))
    runner.step(ctx, ["warehouse"])
    current = warehouse.current_path(ctx, "public.products")
    history = warehouse.history_path(ctx, "public.products")
    if deletion_vectors:
        for path in (current, history):
            ctx.spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('delta.enableDeletionVectors' = true)")
    with log.transaction() as tx:
        tx.delete("public.products", {"id": 2})
        tx.update("public.products", product(3, "Renamed"))
    runner.step(ctx, ["warehouse"])
    assert (_deletion_vectors(current) > 0) is deletion_vectors

    assert holds_any(current, ['{"id":1}']) is True
    assert holds_any(current, ['{"id":2}']) is False  # deleted (with deletion vectors: its file still holds it)
    assert holds_any(current, ['{"id":99}', '{"id":3}']) is True
    assert holds_any(current, ['{"id":99}']) is False
    assert holds_any(current, []) is False
    assert holds_any(history, ['{"id":2}']) is True  # its versions stay in the history
    assert holds_any(history, ['{"id":2}'], current_only=True) is False
    assert holds_any(history, ['{"id":3}'], current_only=True) is True


def test_a_table_it_cannot_read_is_left_to_spark(tmp_path: Path) -> None:
    from derived_views.write.table_keys import holds_any

    assert holds_any(str(tmp_path / "not-a-table"), ['{"id":1}']) is None


def test_a_key_in_any_file_of_a_larger_table_is_found(spark: SparkSession, tmp_path: Path) -> None:
    """The key column is read batch by batch: a key in the last of several files is still found."""
    from pyspark.sql import functions as F

    from derived_views.write.table_keys import holds_any

    path = str(tmp_path / "keys")
    rows = spark.range(60_000).select(F.format_string('{"id":%d}', F.col("id")).alias("_cdc_key"))
    rows.repartitionByRange(4, "_cdc_key").write.format("delta").save(path)
    assert len(list(Path(path).glob("*.parquet"))) == 4
    last = max(r["_cdc_key"] for r in spark.read.format("delta").load(path).collect())
    assert holds_any(path, [last]) is True
    assert holds_any(path, ['{"id":-1}', '{"id":60000}']) is False
