"""The views' engine settings: read from ``CDC_*`` variables, typed, with the defaults the engine had."""

from __future__ import annotations

from pathlib import Path

import pytest

from derived_views.engine.class_archive import java_options
from derived_views.engine.engine_settings import engine_settings
from derived_views.engine.spark_jars import jars_dir
from derived_views.engine.spark_session import remote_url


def test_defaults_without_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("CDC_SPARK_MASTER", "CDC_SPARK_REMOTE", "CDC_SPARK_JARS_DIR", "CDC_CLASS_ARCHIVE"):
        monkeypatch.delenv(name, raising=False)
    settings = engine_settings()
    assert (settings.spark_master, settings.spark_remote, settings.spark_jars_dir, settings.class_archive) == (
        "local[2]",
        None,
        None,
        True,
    )


def test_values_reach_the_engine(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CDC_SPARK_REMOTE", "  sc://warm:15002 ")
    monkeypatch.setenv("CDC_SPARK_JARS_DIR", str(tmp_path))
    assert remote_url() == "sc://warm:15002"
    assert jars_dir() == tmp_path
    monkeypatch.setenv("CDC_SPARK_REMOTE", " ")
    assert remote_url() is None


@pytest.mark.parametrize("value", ["off", "OFF", " 0", "false", "no"])
def test_class_archive_off(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("CDC_CLASS_ARCHIVE", value)
    assert engine_settings().class_archive is False
    assert java_options() == ""


@pytest.mark.parametrize("value", ["on", "1", "yes", "anything"])
def test_class_archive_on(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("CDC_CLASS_ARCHIVE", value)
    assert engine_settings().class_archive is True
