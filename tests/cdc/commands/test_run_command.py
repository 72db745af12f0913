"""A user error raised inside a Spark task reaches the user as one line, like any other."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click
import pytest

from cdc.commands.run_command import remote_user_error, run
from tests.derived_views.log_builder import LogBuilder
from tests.log_store.helpers import segment_files

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.spark


def test_corrupt_segment_read_by_a_spark_task_is_one_error_line(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from derived_views.source.log_source import register

    log = LogBuilder(tmp_path / "log", partitions=1)
    with log.transaction() as tx:
        for i in range(1, 50):
            tx.insert("public.categories", {"id": i, "name": f"category number {i}"})
    log.close()
    (segment,) = segment_files(tmp_path / "log", "cdc.public.categories", 0)
    data = bytearray(segment.read_bytes())
    at = data.index(b"category number 25")
    data[at] ^= 0xFF
    segment.write_bytes(bytes(data))

    register(spark)
    frame = spark.read.format("cdclog").option("path", str(tmp_path / "log")).option("topics", "cdc.public.categories").load()

    @click.command()
    def read() -> None:
        frame.collect()

    assert run(read, []) == 4  # CorruptionError's exit code, as when the driver reads the segment itself
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: ") and str(segment) in lines[0] and "Traceback" not in lines[0]
    assert remote_user_error(ValueError("log_store.errors.CorruptSegmentError: x")) is None  # only Spark's
