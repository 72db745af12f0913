"""The example Spark Declarative Pipeline (``examples/declarative_pipeline``) run by the real
``spark-pipelines`` CLI on ``cdc spark-server``, over a log captured from PostgreSQL: its ``products``
table equals the warehouse's current table of the same log, run after run."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from derived_views.engine.driver_jit import C1_ONLY
from tests.derived_views.pipeline import capture, context, execute, rows, settings_for, sync, verify_views
from tests.spark_server_process import running_spark_server

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.spark, pytest.mark.pg, pytest.mark.slow]

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "declarative_pipeline"
SPARK_PIPELINES = Path(sys.executable).with_name("spark-pipelines")
BIG = "(SELECT string_agg(md5(g::text || 'x'), '') FROM generate_series(1, 3200) g)"  # ~100 kB, stored out of line


@contextmanager
def _spark_server(workdir: Path, tables: Path) -> Iterator[str]:
    """``cdc spark-server`` on a free port, its tables under ``tables``, stopped (SIGTERM) afterwards.

    Its Python workers run this interpreter with this environment (``PYTHONPATH`` included), so they
    import the ``cdclog`` source from the code under test."""
    with running_spark_server(
        workdir,
        f"spark.sql.warehouse.dir={tables}",
        "spark.driver.extraJavaOptions=" + " ".join(C1_ONLY),
        env=dict(os.environ),
    ) as url:
        yield url


def _example_pipeline(workdir: Path, log_dir: Path) -> Path:
    """The example copied to ``workdir`` as shipped, its spec pointed at this test's log and storage."""
    copy = workdir / "pipeline"
    shutil.copytree(EXAMPLE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    spec_path = copy / "spark-pipeline.yml"
    spec = yaml.safe_load(spec_path.read_text())
    spec["storage"] = (workdir / "storage").as_uri()
    spec["configuration"]["cdc.log"] = str(log_dir)
    spec_path.write_text(yaml.safe_dump(spec))
    return spec_path


def _run_pipeline(url: str, spec: Path) -> None:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    result = subprocess.run(
        [str(SPARK_PIPELINES), "--remote", url, "run", "--spec", str(spec)],
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-5000:]


def _by_id(table: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    return {row["id"]: {k: v for k, v in row.items() if not k.startswith("_cdc_")} for row in table}


def test_the_example_pipeline_keeps_the_warehouse_current_table_run_after_run(
    spark: SparkSession, reference_db: str, tmp_path: Path
) -> None:
    from derived_views.source.log_source import read_watermark
    from derived_views.views import warehouse

    execute(
        reference_db,
        "INSERT INTO categories (name) VALUES ('Lighting'), ('Garden')",
        "INSERT INTO products (category_id, name, description, price, attributes, tags) "
        "SELECT 1 + g % 2, 'Product ' || g, 'about ' || g, 10 + g * 0.25, jsonb_build_object('n', g), "
        "ARRAY['t' || g, 'all'] FROM generate_series(1, 12) g",
        f"UPDATE products SET description = {BIG} WHERE id = 1",
    )
    data_dir = tmp_path / "data"
    settings = settings_for(reference_db, data_dir)
    ctx = context(spark, settings)
    topic = "cdc.public.products"
    tables = tmp_path / "tables"
    spec = _example_pipeline(tmp_path, data_dir / "log")

    def caught_up() -> dict[int, dict[str, Any]]:
        """Capture, sync the warehouse (verified against the source), run the pipeline; compare."""
        capture(settings)
        sync(ctx, ["warehouse"])
        assert verify_views(ctx, reference_db, ["warehouse"]) > 0
        _run_pipeline(url, spec)
        expected = _by_id(rows(spark, warehouse.current_path(ctx, "public.products")))
        got = _by_id(rows(spark, str(tables / "products")))
        assert expected and got == expected
        # the change feed holds every record of the topic up to the watermark exactly once
        watermark = read_watermark(str(data_dir / "log"), [topic])
        assert watermark is not None
        fed = [(r["partition"], r["offset"]) for r in rows(spark, str(tables / "product_changes"))]
        assert sorted(fed) == [(int(p), o) for p, end in sorted(watermark.offsets[topic].items()) for o in range(end)]
        return got

    with _spark_server(tmp_path, tables) as url:
        first = caught_up()
        assert len(first) == 12 and len(first[1]["description"]) > 100_000
        execute(
            reference_db,
            "UPDATE products SET price = 99.95, tags = ARRAY['sale'] WHERE id = 1",  # description left unchanged (TOAST)
            "UPDATE products SET name = 'Renamed', attributes = '{\"a\": [1, 2.5]}' WHERE id = 2",
            "DELETE FROM products WHERE id IN (3, 4)",
            "INSERT INTO products (category_id, name, price) VALUES (2, 'New', 1.05)",
        )
        second = caught_up()
        assert len(second[1]["description"]) > 100_000 and str(second[1]["price"]) == "99.95"
        assert 3 not in second and second[2]["name"] == "Renamed" and len(second) == 11
        execute(
            reference_db,
            "TRUNCATE products CASCADE",
            "INSERT INTO products (category_id, name, price) VALUES (1, 'After truncate', 2.50)",
        )
        third = caught_up()
        assert [row["name"] for row in third.values()] == ["After truncate"]
