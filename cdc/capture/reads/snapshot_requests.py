"""Requests to read tables again (``cdc snapshot``), carried to capture through PostgreSQL's WAL.

``cdc snapshot TABLE...`` runs ``pg_logical_emit_message(true, 'cdc.snapshot', <JSON>)`` on the source: a
transactional logical message (no table, no write grant needed), which every replication stream of the
database carries at its commit position. Capture starts its stream with pgoutput's ``messages`` option,
keeps such a message in its transaction (:class:`~cdc.capture.streaming.TransactionAssembler`) and,
when the transaction is written to the log, forgets the named tables' ledger entries, so the next
discovery reads them again beside the stream (:mod:`cdc.capture.reads.online_read`), as ``op=r`` events
after truncate markers. A capture that is not running gets the request when it next streams past it.

``cdc snapshot --cancel TABLE...`` travels the same way and stops the reads of the named tables, under
way or due: a read cannot be undone in the log (its truncate markers already hide the rows it has not
read again), so capture leaves the table out from then on instead of writing changes of rows the log
lacks, until ``cdc snapshot TABLE`` asks for it again (:meth:`~cdc.capture.table_snapshots.SnapshotLedger.cancel_record`).

``cdc snapshot TABLE --where "<condition>"`` asks for the rows of one table the condition selects
(:mod:`cdc.capture.reads.read_conditions`): capture runs that SQL with its own privileges, and any role that
may connect can emit a logical message, so such a request is signed. Its content carries ``"where"``,
``"at"`` (the sender's clock, milliseconds) and ``"signature"``: HMAC-SHA256 under ``CDC_REQUEST_KEY``
(a secret the operator gives both ``cdc snapshot`` and capture) of the canonical JSON of the tables,
the condition and ``at``. Capture runs it only when the signature is right and ``at`` is within
:data:`FRESH_MS` of the commit time of the transaction that carries it (so a request seen once, in the
WAL or the log, cannot be sent again later to the same effect); any other is logged and ignored.

Content: ``{"tables": ["<schema>.<table>", ...]}`` (plus ``where``, ``at``, ``signature`` for a partial
read), or ``{"cancel": [...]}`` (UTF-8 JSON; a capture that knows no ``cancel`` ignores it).
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass, replace

import orjson

#: The logical message prefix of a request.
PREFIX = "cdc.snapshot"
#: How far a signed request's ``at`` may be from the commit time of its transaction.
FRESH_MS = 5 * 60 * 1000


@dataclass(frozen=True)
class SnapshotRequest:
    """Tables (``schema.table``) to read again, and tables whose read to stop."""

    tables: tuple[str, ...] = ()
    cancel: tuple[str, ...] = ()
    #: the condition of a partial read (SQL, :mod:`cdc.capture.reads.read_conditions`), when and by whom it was signed
    where: str | None = None
    at: int = 0
    signature: str = ""

    def content(self) -> bytes:
        if self.cancel:
            return orjson.dumps({"cancel": list(self.cancel)})
        if self.where is None:
            return orjson.dumps({"tables": list(self.tables)})
        signed = {"tables": list(self.tables), "where": self.where, "at": self.at, "signature": self.signature}
        return orjson.dumps(signed)

    def signed(self, key: bytes, at: int) -> SnapshotRequest:
        """This request signed with ``key`` at ``at`` (milliseconds since the epoch)."""
        unsigned = replace(self, at=at, signature="")
        return replace(unsigned, signature=unsigned._digest(key))

    def signed_by(self, key: bytes | None, commit_ts_ms: int) -> bool:
        """Whether ``key`` signed this request, and ``at`` is within :data:`FRESH_MS` of ``commit_ts_ms``."""
        if key is None or not self.signature or abs(commit_ts_ms - self.at) > FRESH_MS:
            return False
        return hmac.compare_digest(self._digest(key).encode(), self.signature.encode())

    def _digest(self, key: bytes) -> str:
        signed = orjson.dumps({"tables": list(self.tables), "where": self.where, "at": self.at}, option=orjson.OPT_SORT_KEYS)
        return hmac.new(key, signed, hashlib.sha256).hexdigest()

    @classmethod
    def parse(cls, content: bytes) -> SnapshotRequest | None:
        """The request in a message's content, ``None`` when it holds none (a malformed message is ignored)."""
        try:
            data = orjson.loads(content)
            tables = tuple(str(name) for name in data.get("tables", ()))
            cancel = tuple(str(name) for name in data.get("cancel", ()))
            where = data.get("where")
            at, signature = int(data.get("at", 0)), str(data.get("signature", ""))
        except (orjson.JSONDecodeError, AttributeError, TypeError, ValueError, OverflowError):
            return None
        if where is not None and not isinstance(where, str):
            return None
        if not tables and not cancel:
            return None
        return cls(tables, cancel, where, at, signature)
