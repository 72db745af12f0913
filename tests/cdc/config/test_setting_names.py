"""A misspelled ``CDC_*`` variable or ``.env`` entry is named once on stderr, with the setting it resembles."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cdc.config.settings import load_settings
from log_store import LogStore

CDC = Path(sys.executable).with_name("cdc")


def test_a_misspelled_variable_is_named_once_with_the_closest_setting(tmp_path: Path) -> None:
    with LogStore.open(tmp_path / "log", writer=True):
        pass
    env = {name: value for name, value in os.environ.items() if not name.startswith("CDC_")}
    env.update(
        CDC_DATA_DIR=str(tmp_path),
        CDC_PARTITON="6",
        CDC_SPARK_MASTER="local[1]",
        CDC_PG_BINDIR="/nowhere",
        CDC_SPARK_JARS_DIR="/nowhere",
        CDC_TEST_DATABASE_URL="postgresql:///x",
    )
    result = subprocess.run([str(CDC), "log", "topics"], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip().splitlines() == [
        "warning: CDC_PARTITON is not a setting and is ignored; did you mean CDC_PARTITIONS?"
    ]


def test_a_misspelled_dotenv_entry_is_named_once(capsys: pytest.CaptureFixture[str]) -> None:
    Path(".env").write_text("CDC_SLOT=from_dotenv\nCDC_TOPIC_PREFX=shop\n")
    assert load_settings().slot == "from_dotenv"
    assert load_settings().topic_prefix == "cdc"
    assert capsys.readouterr().err.splitlines() == [
        "warning: CDC_TOPIC_PREFX (in .env) is not a setting and is ignored; did you mean CDC_TOPIC_PREFIX?"
    ]


def test_known_names_give_no_warning(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    for name, value in {
        "CDC_PARTITIONS": "2",
        "CDC_LOG_FORMAT": "json",
        "CDC_SPARK_MASTER": "local[1]",
        "CDC_RETENTION_BYTES": "-1",
    }.items():
        monkeypatch.setenv(name, value)
    load_settings()
    assert capsys.readouterr().err == ""
