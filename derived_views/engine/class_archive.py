"""A class-data-sharing archive for the Spark driver JVM, so that every ``cdc`` command's driver starts sooner.

A driver JVM spends most of its first seconds loading, parsing and verifying the same classes each run
(Spark SQL, Delta, Hadoop, Parquet: some 20,000 of them). Java's application class-data sharing keeps
those classes, already parsed and verified, in an archive file that a JVM maps at start instead. Set-up
makes the archive once (``python -m derived_views.engine.archive_build``): it starts a driver with
``-XX:ArchiveClassesAtExit``, runs a small Delta workload (create, append, ``MERGE``, read, Arrow
collect), and stops it; the JVM writes what it loaded as it exits. Every driver this project starts
afterwards (:func:`derived_views.engine.jvm_output.launch_driver`, ``cdc spark-server``) maps it with
``-XX:SharedArchiveFile``.

Measured on 2 cores: a session's start went from 4.3 s to 2.8 s, and start plus a first Delta write and
``MERGE`` from about 14 s to 11 s.

Safety: the archive only ever changes how fast classes load, never which classes load. The JVM checks the
archive against its own build and class path and ignores one that does not match (a Java or jar
upgrade); ``-Xlog:cds=off,cds+dynamic=off`` keeps that check silent, so a stale archive costs the
speed-up and nothing else. The file's name is keyed by the Java binary, the pyspark version and the jar
set (:func:`archive_path`), so a changed installation looks for, and set-up makes, a new one. The archive
is written under a temporary name and renamed into place, so a driver never maps a half-written one.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from derived_views.engine.engine_settings import engine_settings
from derived_views.engine.spark_jars import installed_jars, jars_dir

#: JVM options that silence the JVM's report of an archive it cannot use (it then runs without it).
QUIET_CDS = "-Xlog:cds=off,cds+dynamic=off"


def java_binary() -> Path | None:
    """The ``java`` the Spark launcher runs: ``$JAVA_HOME/bin/java``, else the one on ``PATH``."""
    java_home = os.environ.get("JAVA_HOME")
    found = str(Path(java_home) / "bin" / "java") if java_home else shutil.which("java")
    return Path(os.path.realpath(found)) if found and os.path.exists(found) else None


def archive_path() -> Path | None:
    """Where the archive of this installation lives (it may not exist yet); ``None`` without Java."""
    import pyspark

    java = java_binary()
    if java is None:
        return None
    libjvm = next(iter(sorted(java.parent.parent.glob("lib/server/libjvm.so"))), java)
    stat = libjvm.stat()
    identity = "\n".join(
        [str(java), str(stat.st_size), str(int(stat.st_mtime)), pyspark.__version__, *(jar.name for jar in installed_jars())]
    )
    key = hashlib.sha256(identity.encode()).hexdigest()[:16]
    return jars_dir() / f"driver-classes-{key}.jsa"


def java_options() -> str:
    """Driver JVM options that map this installation's archive; empty when there is none."""
    if not engine_settings().class_archive:
        return ""
    path = archive_path()
    if path is None or not path.is_file():
        return ""
    return f"-XX:SharedArchiveFile={path} {QUIET_CDS}"
