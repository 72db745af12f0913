"""Masked columns end to end: PostgreSQL -> capture -> log -> warehouse, a search index and a cache entity
-> verify. The views hold the masked values (as text), no Delta file holds a clear one, a rebuild by
replay gives the same tables, and verify masks the source the same way, so it passes, and fails when a
clear value reaches a view. A mask added later reaches the current rows at once and, with
``cdc views purge``, every file of every view table."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.cdc.capture.test_column_masks import (
    KEY,
    TABLES,
    VIEWS,
    _clear_values,
    _insert_customer,
    _masked,
    _setup,
    _tables,
    hashed,
)
from tests.cdc.capture.test_publication_rules import files_holding, secret
from tests.derived_views.pipeline import (
    capture,
    context,
    execute,
    in_process,
    rows,
    settings_for,
    sync,
    verify_views,
    view_files_holding,
)
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


def test_the_warehouse_holds_masked_values_and_verify_compares_them(
    spark: SparkSession, pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from deltalake import DeltaTable

    from derived_views.runs import runner
    from derived_views.runs.verify import verify
    from derived_views.views import warehouse

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
    held_rows = {row["id"]: row for row in DeltaTable(current).to_pyarrow_table().to_pylist()}
    assert {n: {k: v for k, v in row.items() if not k.startswith("_cdc")} for n, row in held_rows.items()} == _masked(pg_url)
    assert verify_views(ctx, pg_url, ALL_VIEWS, mask_key=KEY.encode()) == 4 + 2 + 4 + 4

    sync(ctx, ALL_VIEWS, replace=True)
    assert verify_views(ctx, pg_url, ALL_VIEWS, mask_key=KEY.encode()) == 4 + 2 + 4 + 4
    clear = [*_clear_values(pg_url), secret("email", 1), secret("email", 3), secret("phone", 3), secret("name", 3)]
    assert files_holding(tmp_path, clear) == {}
    decoded = _decoded_values(tmp_path)
    assert [value for value in clear if value in decoded] == []

    # a mask added to bio while the table is captured: capture reads the table again masked, and the
    # earlier versions of every view table over it (the history's older versions too) keep the clear bios
    # until `cdc views purge`, after which no file of any view holds a trace of one
    execute(pg_url, *[f"UPDATE customers SET bio = '{secret('bio', n)}' WHERE id = {n}" for n in (1, 2, 4, 5)])
    capture(settings)
    sync(ctx, ALL_VIEWS)
    views.write_text(VIEWS_WITH_DOCUMENTS.replace('born = "hash" }', 'born = "hash", bio = "hash" }'))
    _setup(pg_url, tmp_path, views)
    capture(settings)
    sync(ctx, ALL_VIEWS)
    bios = [secret("bio", n) for n in (1, 2, 4, 5)]
    held = view_files_holding(tmp_path, bios)
    assert {path.split("/")[0] for path in held} == {"warehouse", "search", "cache"}, held
    status, out, err = in_process(monkeypatch, capsys, settings, "views", "purge", "public.customers", "--yes-drop-history")
    assert status == 0, err
    assert view_files_holding(tmp_path, bios) == {}, out
    history = warehouse.history_path(ctx, "public.customers")
    assert {row["bio"] for row in rows(spark, history, "_cdc_is_current")} == {hashed(bio) for bio in bios}
    assert {row["bio"] for row in rows(spark, history, "NOT _cdc_is_current")} == {None}  # written before the mask
    assert verify_views(ctx, pg_url, ALL_VIEWS, mask_key=KEY.encode()) == 4 + 2 + 4 + 4

    # a clear value in the view is a difference: verify compares with the source masked
    watermark = runner.latest(ctx)
    assert watermark is not None
    spark.sql(f"UPDATE delta.`{current}` SET email = '{secret('email', 2)}' WHERE id = 2")
    report = verify(ctx, "warehouse", pg_url, watermark, mask_key=KEY.encode())
    assert len(report.differences) == 1 and "email" in report.differences[0], report.differences
