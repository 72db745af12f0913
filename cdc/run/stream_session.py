"""One replication session of a capture run, and the reconnections between sessions: frames read from the
slot, whole transactions appended to the log in groups, the slot confirmed at what the log holds.

The decisions (what to append, skip or confirm, when to read a chunk, heartbeat or stop) are
:attr:`StreamSession.core`'s (:mod:`cdc.capture.stream_core`, tested without I/O); this module carries
them out. :class:`~cdc.run.coordinator.Capture`, the run, sets up everything a session uses (the log, the
replayer, the reads) and decides where the log begins; the guarantees are stated there.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable

from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_exponential

from cdc.capture.catalog import Catalog
from cdc.capture.change_replayer import ChangeReplayer
from cdc.capture.errors import PrerequisiteError, PrivilegeError, SlotError, SlotLostError, SourceError
from cdc.capture.gc_tuning import relaxed_gc
from cdc.capture.group_writer import GroupWriter
from cdc.capture.lsn import Lsn
from cdc.capture.pgoutput.messages import LogicalMessage
from cdc.capture.reads.scheduler import ReadScheduler
from cdc.capture.reads.snapshot_requests import SnapshotRequest
from cdc.capture.slot_continuity import require_continuity, slot_confirmed
from cdc.capture.stream_core import (
    AppendGroup,
    Command,
    Discover,
    Finish,
    Heartbeat,
    Retarget,
    SendStatus,
    Skip,
    StreamCore,
    WriteSnapshot,
)
from cdc.capture.streaming import Transaction, TransactionAssembler
from cdc.capture.table_snapshots import PendingSnapshot, SnapshotLedger
from cdc.capture.timelines import divergence
from cdc.capture.transport import Keepalive, ReplicationConnection, XLogData, decode_frame
from cdc.capture.visibility import ReceivedXids
from cdc.config.settings import Settings
from cdc.observe.metrics import CaptureMetrics
from cdc.run.tuning import CaptureStats, Tuning
from log_store import ProducerRecord
from log_store.log import Log

log = logging.getLogger("cdc.capture")


def _retryable(exc: BaseException) -> bool:
    return isinstance(exc, SourceError) and not isinstance(exc, (SlotError, PrivilegeError, PrerequisiteError))


class StreamSession:
    """The streaming half of a capture run: what it reads and writes is set up by the run
    (:class:`~cdc.run.coordinator.Capture`), declared here."""

    settings: Settings
    metrics: CaptureMetrics
    once: bool
    stop: threading.Event
    tuning: Tuning
    stats: CaptureStats
    catalog: Catalog
    log: Log | None
    core: StreamCore[Transaction, PendingSnapshot]
    replayer: ChangeReplayer | None
    ledger: SnapshotLedger
    groups: GroupWriter | None
    scheduler: ReadScheduler
    _received: ReceivedXids

    @property
    def position(self) -> Lsn:
        """Every transaction committed at or before it is in the log, and no later one."""
        return self.core.position

    @position.setter
    def position(self, value: Lsn) -> None:
        self.core.position = value

    @property
    def confirmed(self) -> Lsn:
        """The position confirmed to the slot: everything before it is durable in the log."""
        return self.core.confirmed

    def _follow_timeline(self, repl: ReplicationConnection) -> None:
        """At a session's start: the log records the source's timeline before streaming on it. A timeline
        that forked below the log's position (a promotion mid-run) stops the session: the next run reads
        every table again (:mod:`cdc.capture.timelines`)."""
        assert self.log is not None
        timeline, diverged = divergence(repl, self.ledger.timeline, self.position)
        if diverged is not None and slot_confirmed(self.settings.database_url, self.settings.slot) is None:
            return  # the slot is gone too: starting the stream says so, with `cdc setup` as the fix
        if diverged is not None:
            raise SlotLostError(f"{diverged}; start capture again: it reads every captured table again")
        if timeline != self.ledger.timeline:
            self.log.append_group([self.ledger.timeline_record(timeline)], self.position.hex16())

    # -- streaming -----------------------------------------------------------------------------------

    def _stream_with_reconnect(self) -> None:
        """:meth:`_stream`, opened again after a lost connection: one warning line per attempt, pauses
        growing from 0.2 s to 5 s, for at most ``reconnect_seconds``. A multi-host ``CDC_DATABASE_URL``
        (``host=a,b`` with ``target_session_attrs=primary``) reaches whichever server is primary then, so
        after a failover capture resumes from the promoted standby's synced slot
        (:mod:`cdc.capture.slot_continuity` says why nothing is written twice or out of order)."""
        retrying = Retrying(
            retry=retry_if_exception(_retryable),
            wait=wait_exponential(multiplier=0.2, max=5),
            stop=stop_after_delay(self.tuning.reconnect_seconds),
            reraise=True,
            before_sleep=lambda state: log.warning(
                "reconnecting after: %s (attempt %d, next in %.1f s, for up to %.0f s)",
                state.outcome.exception() if state.outcome else "?",
                state.attempt_number,
                state.next_action.sleep if state.next_action else 0.0,
                self.tuning.reconnect_seconds,
            ),
        )
        for attempt in retrying:
            with attempt:
                if attempt.retry_state.attempt_number > 1:
                    self.stats.reconnects += 1
                    self.metrics.reconnects.inc()
                with relaxed_gc():
                    self._stream()

    def _stream(self) -> None:
        """One replication session, its decisions taken by :attr:`core` (:mod:`cdc.capture.stream_core`); returns
        when stopped or drained, raises on connection loss (complete transactions are appended first,
        without confirming them: the next session skips them as the log's)."""
        core = self.core
        with ReplicationConnection(self.settings.database_url) as repl:
            self._follow_timeline(repl)
            require_continuity(self.settings.database_url, self.settings.slot, self.position)
            if self.once and core.target is None:
                core.drain_to(self.catalog.wal_insert_position(), time.monotonic() + self.catalog.async_commit_delay())
            # Snapshots that waited when the last session ended are taken again at a new point, and
            # reads under way go on from new ones; the slot sends again what the log does not hold.
            self.scheduler.begin_session()
            repl.start(self.settings.slot, Lsn(0), self.settings.publication)
            assembler = TransactionAssembler(self.tuning.memory_limit, self.settings.outbox_message_prefix)
            core.begin_session(time.monotonic())
            try:
                while True:
                    frames = repl.read_raw(core.read_timeout())
                    self._receive(frames, assembler, repl)
                    pass_ = core.tick(
                        time.monotonic(), got_frames=bool(frames), stop=self.stop.is_set(),
                        assembler_idle=assembler.idle, wants_discovery=self.scheduler.wants_discovery,
                    )  # fmt: skip
                    if self._carry_out(pass_, repl):
                        return
                    if self.scheduler.reads:
                        self.scheduler.read_chunk()
            except SourceError as exc:
                self.metrics.errors.labels(kind=type(exc).__name__).inc()
                group = core.take_pending()
                if group:
                    self._append(group)  # not confirmed: the connection is gone, the next session skips it
                raise
            finally:
                for tx in core.take_pending():
                    tx.close()
                assembler.reset()

    def _receive(self, frames: list[bytes | memoryview], assembler: TransactionAssembler, repl: ReplicationConnection) -> None:
        """Feed one read's frames to the assembler, and each whole transaction and keepalive to :attr:`core`."""
        core, take = self.core, assembler.take
        index = 0
        while True:
            index = take(frames, index)  # changes of the open transaction, kept as bytes until its commit
            if index >= len(frames):
                return
            frame = decode_frame(frames[index])
            index += 1
            if isinstance(frame, XLogData):
                # Only keepalives and commits move the server's end: an XLogData header inside a
                # streamed block does not promise that earlier commits were all sent.
                tx = assembler.feed(frame.payload, frame.data_start)
                if tx is not None:
                    self._received.add(tx.xid)
                    self._carry_out(core.committed(tx, time.monotonic()), repl)
            elif isinstance(frame, Keepalive):
                self.metrics.wal_bytes_behind.set(max(0, frame.wal_end - core.confirmed))
                self._carry_out(core.keepalive(frame.wal_end, frame.reply_requested, time.monotonic()), repl)

    def _carry_out(self, commands: Iterable[Command[Transaction, PendingSnapshot]], repl: ReplicationConnection) -> bool:
        """Carry out :attr:`core`'s commands in order; whether the session is finished."""
        for command in commands:
            match command:
                case AppendGroup(transactions=group):
                    self._send(self._append(group), repl)
                case Skip(transaction=tx):
                    self.stats.skipped += 1
                    assert self.replayer is not None
                    self.replayer.replay_relations(tx)
                case SendStatus():
                    self._send(command, repl)
                case WriteSnapshot(snapshot=pending):
                    self.scheduler.start_read(pending)
                case Heartbeat(end=end):
                    self._heartbeat(end, repl)
                case Discover():
                    self.scheduler.discovery_due()
                    self.scheduler.discover()
                case Retarget():
                    self.core.retarget(self.catalog.wal_flush_position())
                case Finish(flushed=flushed):
                    repl.send_status(flushed, flushed)
                    repl.finish()
                    return True
        return False

    @staticmethod
    def _send(status: SendStatus, repl: ReplicationConnection) -> None:
        repl.send_status(status.flushed, status.flushed, reply=status.reply)

    def _requested(self, message: LogicalMessage, commit_ts_ms: int) -> list[ProducerRecord]:
        """A ``cdc snapshot`` request (:mod:`cdc.capture.reads.snapshot_requests`) in a transaction being written,
        handed to the reads (:meth:`ReadScheduler.requested`); the records to write in the same group."""
        request = SnapshotRequest.parse(message.content)
        if request is None:
            return []
        return self.scheduler.requested(request, commit_ts_ms, Lsn(message.lsn))

    # -- groups --------------------------------------------------------------------------------------

    def _append(self, group: list[Transaction]) -> SendStatus:
        """Append ``group`` as one group (:mod:`cdc.capture.group_writer`); the status that confirms it, to send."""
        assert self.groups is not None
        try:
            written = self.groups.append(group)
        finally:
            self.scheduler.reap()
        self.scheduler.start_truncated_over()
        status = self.core.group_durable(group)
        self.scheduler.group_written()
        self.stats.events += written.events
        self.stats.groups += 1
        self.stats.transactions += len(group)
        last = group[-1].commit_ts_ms
        self.metrics.group_durable(written.events, written.value_bytes, len(group), status.flushed, last)
        return status

    def _heartbeat(self, end: Lsn, repl: ReplicationConnection) -> None:
        """Every transaction committed before the server's WAL ``end`` is in the log: record and confirm it."""
        assert self.log is not None
        self.log.append_group([], Lsn(end - 1).hex16())
        self.stats.groups += 1
        self._send(self.core.heartbeat_durable(end), repl)
        self.metrics.caught_up(int(self.confirmed))
