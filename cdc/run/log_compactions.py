"""The embedded log compacted by the process that writes it: ``cdc capture`` every
``CDC_LOG_COMPACT_INTERVAL_S`` seconds.

Each compaction runs in a child process (``python -m cdc.run.log_compactions``), for two reasons: compaction
reads and rewrites whole sealed segments, pure Python work that in capture's own process would hold the
interpreter's lock and slow the stream; and a compaction that fails (a full disk, a damaged segment)
ends only the child, never capture. The child opens the log as a reader and takes the cleaner lock, not
the writer lock (:meth:`log_store.store.LogStore.compact`), so it runs beside capture's appends and
touches only sealed segments wholly below the watermark.

Guarantees:

- never two at once: a compaction still running when the next falls due is left to finish, and one a
  ``cdc log compact`` of the operator's is running beside is skipped (the cleaner lock), with one line;
- crash-safe: capture stopping stops a running child (SIGTERM, then SIGKILL). The cleaner swaps each
  rewritten segment in by an atomic rename, so a compaction cut short leaves every segment either old or
  new, both valid, and the next one does the rest;
- one line in capture's log per compaction: what it did, or why it failed.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

import orjson

log = logging.getLogger("cdc.capture")

#: How long a stopped child is given to end on SIGTERM before it is killed.
_STOP_GRACE_S = 10.0


@dataclasses.dataclass(frozen=True)
class Compacted:
    """What one compaction did, as the child reports it."""

    partitions: int
    rewritten: int
    deleted: int
    bytes_before: int
    bytes_after: int

    def line(self, seconds: float) -> str:
        """The line capture logs for it."""
        if not self.rewritten and not self.deleted:
            return f"compacted the log in {seconds:.1f} s: nothing to remove in {self.partitions} partition(s)"
        return (
            f"compacted the log in {seconds:.1f} s: {self.rewritten} segment(s) rewritten, {self.deleted} deleted "
            f"in {self.partitions} partition(s), {self.bytes_before:,} -> {self.bytes_after:,} bytes"
        )


class LogCompactions:
    """Runs a compaction of the embedded log every ``interval_s`` seconds until :meth:`close`."""

    def __init__(self, interval_s: float, command: Sequence[str] | None = None) -> None:
        self.interval_s = interval_s
        self._command = list(command or [sys.executable, "-m", "cdc.run.log_compactions"])
        self._stop = threading.Event()
        self._child: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="log-compactions", daemon=True)
        self.done = 0

    def start(self) -> LogCompactions:
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop: no compaction starts after this, and a running one is stopped (see the module's guarantees)."""
        self._stop.set()
        with self._lock:
            child = self._child
        if child is not None and child.poll() is None:
            child.terminate()
            try:
                child.wait(_STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        self._thread.join(_STOP_GRACE_S)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._compact_once()

    def _compact_once(self) -> None:
        started = time.monotonic()
        with self._lock:
            if self._stop.is_set():
                return
            self._child = subprocess.Popen(self._command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=os.environ.copy())
        out, err = self._child.communicate()
        seconds = time.monotonic() - started
        if self._stop.is_set():
            return
        if self._child.returncode == 0:
            reported = orjson.loads(out)
            if reported is None:
                log.info("skipped the log's compaction: another one (`cdc log compact`) holds the cleaner lock")
                return
            self.done += 1
            log.info(Compacted(**reported).line(seconds))
            return
        reason = err.decode(errors="replace").strip().splitlines()
        log.warning(
            "the log's compaction failed after %.1f s (capture goes on; the next is due in %g s): %s",
            seconds,
            self.interval_s,
            reason[-1] if reason else f"exit status {self._child.returncode}",
        )


def compact_now() -> Compacted | None:
    """One compaction of the embedded log the settings name, beside its writer (None: another holds the
    cleaner lock)."""
    from cdc.config.log_backend import open_log
    from cdc.config.settings import load_settings
    from log_store.errors import CleanerLockedError
    from log_store.store import LogStore

    settings = load_settings()
    with open_log(settings) as store:
        assert isinstance(store, LogStore)
        try:
            report = store.compact()
        except CleanerLockedError:
            return None
    parts = report.partitions
    return Compacted(
        partitions=len(parts),
        rewritten=sum(p.segments_rewritten for p in parts),
        deleted=sum(p.segments_deleted for p in parts),
        bytes_before=sum(p.bytes_before for p in parts),
        bytes_after=sum(p.bytes_after for p in parts),
    )


def _main() -> None:
    done = compact_now()
    sys.stdout.buffer.write(orjson.dumps(None if done is None else dataclasses.asdict(done)))


if __name__ == "__main__":
    _main()
