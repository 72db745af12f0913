"""The pgoutput logical replication messages as immutable values (protocol versions 1 and 2)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final


class _Unchanged:
    """Marker for a TOASTed column value the server did not send because the update left it untouched."""

    _instance: _Unchanged | None = None

    def __new__(cls) -> _Unchanged:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNCHANGED"


#: Stands for an unchanged TOAST value inside a :data:`Tuple`; never written to the log.
UNCHANGED: Final = _Unchanged()

#: One row as sent: per column its text form, ``None`` for SQL NULL, or :data:`UNCHANGED`.
Tuple = tuple["str | None | _Unchanged", ...]


@dataclass(frozen=True, slots=True)
class Begin:
    """Start of a transaction; ``final_lsn`` is its commit LSN, known up front."""

    final_lsn: int
    commit_ts_us: int
    xid: int


@dataclass(frozen=True, slots=True)
class Commit:
    """End of a transaction; every change between Begin and here belongs to it."""

    flags: int
    commit_lsn: int
    end_lsn: int
    commit_ts_us: int


@dataclass(frozen=True, slots=True)
class Origin:
    """Replication origin of the transaction (skipped)."""

    lsn: int
    name: str


@dataclass(frozen=True, slots=True)
class Column:
    """One column of a relation as the server describes it."""

    name: str
    type_oid: int
    typmod: int
    key: bool


@dataclass(frozen=True, slots=True)
class Relation:
    """The shape of a table; sent before the first change that uses it, and again after it changes."""

    xid: int | None
    relid: int
    namespace: str
    name: str
    replica_identity: str
    columns: tuple[Column, ...]


@dataclass(frozen=True, slots=True)
class TypeInfo:
    """A non-built-in type used by a following Relation (schema-qualified name only)."""

    xid: int | None
    oid: int
    namespace: str
    name: str


@dataclass(frozen=True, slots=True)
class Insert:
    """A new row."""

    xid: int | None
    relid: int
    new: Tuple


@dataclass(frozen=True, slots=True)
class Update:
    """A changed row; ``old`` is the old key ('K') or whole old row ('O') when the server sends one."""

    xid: int | None
    relid: int
    old_kind: str | None
    old: Tuple | None
    new: Tuple


@dataclass(frozen=True, slots=True)
class Delete:
    """A removed row, identified by its old key ('K') or its whole old row ('O')."""

    xid: int | None
    relid: int
    old_kind: str
    old: Tuple


@dataclass(frozen=True, slots=True)
class Truncate:
    """One TRUNCATE over one or more relations."""

    xid: int | None
    options: int
    relids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class LogicalMessage:
    """A ``pg_logical_emit_message`` payload (skipped by capture)."""

    xid: int | None
    transactional: bool
    lsn: int
    prefix: str
    content: bytes


@dataclass(frozen=True, slots=True)
class StreamStart:
    """Start of a block of changes of in-progress transaction ``xid`` (protocol 2)."""

    xid: int
    first_segment: bool


@dataclass(frozen=True, slots=True)
class StreamStop:
    """End of the current block of streamed changes."""


@dataclass(frozen=True, slots=True)
class StreamCommit:
    """Streamed transaction ``xid`` committed at ``commit_lsn``: its blocks become one transaction."""

    xid: int
    flags: int
    commit_lsn: int
    end_lsn: int
    commit_ts_us: int


@dataclass(frozen=True, slots=True)
class StreamAbort:
    """Streamed (sub)transaction ``subxid`` of ``xid`` aborted; equal ids abort the whole transaction."""

    xid: int
    subxid: int


Message = (
    Begin
    | Commit
    | Origin
    | Relation
    | TypeInfo
    | Insert
    | Update
    | Delete
    | Truncate
    | LogicalMessage
    | StreamStart
    | StreamStop
    | StreamCommit
    | StreamAbort
)
