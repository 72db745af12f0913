"""Requests to read tables again (``cdc snapshot``), carried to capture through PostgreSQL's WAL.

``cdc snapshot TABLE...`` runs ``pg_logical_emit_message(true, 'cdc.snapshot', <JSON>)`` on the source: a
transactional logical message (no table, no write grant needed), which every replication stream of the
database carries at its commit position. Capture starts its stream with pgoutput's ``messages`` option,
keeps such a message in its transaction (:class:`~cdc.capture.streaming.TransactionAssembler`) and,
when the transaction is written to the log, forgets the named tables' ledger entries, so the next
discovery reads them again beside the stream (:mod:`cdc.capture.online_read`), as ``op=r`` events
after truncate markers. A capture that is not running gets the request when it next streams past it.

``cdc snapshot --cancel TABLE...`` travels the same way and stops the reads of the named tables, under
way or due: a read cannot be undone in the log (its truncate markers already hide the rows it has not
read again), so capture leaves the table out from then on instead of writing changes of rows the log
lacks, until ``cdc snapshot TABLE`` asks for it again (:meth:`~cdc.capture.table_snapshots.SnapshotLedger.cancel_record`).

Content: ``{"tables": ["<schema>.<table>", ...]}``, or ``{"cancel": [...]}`` (UTF-8 JSON; a capture
that knows no ``cancel`` ignores it).
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

#: The logical message prefix of a request.
PREFIX = "cdc.snapshot"


@dataclass(frozen=True)
class SnapshotRequest:
    """Tables (``schema.table``) to read again, and tables whose read to stop."""

    tables: tuple[str, ...] = ()
    cancel: tuple[str, ...] = ()

    def content(self) -> bytes:
        return orjson.dumps({"cancel": list(self.cancel)} if self.cancel else {"tables": list(self.tables)})

    @classmethod
    def parse(cls, content: bytes) -> SnapshotRequest | None:
        """The request in a message's content, ``None`` when it holds none (a malformed message is ignored)."""
        try:
            data = orjson.loads(content)
            tables = tuple(str(name) for name in data.get("tables", ()))
            cancel = tuple(str(name) for name in data.get("cancel", ()))
        except (orjson.JSONDecodeError, AttributeError, TypeError):
            return None
        return cls(tables, cancel) if tables or cancel else None
