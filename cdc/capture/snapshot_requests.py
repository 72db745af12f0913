"""Requests to read tables again (``cdc snapshot``), carried to capture through PostgreSQL's WAL.

``cdc snapshot TABLE...`` runs ``pg_logical_emit_message(true, 'cdc.snapshot', <JSON>)`` on the source: a
transactional logical message (no table, no write grant needed), which every replication stream of the
database carries at its commit position. Capture starts its stream with pgoutput's ``messages`` option,
keeps such a message in its transaction (:class:`~cdc.capture.streaming.TransactionAssembler`) and,
when the transaction is written to the log, forgets the named tables' ledger entries, so the next
discovery reads them again beside the stream (:mod:`cdc.capture.online_read`), as ``op=r`` events
after truncate markers. A capture that is not running gets the request when it next streams past it.

Content: ``{"tables": ["<schema>.<table>", ...]}`` (UTF-8 JSON).
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

#: The logical message prefix of a request.
PREFIX = "cdc.snapshot"


@dataclass(frozen=True)
class SnapshotRequest:
    """Tables (``schema.table``) to read again."""

    tables: tuple[str, ...]

    def content(self) -> bytes:
        return orjson.dumps({"tables": list(self.tables)})

    @classmethod
    def parse(cls, content: bytes) -> SnapshotRequest | None:
        """The request in a message's content, ``None`` when it holds none (a malformed message is ignored)."""
        try:
            data = orjson.loads(content)
            return cls(tuple(str(name) for name in data["tables"]))
        except (orjson.JSONDecodeError, KeyError, TypeError):
            return None
