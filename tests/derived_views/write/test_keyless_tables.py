"""A keyless source table (no primary key, ``REPLICA IDENTITY FULL``) in the warehouse: its current table
is append-only and its history keeps the same rows as versions, and every step that applies events to a
table records its position, also when they change nothing in it. A batch without a truncate is appended
to both tables (no MERGE, which would scan them)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.derived_views.pipeline import capture, context, execute, rows, settings_for, sync

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.pg, pytest.mark.spark]


def test_a_keyless_tables_history_keeps_its_rows_and_moves_with_every_step(
    spark: SparkSession, reference_db: str, tmp_path: Path
) -> None:
    from deltalake import DeltaTable

    from derived_views.engine.commit_progress import committed_progress
    from derived_views.views import warehouse

    execute(
        reference_db,
        "CREATE TABLE ledger (tid int, delta int)",
        "ALTER TABLE ledger REPLICA IDENTITY FULL",
        "ALTER PUBLICATION cdc_publication ADD TABLE ledger",
        "INSERT INTO ledger VALUES (1, 10), (2, 20)",
    )
    settings = settings_for(reference_db, tmp_path)
    ctx = context(spark, settings)
    current = warehouse.current_path(ctx, "public.ledger")
    history = warehouse.history_path(ctx, "public.ledger")
    rounds = (  # statements, and how the step writes both tables (None: not checked)
        ((), None),  # the snapshot
        (("INSERT INTO ledger VALUES (3, 30)", "UPDATE ledger SET delta = 11 WHERE tid = 1"), "WRITE"),  # appended
        (("UPDATE ledger SET delta = 21 WHERE tid = 2", "TRUNCATE ledger", "INSERT INTO ledger VALUES (5, 50)"), "MERGE"),
        (("DELETE FROM ledger WHERE tid = 5",), "WRITE"),  # changes neither table (a keyless delete is not applied)
    )
    for statements, operation in rounds:
        execute(reference_db, *statements)
        capture(settings)
        report = sync(ctx, ["warehouse"])
        assert report.watermark is not None
        held = Counter((r["tid"], r["delta"]) for r in rows(spark, current))
        versions = Counter((r["tid"], r["delta"]) for r in rows(spark, history, "_cdc_is_current"))
        assert versions == held and held, (statements, versions, held)
        for path in (current, history):
            progress = committed_progress(path)
            assert progress is not None and progress.position == report.watermark.position, path
            assert operation is None or DeltaTable(path).history(1)[0]["operation"] == operation, (statements, path)
    # every version the history kept: the rows inserted, the updated one added, all closed by the truncate
    closed = Counter((r["tid"], r["delta"]) for r in rows(spark, history, "NOT _cdc_is_current"))
    assert closed == Counter({(1, 10): 1, (2, 20): 1, (3, 30): 1, (1, 11): 1, (2, 21): 1})
