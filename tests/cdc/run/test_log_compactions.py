"""The schedule of capture's own log compactions: a failing one is one warning line and the next runs."""

from __future__ import annotations

import logging
import sys

import pytest

from cdc.run.log_compactions import LogCompactions
from tests.cdc.helpers import wait_for


def test_a_failed_compaction_is_one_warning_and_the_schedule_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    failing = [sys.executable, "-c", "import sys; sys.exit('no space left on device: segment 7')"]
    compactions = LogCompactions(0.05, command=failing)
    with caplog.at_level(logging.WARNING, logger="cdc.capture"):
        compactions.start()
        try:
            wait_for(lambda: len(caplog.records) >= 2, timeout=30, what="two failed compactions")
        finally:
            compactions.close()
    first = caplog.records[0].getMessage()
    assert "compaction failed" in first and first.endswith("no space left on device: segment 7"), first
    assert compactions.done == 0


def test_close_stops_a_running_compaction() -> None:
    compactions = LogCompactions(0.01, command=[sys.executable, "-c", "import time; time.sleep(600)"]).start()
    wait_for(lambda: compactions._child is not None, timeout=30, what="a compaction under way")
    child = compactions._child
    compactions.close()
    assert child is not None and child.poll() is not None, "the child outlived capture"
