"""A real Spark standalone cluster for tests: one master and two workers, local processes on loopback ports.

They are started from the pinned pyspark's own launcher (``spark-class``, the classes
``org.apache.spark.deploy.master.Master`` and ``org.apache.spark.deploy.worker.Worker``), one core and a
little memory each, so that a job submitted to ``spark://127.0.0.1:PORT`` runs its tasks in executors
of the workers, never in the driver. The executors run this installation's Python (the project and its
dependencies installed), as a cluster's nodes run an environment with ``pg-cdc`` installed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from local_servers.postgres import free_port

VENV_BIN = Path(sys.executable).parent
WORKERS = 2


@dataclass(frozen=True)
class SparkCluster:
    """A running standalone cluster: its master URL, the master's web UI (JSON status) and a scratch folder."""

    master: str
    ui: str
    root: Path

    def status(self) -> dict[str, Any]:
        """The master's status document (workers, applications, completed applications)."""
        with urllib.request.urlopen(f"{self.ui}/json/", timeout=5) as response:
            document: dict[str, Any] = json.load(response)
        return document


def _spark_class() -> str:
    launcher = shutil.which("spark-class", path=str(VENV_BIN))
    if launcher is None:
        pytest.fail(f"no spark-class beside {sys.executable}: pyspark is not installed in this environment")
    return launcher


def spark_home() -> str:
    """The pinned pyspark's own Spark distribution (its ``bin/``, ``jars/`` and ``sbin/``)."""
    import pyspark

    return str(Path(pyspark.__file__).parent)


def _start(command: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "SPARK_HOME": spark_home(), "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    return subprocess.Popen(command, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)


@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    """A master and two one-core workers, up and registered, for the tests of one module."""
    root = tmp_path_factory.mktemp("spark-cluster")
    launcher = _spark_class()
    port, ui_port = free_port(), free_port()
    cluster = SparkCluster(f"spark://127.0.0.1:{port}", f"http://127.0.0.1:{ui_port}", root)
    processes = [
        _start(
            [
                launcher,
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--webui-port",
                str(ui_port),
            ],
            root / "master.log",
        )
    ]
    for number in range(WORKERS):
        work = root / f"worker-{number}"
        work.mkdir()
        processes.append(
            _start(
                [
                    launcher,
                    "org.apache.spark.deploy.worker.Worker",
                    "--host",
                    "127.0.0.1",
                    "--cores",
                    "1",
                    "--memory",
                    "1536m",
                    "--webui-port",
                    str(free_port()),
                    "--work-dir",
                    str(work),
                    cluster.master,
                ],
                root / f"worker-{number}.log",
            )
        )
    try:
        deadline = time.monotonic() + 120
        while True:
            for process in processes:
                assert process.poll() is None, (root / "master.log").read_text()[-3000:]
            try:
                workers = [w for w in cluster.status().get("workers", []) if w.get("state") == "ALIVE"]
            except (OSError, ValueError):  # not listening yet, or a page that is not the status yet
                workers = []
            if len(workers) == WORKERS:
                break
            assert time.monotonic() < deadline, "the Spark master did not see two workers within 120 s"
            time.sleep(0.05)
        yield cluster
    finally:
        for process in reversed(processes):
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
