"""``cdc spark-server`` as a test's child process: started on a free port, awaited, stopped with SIGTERM."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from local_servers.postgres import free_port

CDC = str(Path(sys.executable).with_name("cdc"))


def answers(port: int) -> bool:
    """Whether something listens on ``127.0.0.1:port``."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def server_environment(**extra: str) -> dict[str, str]:
    """This process's environment without the pipeline's settings (the server takes none), plus ``extra``."""
    kept = {k: v for k, v in os.environ.items() if not k.startswith("CDC_") or k == "CDC_SPARK_JARS_DIR"}
    return {**kept, **extra}


@contextmanager
def running_spark_server(workdir: Path, *settings: str, env: dict[str, str] | None = None) -> Iterator[str]:
    """``cdc spark-server`` on a free port (``settings``: ``--conf K=V`` values; its log in
    ``workdir/server.log``), yielding its ``sc://`` URL once it listens, stopped (SIGTERM) afterwards."""
    port = free_port()
    log = workdir / "server.log"
    confs = [arg for setting in settings for arg in ("--conf", setting)]
    server = subprocess.Popen(
        [CDC, "spark-server", "--port", str(port), *confs],
        cwd=workdir,
        env=server_environment() if env is None else env,
        stdout=subprocess.DEVNULL,
        stderr=log.open("w"),
    )
    try:
        deadline = time.monotonic() + 180
        while not answers(port):
            assert server.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "the Spark Connect server did not listen within 180 s"
            time.sleep(0.05)
        yield f"sc://127.0.0.1:{port}"
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
