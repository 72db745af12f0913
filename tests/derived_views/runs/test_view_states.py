"""``cdc lag`` and ``cdc wait`` judge a view by every table it has: one its first sync has not written yet,
or whose source table is being read, holds the view back, and a view whose tables are all current (also idle
ones) is as of the latest watermark."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.derived_views.pipeline import capture, context, execute, settings_for

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.pg, pytest.mark.spark]


def test_a_view_is_not_synced_until_every_table_of_it_is(
    spark: SparkSession, reference_db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from cdc.capture.lsn import Lsn
    from cdc.cli import cli, run
    from cdc.commands import register
    from derived_views.runs import runner
    from derived_views.source.as_of import LogAsOf
    from derived_views.views import warehouse

    execute(
        reference_db,
        "INSERT INTO categories (name) VALUES ('Lighting')",
        "INSERT INTO products (category_id, name, price) VALUES (1, 'Lamp', 10)",
    )
    settings = settings_for(reference_db, tmp_path)
    capture(settings)
    ctx = context(spark, settings)
    watermark = runner.latest(ctx)
    assert watermark is not None
    warehouse.sync(ctx, LogAsOf(ctx.log, watermark), only=["public.categories"])  # a first step under way

    register(cli)
    monkeypatch.setenv("CDC_DATABASE_URL", reference_db)
    monkeypatch.setenv("CDC_DATA_DIR", str(tmp_path))
    wait = ["wait", "warehouse", "--lsn", str(Lsn(watermark.lsn)), "--timeout", "0"]

    def lag() -> dict[str, object]:
        capsys.readouterr()
        run(cli, ["lag", "--json"])
        (view,) = [v for v in json.loads(capsys.readouterr().out)["views"] if v["view"] == "warehouse"]
        return dict(view)

    assert run(cli, wait) == 4
    assert "it is as of nothing yet" in capsys.readouterr().err
    behind = lag()
    assert behind["as_of_lsn"] is None and int(str(behind["events_pending"])) > 0, behind

    runner.step(ctx, ["warehouse"])
    assert run(cli, wait) == 0
    synced = lag()
    assert synced["as_of_lsn"] == str(Lsn(watermark.lsn)) and synced["events_pending"] == 0, synced

    # a read of products under way (its progress record, as capture writes one with each chunk): the
    # table's rows are in the log only in part, so the view is not as of anything until the read ends
    from log_store import LogStore, ProducerRecord

    key = b'["read","public.products"]'
    with LogStore.open(tmp_path / "log", writer=True) as log:
        log.append_group(
            [ProducerRecord("cdc.__snapshots", key, b'{"topic":"cdc.public.products","rows":1}', 0)], watermark.position
        )
    capsys.readouterr()
    assert run(cli, wait) == 4
    assert "cdc.public.products being read" in capsys.readouterr().err
    with LogStore.open(tmp_path / "log", writer=True) as log:
        log.append_group([ProducerRecord("cdc.__snapshots", key, None, 0)], watermark.position)
    assert run(cli, wait) == 0
