"""When a step's work is evaluated interpreted (pure: offsets and file sizes, no Spark)."""

from __future__ import annotations

from pathlib import Path

from derived_views.engine.evaluation import SMALL_TABLE_BYTES, small_tables
from derived_views.engine.progress import Progress
from derived_views.source.as_of import pending_events
from derived_views.source.watermark import LogWatermark


def test_pending_events_count_each_partition_from_the_tables_progress() -> None:
    watermark = LogWatermark("0/10", 0, {"a": {"0": 10, "1": 5}, "b": {"0": 7}})
    assert pending_events(watermark, ["a"], None) == 15
    assert pending_events(watermark, ["a", "b"], Progress({"a": {"0": 8, "1": 5}})) == 2 + 0 + 7


def test_small_tables_count_data_files_on_disk_and_stop_at_the_limit(tmp_path: Path) -> None:
    table = tmp_path / "t"
    (table / "_delta_log").mkdir(parents=True)
    (table / "_delta_log" / "00000000000000000000.json").write_bytes(b"x" * (SMALL_TABLE_BYTES + 1))
    (table / "part-0.parquet").write_bytes(b"x" * (SMALL_TABLE_BYTES // 2))
    assert small_tables([str(table)])  # the log does not count
    (tmp_path / "u").mkdir()
    (tmp_path / "u" / "part-0.parquet").write_bytes(b"x" * (SMALL_TABLE_BYTES // 2 + 1))
    assert not small_tables([str(table), str(tmp_path / "u")])  # together past the limit
    assert not small_tables(["s3://bucket/views/t"])  # not on local disk: never assumed small
