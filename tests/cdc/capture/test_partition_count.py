"""A changed CDC_PARTITIONS leaves existing topics as they are, says so, and their markers still reach every partition."""

from __future__ import annotations

import logging
from pathlib import Path

import orjson
import pytest

from cdc.run.coordinator import Capture
from tests.cdc.helpers import execute, read_topic, settings_for

pytestmark = pytest.mark.pg


def test_changed_partition_count_is_named_and_truncates_reach_every_partition(
    reference_db: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    execute(reference_db, "INSERT INTO categories (name) SELECT 'c' || g FROM generate_series(1, 20) g")
    Capture(settings_for(reference_db, tmp_path, partitions=3), once=True).run()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    execute(reference_db, "TRUNCATE categories CASCADE")
    with caplog.at_level(logging.WARNING, logger="cdc.capture"):
        Capture(settings_for(reference_db, tmp_path, partitions=2), once=True).run()
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert "cdc.public.categories (3 partitions)" in warning and "CDC_PARTITIONS=2" in warning
    markers = {
        r.partition
        for r in read_topic(tmp_path, "cdc.public.categories")
        if r.value is not None and orjson.loads(r.value)["op"] == "t"
    }
    assert markers == {0, 1, 2}, "a truncate must reach every partition of the topic"
