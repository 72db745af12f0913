"""One local SparkSession with Delta Lake for the whole test session.

The Delta jars must already be on disk (set-up fetches them): a test run never reaches the network.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """Local Delta-enabled session; fails clearly when set-up has not fetched the Delta jars."""
    from derived_views.engine.spark_jars import installed_jars, jars_dir
    from derived_views.engine.spark_session import build_spark

    if not installed_jars():
        pytest.fail(f"no Delta jars in {jars_dir()}: run the set-up (scripts/test) first")
    session = build_spark("cdc-tests", master="local[2]")
    yield session
    session.stop()
