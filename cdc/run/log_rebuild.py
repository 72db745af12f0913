"""How to rebuild a damaged log from the source, spelled out for the user.

The log store says when its bytes cannot be trusted (a segment failing its checks, a missing watermark
file) and that the log can be rebuilt from its source; it knows nothing of PostgreSQL, so the steps are
stated here. They rebuild the whole log, not one topic: a damaged segment stays in its topic (reads,
compaction and a rebuild by replay all stop at it), so a table snapshotted again into the same topic, as
removing it from the publication and adding it back does, would sit behind the damage. A log that is
gone makes capture start from scratch: it finds no watermark, drops and recreates the slot and takes a
consistent snapshot of every published table (:mod:`cdc.run.coordinator`). The views recorded offsets of the
old log, so each is then rebuilt by replay, which replaces its tables in one commit.
"""

from __future__ import annotations

from pathlib import Path

from cdc.config.settings import load_settings
from cdc.errors import ConfigError


def rebuild_steps(log_dir: Path) -> str:
    """The procedure that replaces the log at ``log_dir`` with one rebuilt from the source."""
    return (
        f"to rebuild it: stop `cdc capture`, move {log_dir} aside, run `cdc capture` (with no log it "
        "recreates the slot and snapshots every published table into a new log), then run "
        "`cdc rebuild VIEW` for every view"
    )


def with_rebuild_steps(message: str, error: type[BaseException] | BaseException) -> str:
    """``message`` followed by :func:`rebuild_steps` when ``error`` offers to rebuild the log."""
    if not getattr(error, "needs_rebuild", False):
        return message
    try:
        log_dir = load_settings().log_dir
    except ConfigError:
        log_dir = Path("<CDC_DATA_DIR>/log")
    return f"{message}; {rebuild_steps(log_dir)}"
