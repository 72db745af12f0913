"""A view command started as a process prints only the project's own lines on stderr, not the JVM's."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from derived_views.engine.jvm_output import route

pytestmark = [pytest.mark.spark, pytest.mark.slow]

CDC = str(Path(__file__).resolve().parents[3] / ".venv" / "bin" / "cdc")


def test_sync_prints_no_jvm_or_log4j_lines(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CDC_")}
    env.update(CDC_DATA_DIR=str(data_dir))
    result = subprocess.run(
        [CDC, "sync", "--once"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        preexec_fn=lambda: os.umask(0o022),
    )
    lines = result.stderr.splitlines()
    # the run starts Spark, then finds no log: the project's log lines and its one error, nothing else
    assert any("logger=cdc.views" in line and "spark_app_id=" in line for line in lines), result.stderr
    # no log to size the work from: the driver keeps the JVM's default compilers (derived_views.engine.driver_jit)
    assert any("driver_jit=C1+C2" in line for line in lines), result.stderr
    assert [line for line in lines if not line.startswith("ts=")] == [
        f"error: no log at {data_dir / 'log'}: check CDC_DATA_DIR (the log lives in <data_dir>/log), "
        "or start capture once to create it"
    ], result.stderr
    assert (data_dir.stat().st_mode & 0o777) == 0o700


def test_jvm_lines_become_log_lines(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("DEBUG", logger="spark"):
        route("WARNING: Using incubator modules: jdk.incubator.vector\n")
        route("ERROR TaskSetManager: Task 0 in stage 1.0 failed 1 times; aborting job\n")
        route("some worker output\n")
    assert [(r.levelname, r.getMessage(), getattr(r, "fields", None)) for r in caplog.records] == [
        ("ERROR", "Task 0 in stage 1.0 failed 1 times; aborting job", {"source": "TaskSetManager"}),
        ("WARNING", "some worker output", None),
    ]
