"""Settings pointing at a per-test data directory, with nothing read from the developer's ``.env``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _isolated_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """Clear every ``CDC_*`` variable the caller set and run from a directory without a ``.env``."""
    import os

    for name in list(os.environ):
        if name.startswith("CDC_") and name not in (
            "CDC_TEST_DATABASE_URL",
            "CDC_PG_BINDIR",
            "CDC_PG_BUILDS_DIR",
            "CDC_TEST_PG_VERSION",
            "CDC_SPARK_JARS_DIR",
            "CDC_KAFKA_JARS_DIR",
            "CDC_TEST_KAFKA",
        ):
            monkeypatch.delenv(name)
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    yield
