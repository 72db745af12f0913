"""Fixtures of the view tests: a hand-built log and a view context over a temporary data directory."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.derived_views.log_builder import LogBuilder

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from derived_views.write.context import ViewContext


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    path = tmp_path / "data"
    path.mkdir()
    return path


@pytest.fixture
def log(data_dir: Path) -> Iterator[LogBuilder]:
    builder = LogBuilder(data_dir / "log")
    yield builder
    builder.close()


#: The reference schema's views (a search index over products, a cache of orders with their items).
EXAMPLE_VIEWS = Path(__file__).resolve().parents[2] / "views.example.toml"


@pytest.fixture
def ctx(spark: SparkSession, data_dir: Path) -> ViewContext:
    """A view context over ``data_dir`` with the reference schema's views (``views.example.toml``)."""
    from derived_views.definitions import load
    from derived_views.source.log_location import LogLocation
    from derived_views.write.context import ViewContext

    return ViewContext(spark, str(data_dir), LogLocation.of(data_dir / "log"), "cdc", definitions=load(EXAMPLE_VIEWS))
