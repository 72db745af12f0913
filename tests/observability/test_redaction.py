"""A password in the source URL never appears in any output: logs, errors, lag, help, job start lines."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

CDC = Path(sys.executable).with_name("cdc")
SECRET = "s3cret-Pa55"


def _with_password(url: str) -> str:
    """The test server trusts local connections, so any password is accepted and must be hidden."""
    return url.replace("postgres@", f"postgres:{SECRET}@", 1)


def _run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(CDC), *args], env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.spark
def test_no_output_shows_the_password(reference_db: str, tmp_path: Path) -> None:
    url = _with_password(reference_db)
    env = {**os.environ, "CDC_DATABASE_URL": url, "CDC_DATA_DIR": str(tmp_path / "data"), "CDC_LOG_FORMAT": "json"}
    runs = {
        "setup": _run(env, "setup"),
        "capture": _run(env, "capture", "--once"),
        "lag": _run(env, "lag"),
        "lag --json": _run(env, "lag", "--json"),
        "sync": _run(env, "sync", "warehouse", "--once"),
        "migrate": _run(env, "migrate"),
        "help": _run(env, "--help"),
        "capture --help": _run(env, "capture", "--help"),
        "lag --help": _run(env, "lag", "--help"),
        "sync --help": _run(env, "sync", "--help"),
    }
    bad_env = {**env, "CDC_DATABASE_URL": f"postgresql://app:{SECRET}@127.0.0.1:1/nowhere"}
    runs["lag unreachable"] = _run(bad_env, "lag")
    runs["setup unreachable"] = _run(bad_env, "setup")
    for name in ("setup", "capture", "lag", "lag --json", "sync", "migrate", "help"):
        assert runs[name].returncode == 0, f"{name}: {runs[name].stderr[-1500:]}"
    for name in ("lag unreachable", "setup unreachable"):
        assert runs[name].returncode != 0
        assert "CDC_DATABASE_URL" in runs[name].stderr, f"{name} should say what to fix: {runs[name].stderr}"
        assert "Traceback" not in runs[name].stderr, runs[name].stderr
    for name, result in runs.items():
        assert SECRET not in result.stdout + result.stderr, f"`cdc {name}` printed the password"
    assert "postgres:***@" in runs["sync"].stderr, "the view job's start line should name the source, redacted"
