"""The driver JVM's class archive: set-up makes it, every driver maps it, and one that does not fit is
ignored without a word."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from derived_views.engine.class_archive import QUIET_CDS, archive_path, java_binary, java_options

pytestmark = pytest.mark.spark


def test_an_archive_the_jvm_cannot_use_is_ignored_silently(tmp_path: Path) -> None:
    java = java_binary()
    assert java is not None
    broken = tmp_path / "driver-classes.jsa"
    broken.write_bytes(b"not an archive" * 1000)  # what a Java upgrade or a torn copy leaves behind
    ran = subprocess.run(
        [str(java), f"-XX:SharedArchiveFile={broken}", *QUIET_CDS.split(), "-version"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr
    assert [line for line in ran.stderr.splitlines() if "cds" in line.lower() or "archive" in line.lower()] == [], ran.stderr


def test_a_driver_loads_spark_and_delta_classes_from_the_archive_set_up_made(tmp_path: Path) -> None:
    path = archive_path()
    assert path is not None and path.is_file(), f"set-up made no class archive at {path}"
    assert f"-XX:SharedArchiveFile={path}" in java_options()
    loaded = tmp_path / "classes.log"
    start = (
        "from derived_views.engine.spark_session import build_spark; import sys; "
        "spark = build_spark('cdc-archive-check', master='local[1]', conf={'spark.driver.extraJavaOptions': "
        f"'-Xlog:class+load=info:file={loaded}'}}); "
        "spark.range(3).write.format('delta').save(sys.argv[1]); spark.stop()"
    )
    ran = subprocess.run(
        [sys.executable, "-c", start, str(tmp_path / "table")], capture_output=True, text=True, check=False, timeout=300
    )
    assert ran.returncode == 0, ran.stderr
    lines = loaded.read_text().splitlines()
    shared = [line for line in lines if "source: shared objects file (top)" in line]
    assert any(" org.apache.spark.SparkContext " in line for line in shared), lines[:20]
    assert any(" org.apache.spark.sql.delta.DeltaLog " in line for line in shared), lines[:20]
    assert len(shared) > len(lines) // 2, f"{len(shared)} of {len(lines)} classes from the archive"
