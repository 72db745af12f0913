"""``cdc lag --watch`` in a real process: it ends with status 0 on SIGINT or SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.cdc.helpers import CDC

pytestmark = pytest.mark.pg


@pytest.mark.parametrize(
    ("stop_signal", "start_ignoring_sigint"),
    [(signal.SIGINT, False), (signal.SIGINT, True), (signal.SIGTERM, False)],
    ids=["sigint", "sigint-ignored-at-start", "sigterm"],
)
def test_watch_in_a_process(reference_db: str, tmp_path: Path, stop_signal: signal.Signals, start_ignoring_sigint: bool) -> None:
    """--watch ends with status 0 on SIGINT or SIGTERM, also when started with SIGINT ignored (as a
    non-interactive shell starts `cmd &`): Python then never turns SIGINT into KeyboardInterrupt itself."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("CDC_")}
    env.update(CDC_DATABASE_URL=reference_db, CDC_DATA_DIR=str(tmp_path / "data"))
    # `trap '' INT` ignores SIGINT, and an ignored signal stays ignored across exec
    ignoring = ["sh", "-c", "trap '' INT; exec \"$@\"", "sh"] if start_ignoring_sigint else []
    with open(tmp_path / "stderr", "w+") as stderr:
        watch = subprocess.Popen(
            [*ignoring, str(CDC), "lag", "--watch", "--interval", "0.2"],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env=env,
        )
        try:
            assert watch.stdout is not None
            assert "source → log" in watch.stdout.readline()  # the first report is out: the loop runs
            watch.send_signal(stop_signal)
            code = watch.wait(timeout=30)
            stderr.seek(0)
            assert code == 0, stderr.read()
        finally:
            if watch.poll() is None:
                watch.kill()
                watch.wait()
