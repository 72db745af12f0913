"""Masked columns end to end: PostgreSQL -> capture -> log -> warehouse, a search index and a cache entity
-> verify. The views hold the masked values (as text), no Delta file holds a clear one, a rebuild by
replay gives the same tables, and verify masks the source the same way, so it passes, and fails when a
clear value reaches a view."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.cdc.test_column_masks import KEY, TABLES, VIEWS, _clear_values, _insert_customer, _masked, _setup, _tables
from tests.cdc.test_publication_rules import files_holding, secret
from tests.derived_views.pipeline import capture, context, execute, settings_for, sync, verify_views
from tests.derived_views.test_publication_rules_end_to_end import _decoded_values

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.pg, pytest.mark.spark, pytest.mark.slow]

#: The masks, and a search index and a cache entity over the masked table
VIEWS_WITH_DOCUMENTS = (
    VIEWS
    + """
[search.customers]
root = "public.customers"
text = ["name", "bio"]
stored = ["email", "phone"]

[cache.customer]
root = "public.customers"
"""
)
ALL_VIEWS = ["warehouse", "search.customers", "cache.customer"]


def test_the_warehouse_holds_masked_values_and_verify_compares_them(spark: SparkSession, pg_url: str, tmp_path: Path) -> None:
    from deltalake import DeltaTable

    from derived_views.views import runner, warehouse
    from derived_views.views.verify import verify

    _tables(pg_url)
    views = tmp_path / "views.toml"
    views.write_text(VIEWS_WITH_DOCUMENTS)
    _setup(pg_url, tmp_path, views)
    settings = settings_for(pg_url, tmp_path, views_file=str(views), tables=TABLES.split(","), mask_key=KEY)
    ctx = context(spark, settings)
    capture(settings)
    _insert_customer(pg_url, 5, born="1999-12-31")
    execute(pg_url, f"UPDATE customers SET email = '{secret('email', 105)}' WHERE id = 1", "DELETE FROM customers WHERE id = 3")
    capture(settings)
    sync(ctx, ALL_VIEWS)
    current = warehouse.current_path(ctx, "public.customers")
    rows = {row["id"]: row for row in DeltaTable(current).to_pyarrow_table().to_pylist()}
    assert {n: {k: v for k, v in row.items() if not k.startswith("_cdc")} for n, row in rows.items()} == _masked(pg_url)
    assert verify_views(ctx, pg_url, ALL_VIEWS, mask_key=KEY.encode()) == 4 + 2 + 4 + 4

    sync(ctx, ALL_VIEWS, replace=True)
    assert verify_views(ctx, pg_url, ALL_VIEWS, mask_key=KEY.encode()) == 4 + 2 + 4 + 4
    clear = [*_clear_values(pg_url), secret("email", 1), secret("email", 3), secret("phone", 3), secret("name", 3)]
    assert files_holding(tmp_path, clear) == {}
    decoded = _decoded_values(tmp_path)
    assert [value for value in clear if value in decoded] == []

    # a clear value in the view is a difference: verify compares with the source masked
    watermark = runner.latest(ctx)
    assert watermark is not None
    spark.sql(f"UPDATE delta.`{current}` SET email = '{secret('email', 2)}' WHERE id = 2")
    report = verify(ctx, "warehouse", pg_url, watermark, mask_key=KEY.encode())
    assert len(report.differences) == 1 and "email" in report.differences[0], report.differences
