"""A reserved character left unencoded in CDC_DATABASE_URL's password is named, never echoed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cdc.config.settings import load_settings
from cdc.errors import ConfigError

CDC = Path(sys.executable).with_name("cdc")


@pytest.mark.parametrize("password", ["Xy7@Qz9", "Xy7/Qz9", "Xy7%zQz9", "Xy7@Qz9/Wv5"])
def test_an_unencoded_password_is_refused_without_showing_it(password: str, tmp_path: Path) -> None:
    env = {name: value for name, value in os.environ.items() if not name.startswith("CDC_")}
    env.update(CDC_DATABASE_URL=f"postgresql://app:{password}@127.0.0.1:1/shop", CDC_DATA_DIR=str(tmp_path))
    result = subprocess.run([str(CDC), "setup"], env=env, capture_output=True, text=True, timeout=60)
    output = result.stdout + result.stderr
    for part in ("Xy7", "Qz9", "Wv5"):
        assert part not in output, f"part of the password is shown: {output}"
    assert result.returncode == 2, output
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: setting CDC_DATABASE_URL is invalid") and "percent-encode" in line


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://app:Xy7%40Qz9@db:5432/shop",
        "postgresql://app:p:w?#x@db/shop",  # libpq reads ':', '?' and '#' in a password as they are
        "postgresql://app@db/shop",
        "postgresql:///shop?host=/var/run/postgresql",
        "postgresql://db/shop?user=app&password=a@b",
    ],
)
def test_urls_libpq_reads_as_meant_pass(url: str) -> None:
    assert load_settings(database_url=url).database_url == url


def test_an_at_sign_in_the_user_name_is_refused_too() -> None:
    with pytest.raises(ConfigError, match="percent-encode"):
        load_settings(database_url="postgresql://app@corp:secret@db/shop")
