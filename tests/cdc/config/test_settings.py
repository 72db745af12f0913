"""Settings: read from the environment and .env, and a bad value gives one clear line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cdc.config.settings import load_settings
from cdc.errors import ConfigError

CDC = Path(sys.executable).with_name("cdc")


def test_defaults_and_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CDC_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("CDC_TABLES", "public.orders, public.order_items")
    monkeypatch.setenv("CDC_PARTITIONS", "6")
    settings = load_settings()
    assert settings.data_dir == tmp_path
    assert settings.tables == ["public.orders", "public.order_items"]
    assert settings.partitions == 6
    assert settings.log_dir == tmp_path / "log"
    assert settings.topic_for("public", "orders") == "cdc.public.orders"


def test_empty_table_list_means_whole_publication(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CDC_TABLES", "")
    assert load_settings().tables == []


def test_dotenv_file_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    Path(".env").write_text("CDC_SLOT=from_dotenv\nCDC_TOPIC_PREFIX=shop\n")
    settings = load_settings()
    assert settings.slot == "from_dotenv"
    assert settings.topic_prefix == "shop"
    monkeypatch.setenv("CDC_SLOT", "from_env")
    assert load_settings().slot == "from_env"


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("CDC_PARTITIONS", "many", "CDC_PARTITIONS"),
        ("CDC_PARTITIONS", "0", "from 1 to 1024"),
        ("CDC_SLOT", "Bad-Slot", "replication slot name"),
        ("CDC_TABLES", "orders", "'orders' is not schema.table"),
        ("CDC_DATABASE_URL", "mysql://x", "postgresql://"),
        ("CDC_TOPIC_PREFIX", "a b", "topic"),
    ],
)
def test_bad_value_names_the_setting(monkeypatch: pytest.MonkeyPatch, name: str, value: str, expected: str) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as info:
        load_settings()
    message = str(info.value)
    assert name in message
    assert expected in message
    assert "\n" not in message


def test_cli_prints_one_line_and_exits_non_zero(tmp_path: Path) -> None:
    env = {**os.environ, "CDC_PARTITIONS": "lots", "CDC_DATA_DIR": str(tmp_path)}
    result = subprocess.run([str(CDC), "migrate"], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: setting CDC_PARTITIONS is invalid")
    assert "Traceback" not in result.stderr


def test_password_is_redacted_in_errors(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "CDC_DATABASE_URL": "postgresql://app:s3cret@127.0.0.1:1/nowhere",
        "CDC_DATA_DIR": str(tmp_path),
    }
    result = subprocess.run([str(CDC), "migrate"], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "s3cret" not in result.stderr + result.stdout
