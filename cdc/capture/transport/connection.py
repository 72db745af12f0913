"""A logical replication connection over psycopg 3's libpq handle: commands, the CopyBoth stream, status.

This is the only module that talks the streaming replication protocol. Everything above it sees
:class:`~cdc.capture.transport.framing.XLogData` and :class:`~cdc.capture.transport.framing.Keepalive` values and calls
:meth:`ReplicationConnection.send_status`; below it is libpq. Walsender accepts only the simple query
protocol, so commands go through ``pgconn.exec_``, never through a psycopg cursor.
"""

from __future__ import annotations

import select
import time
from dataclasses import dataclass

import psycopg
from psycopg import pq

from cdc.capture.catalog import SESSION_OPTIONS
from cdc.capture.errors import PrerequisiteError, SlotError, SlotLostError, SourceError, connection_failure
from cdc.capture.lsn import Lsn
from cdc.capture.transport.framing import Frame, decode_frame, encode_status


@dataclass(frozen=True, slots=True)
class CreatedSlot:
    """What CREATE_REPLICATION_SLOT returned: the consistent point and the exported snapshot name."""

    name: str
    consistent_point: Lsn
    snapshot_name: str | None


def _quote_literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def create_slot_command(slot: str, *, export_snapshot: bool, temporary: bool, server_version: int, failover: bool = False) -> str:
    """The CREATE_REPLICATION_SLOT command for a pgoutput slot, in the syntax of the server's version.

    PostgreSQL 15 takes the options in parentheses (``(SNAPSHOT 'export')``); 14 knows only the older
    keywords (``EXPORT_SNAPSHOT`` / ``NOEXPORT_SNAPSHOT``), which 15 and later still accept but document
    as deprecated, so each side gets its own. ``failover`` (17 and later, :mod:`cdc.setup.failover`) adds
    ``FAILOVER``: the standbys that sync slots keep a copy a promotion leaves usable.
    """
    kind = "TEMPORARY LOGICAL" if temporary else "LOGICAL"
    if failover and server_version < 170000:
        raise SlotError(f"replication slot {slot}: failover slots need PostgreSQL 17 or newer; set CDC_SLOT_FAILOVER=false")
    if server_version >= 150000:
        snapshot = "'export'" if export_snapshot else "'nothing'"
        mode = f"(SNAPSHOT {snapshot}{', FAILOVER' if failover else ''})"
    else:
        mode = "EXPORT_SNAPSHOT" if export_snapshot else "NOEXPORT_SNAPSHOT"
    return f"CREATE_REPLICATION_SLOT {_quote_ident(slot)} {kind} pgoutput {mode}"


def _quote_ident(value: str) -> str:
    return '"' + value.replace('"', '""') + '"'


class ReplicationConnection:
    """One ``replication=database`` session. Not thread-safe; one stream per connection.

    Errors from the server are turned into :class:`SlotError` when they concern the slot (missing,
    invalidated, active elsewhere) and :class:`SourceError` otherwise.
    """

    def __init__(self, url: str, *, connect_timeout: int = 10) -> None:
        try:
            self._conn = psycopg.connect(
                url,
                autocommit=True,
                replication="database",
                connect_timeout=connect_timeout,
                options=SESSION_OPTIONS,
            )
        except psycopg.OperationalError as exc:
            raise SourceError(
                f"cannot open a replication connection: {connection_failure(exc)}"
                "; check CDC_DATABASE_URL and that the server is up and accepts replication connections"
            ) from None
        self._pg = self._conn.pgconn
        self.streaming = False
        self._ended: SourceError | None = None  # how the stream ended, raised once its frames are read

    # -- commands ------------------------------------------------------------------------------------

    def command(self, text: str) -> list[tuple[str | None, ...]]:
        """Run one replication command (simple query protocol) and return its rows as text."""
        result = self._pg.exec_(text.encode())
        if result.status == pq.ExecStatus.FATAL_ERROR:
            raise _server_error(result, text)
        rows: list[tuple[str | None, ...]] = []
        for row in range(result.ntuples):
            rows.append(tuple(_text(result.get_value(row, col)) for col in range(result.nfields)))
        return rows

    def identify_system(self) -> tuple[str, int, Lsn, str]:
        """(system id, timeline, current WAL flush position, database name)."""
        system_id, timeline, xlogpos, dbname = self.command("IDENTIFY_SYSTEM")[0]
        return system_id or "", int(timeline or 0), Lsn.parse(xlogpos or "0/0"), dbname or ""

    def create_slot(self, slot: str, *, export_snapshot: bool, temporary: bool = False, failover: bool = False) -> CreatedSlot:
        """CREATE_REPLICATION_SLOT ... LOGICAL pgoutput; the exported snapshot lives while this
        connection runs no other command, so open the snapshot transaction before the next call.

        A ``temporary`` slot is dropped by the server when this connection ends (also on a crash); a
        ``failover`` slot is synced to standbys that sync slots (PostgreSQL 17+).
        """
        text = create_slot_command(
            slot,
            export_snapshot=export_snapshot,
            temporary=temporary,
            server_version=self._pg.server_version,
            failover=failover,
        )
        row = self.command(text)[0]
        return CreatedSlot(row[0] or slot, Lsn.parse(row[1] or "0/0"), row[2])

    def start(self, slot: str, start: Lsn, publication: str, *, proto_version: int = 2, streaming: bool = True) -> None:
        """START_REPLICATION from ``start`` (0/0 = the slot's confirmed position); enters CopyBoth."""
        options = [f"proto_version '{proto_version}'", f"publication_names {_quote_literal(_quote_ident(publication))}"]
        if streaming and proto_version >= 2:
            options.append("streaming 'on'")
        # logical messages: requests to capture (cdc.snapshot) and new masks (cdc.masks, see
        # event_format.masks) travel as transactional ones, at the position of their change; others are skipped
        options.append("messages 'true'")
        text = f"START_REPLICATION SLOT {_quote_ident(slot)} LOGICAL {Lsn(start)} ({', '.join(options)})"
        self._pg.send_query(text.encode())
        while True:
            self._wait_readable(None)
            self._pg.consume_input()
            if not self._pg.is_busy():
                break
        result = self._pg.get_result()
        if result is None or result.status != pq.ExecStatus.COPY_BOTH:
            if result is not None and result.status == pq.ExecStatus.FATAL_ERROR:
                raise _server_error(result, text)
            raise SourceError(f"START_REPLICATION did not enter streaming mode for slot {slot}")
        self.streaming = True

    # -- the stream ----------------------------------------------------------------------------------

    def read(self, timeout: float | None) -> Frame | None:
        """The next frame, or None when nothing arrived within ``timeout`` seconds.

        Raises :class:`SourceError` when the server ends the stream or the connection is lost.
        """
        while True:
            try:
                size, data = self._pg.get_copy_data(1)
            except psycopg.OperationalError as exc:
                raise SourceError(_first_line(exc, "replication connection lost")) from None
            if size > 0:
                return decode_frame(data)
            if size == 0:
                if not self._wait_readable(timeout):
                    return None
                try:
                    self._pg.consume_input()
                except psycopg.OperationalError as exc:
                    raise SourceError(_first_line(exc, "replication connection lost")) from None
                timeout = 0 if timeout is not None else None
                continue
            result = self._pg.get_result()
            self.streaming = False
            if result is not None and result.status == pq.ExecStatus.FATAL_ERROR:
                raise _server_error(result, "START_REPLICATION")
            raise SourceError("the server ended the replication stream; capture will reconnect")

    def read_raw(self, timeout: float | None, limit: int = 1024) -> list[bytes | memoryview]:
        """Up to ``limit`` undecoded CopyData frames: the first waits up to ``timeout`` seconds, the rest
        are those already received (no further wait). An empty list: nothing arrived in time.

        Decode them with :func:`~cdc.capture.transport.framing.decode_frame` (or read the XLogData header in
        place). The end of the stream or a lost connection raises :class:`SourceError`, after the frames
        received before it have been returned.
        """
        if self._ended is not None:
            raise self._ended
        frames: list[bytes | memoryview] = []
        get_copy_data = self._pg.get_copy_data
        while len(frames) < limit:
            try:
                size, data = get_copy_data(1)
            except psycopg.OperationalError as exc:
                self._ended = SourceError(_first_line(exc, "replication connection lost"))
                break
            if size > 0:
                frames.append(data)
                continue
            if size == 0:
                if not self._wait_readable(0 if frames else timeout):
                    return frames
                try:
                    self._pg.consume_input()
                except psycopg.OperationalError as exc:
                    self._ended = SourceError(_first_line(exc, "replication connection lost"))
                    break
                timeout = 0 if timeout is not None else None
                continue
            result = self._pg.get_result()
            self.streaming = False
            if result is not None and result.status == pq.ExecStatus.FATAL_ERROR:
                self._ended = _server_error(result, "START_REPLICATION")
            else:
                self._ended = SourceError("the server ended the replication stream; capture will reconnect")
            break
        if self._ended is not None and not frames:
            raise self._ended
        return frames

    def send_status(self, written: Lsn, flushed: Lsn, *, reply: bool = False) -> None:
        """Tell the server how far we have durably flushed. Only pass durable positions."""
        try:
            self._pg.put_copy_data(encode_status(written, flushed, flushed, reply=reply))
            self._pg.flush()
        except psycopg.OperationalError as exc:
            raise SourceError(_first_line(exc, "replication connection lost")) from None

    def finish(self, timeout: float = 5.0) -> None:
        """End the stream the protocol's way (CopyDone, then wait for the server's end of the command).

        The server handles messages in order, so once it has answered, the last status update sent is
        applied: the slot shows the confirmed position and is released before capture exits, and a
        ``cdc lag`` run right after sees it. A server that does not answer within ``timeout`` seconds is
        left to notice the closed connection (the status update was still sent).
        """
        if not self.streaming or self._ended is not None:
            return
        self.streaming = False
        deadline = time.monotonic() + timeout
        try:
            self._pg.put_copy_end()
            self._pg.flush()
            while True:
                size, _ = self._pg.get_copy_data(1)
                remaining = deadline - time.monotonic()
                if size > 0:
                    if remaining <= 0:
                        return  # a server still streaming a large transaction: do not wait for it
                    continue  # frames sent before the server saw CopyDone
                if size < 0:
                    break
                if remaining <= 0 or not self._wait_readable(remaining):
                    return
                self._pg.consume_input()
            while time.monotonic() < deadline:
                self._pg.consume_input()
                if self._pg.is_busy():
                    if not self._wait_readable(max(0.0, deadline - time.monotonic())):
                        return
                    continue
                if self._pg.get_result() is None:
                    return
        except psycopg.OperationalError:
            return

    def _wait_readable(self, timeout: float | None) -> bool:
        readable, _, _ = select.select([self._pg.socket], [], [], timeout)
        return bool(readable)

    def close(self) -> None:
        """Close the session (the server keeps the slot and its confirmed position)."""
        try:
            self._conn.close()
        except Exception:  # noqa: BLE001 - closing a broken connection must not mask the real error
            pass

    def __enter__(self) -> ReplicationConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _first_line(exc: BaseException, prefix: str) -> str:
    detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return f"{prefix}: {detail}"


def _server_error(result: pq.abc.PGresult, command: str) -> SourceError:
    """Map a failed replication command to a one-line error with the fix."""
    message = (result.error_message or b"").decode(errors="replace").strip().splitlines()
    line = message[0] if message else "unknown error"
    line = line.removeprefix("ERROR:").strip()
    sqlstate = (result.error_field(pq.DiagnosticField.SQLSTATE) or b"").decode()
    verb = command.split(" ", 1)[0]
    if "publication" in line and "does not exist" in line:
        return PrerequisiteError(
            [
                f"{line}: it was dropped or renamed while capture ran; run `cdc setup` to create it (or set "
                "CDC_PUBLICATION to the publication to capture), then start capture again"
            ]
        )
    if sqlstate == "42704" or "does not exist" in line and "slot" in line:
        return SlotLostError(
            f"replication slot is gone ({line}): it was dropped, or a failover promoted a standby that did not have "
            "it (PostgreSQL 14 to 16, or a slot not synced yet); run `cdc setup` to create it, then capture reads "
            "every table again (CDC_RECREATE_LOST_SLOT=true does both by itself)"
        )
    if "can no longer" in line or "invalidated" in line or "required WAL" in line or sqlstate == "55000" and "slot" in line:
        return SlotLostError(
            f"replication slot is invalidated ({line}); drop it and run `cdc setup`, then capture reads every table "
            "again (CDC_RECREATE_LOST_SLOT=true does both by itself)"
        )
    if sqlstate == "55006" or "is active for PID" in line:
        return SlotError(f"replication slot is in use ({line}); stop the other capture process first")
    if sqlstate == "42501":
        return SourceError(f"{verb} refused: {line}; grant the role REPLICATION (ALTER ROLE ... REPLICATION)")
    return SourceError(f"{verb} failed: {line}")


def _text(value: bytes | None) -> str | None:
    return None if value is None else bytes(value).decode()
