"""What ``cdc lag`` reports (:class:`LagReport`), and its JSON document, a stable interface for monitoring
(``schema_version`` changes only when a field is removed or changes meaning; new fields may appear;
:data:`JSON_SCHEMA` is its schema):

``schema_version`` (1), ``generated_at`` (ISO 8601 UTC), ``ok`` (false when a ``--max-*`` threshold is
exceeded), ``violations`` (list of strings), ``warnings`` (list of strings),
``source``: ``slot``, ``exists``, ``active``, ``wal_status``, ``safe_wal_size_bytes``,
``current_lsn``, ``confirmed_flush_lsn``, ``wal_bytes_behind``, ``retained_wal_bytes``, ``catalog_xmin_age``
(transactions since the slot's ``catalog_xmin``: how long it keeps the catalogs from being vacuumed),
``max_slot_wal_keep_size_bytes`` (null = unlimited), ``oldest_unconfirmed_age_seconds``,
``free_disk_bytes`` (null when the source's disk cannot be seen from here), ``server`` (``host:port``
of the server read, which a multi-host URL picks), ``role`` (``primary`` or ``standby``), ``failover``
(the slot's failover flag; null before PostgreSQL 17 or without the slot), ``synced_on_standby``
(whether ``CDC_STANDBY_URL``'s standby holds a synced, persistent copy of the slot; null without it),
``log``: ``watermark`` (null or ``lsn``, ``sequence``, ``appended_at``), ``partitions`` (list of
``topic``, ``partition``, ``end_offset``), ``read_again`` (the tables whose column list, row filter or
masks changed since the log read them: capture reads each again under its new rule), ``key_changed``
(the tables whose events are keyed by other columns since the log read them, a new primary key or
replica identity index: capture reads each again under its new key) and ``cancelled`` (the tables whose
read ``cdc snapshot --cancel`` stopped: capture leaves them out until they are asked for again),
``groups`` (embedded log only: per consumer group and topic it committed offsets of, ``group``, ``topic``,
``committed`` (records before its committed offsets), ``end`` (records before the end offsets at the
watermark) and ``lag`` (the records committed to the log that the group has not committed),
``views``: list of ``view``, ``tables``, ``as_of_lsn``, ``as_of_appended_at``, ``events_pending``,
``wal_bytes_behind``, ``seconds_behind``;
``tables``: list of ``table`` (its path below the views directory), ``views`` (the views that have it),
``files``, ``bytes`` (of its newest version), ``version`` (its newest Delta version),
``versions_since_compaction``, ``last_maintenance_at`` (when it was last compacted or vacuumed, ISO 8601;
null: never) and ``seconds_since_maintenance`` (null: never).

LSNs are PostgreSQL's ``X/Y`` text.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

SCHEMA_VERSION = 1


@dataclass
class SourceLag:
    """Source → log: the slot's position against the server's WAL."""

    slot: str
    exists: bool
    active: bool = False
    wal_status: str | None = None
    safe_wal_size_bytes: int | None = None
    current_lsn: str | None = None
    confirmed_flush_lsn: str | None = None
    wal_bytes_behind: int = 0
    retained_wal_bytes: int = 0
    #: transactions since the slot's catalog_xmin (None: no slot, or none held)
    catalog_xmin_age: int | None = None
    max_slot_wal_keep_size_bytes: int | None = None
    oldest_unconfirmed_age_seconds: float | None = None
    free_disk_bytes: int | None = None
    server: str = ""
    role: str = "primary"
    failover: bool | None = None
    synced_on_standby: bool | None = None


@dataclass
class PartitionEnd:
    topic: str
    partition: int
    end_offset: int


@dataclass
class GroupLag:
    """One consumer group on one topic (:mod:`log_store.consumer`): offsets summed over its partitions."""

    group: str
    topic: str
    committed: int
    end: int
    lag: int


@dataclass
class LogLag:
    """The log: end offsets at the latest commit watermark."""

    watermark: dict[str, Any] | None = None
    partitions: list[PartitionEnd] = field(default_factory=list)
    #: tables whose rule (column list, row filter, masks) changed since the log read them
    read_again: list[str] = field(default_factory=list)
    #: tables whose events are keyed by other columns since the log read them (:mod:`cdc.capture.key_marks`)
    key_changed: list[str] = field(default_factory=list)
    #: tables whose read was cancelled: capture leaves them out, the log lacks some of their rows
    cancelled: list[str] = field(default_factory=list)
    #: each consumer group of the embedded log, per topic
    groups: list[GroupLag] = field(default_factory=list)


@dataclass
class ViewLag:
    """Log → one view: what the view is as of and what it still has to apply."""

    view: str
    tables: int
    as_of_lsn: str | None
    as_of_appended_at: str | None
    events_pending: int
    wal_bytes_behind: int
    seconds_behind: float


@dataclass
class TableLag:
    """One view table's files, size, versions and last maintenance (read from its Delta log and its
    maintenance record, :mod:`derived_views.engine.table_health`)."""

    table: str
    """Its path below the views directory (``warehouse/current/public.orders``)."""
    views: list[str]
    files: int
    bytes: int
    version: int
    versions_since_compaction: int
    last_maintenance_at: str | None
    seconds_since_maintenance: float | None


@dataclass
class LagReport:
    schema_version: int
    generated_at: str
    source: SourceLag
    log: LogLag
    views: list[ViewLag]
    warnings: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    #: tables read beside the stream (:mod:`cdc.observe.read_status`): rows done, estimated, rate, time left
    reads: list[dict[str, Any]] = field(default_factory=list)
    #: every view table's files, size, versions and last maintenance
    tables: list[TableLag] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["ok"] = self.ok
        return data


_LSN = {"type": ["string", "null"], "pattern": "^[0-9A-F]+/[0-9A-F]+$"}
_INT = {"type": "integer", "minimum": 0}
_NULLABLE_INT = {"type": ["integer", "null"]}
_TIME = {"type": ["string", "null"]}

#: JSON Schema of ``cdc lag --json`` (draft 2020-12); tests validate real output against it.
JSON_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["schema_version", "generated_at", "ok", "source", "log", "views", "tables", "warnings", "violations"],
    "properties": {
        "schema_version": {"const": SCHEMA_VERSION},
        "generated_at": {"type": "string"},
        "ok": {"type": "boolean"},
        "warnings": {"type": "array", "items": {"type": "string"}},
        "reads": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["table", "rows", "estimated_rows", "rows_per_second", "eta_seconds"],
                "properties": {
                    "table": {"type": "string"},
                    "rows": _INT,
                    "estimated_rows": _NULLABLE_INT,
                    "rows_per_second": {"type": ["number", "null"], "minimum": 0},
                    "eta_seconds": {"type": ["number", "null"], "minimum": 0},
                },
            },
        },
        "violations": {"type": "array", "items": {"type": "string"}},
        "tables": {
            "type": "array",
            "items": {
                "type": "object",
                "required": [
                    "table",
                    "views",
                    "files",
                    "bytes",
                    "version",
                    "versions_since_compaction",
                    "last_maintenance_at",
                    "seconds_since_maintenance",
                ],
                "properties": {
                    "table": {"type": "string"},
                    "views": {"type": "array", "items": {"type": "string"}},
                    "files": _INT,
                    "bytes": _INT,
                    "version": _INT,
                    "versions_since_compaction": _INT,
                    "last_maintenance_at": _TIME,
                    "seconds_since_maintenance": {"type": ["number", "null"], "minimum": 0},
                },
            },
        },
        "source": {
            "type": "object",
            "required": [
                "slot",
                "exists",
                "active",
                "wal_status",
                "safe_wal_size_bytes",
                "current_lsn",
                "confirmed_flush_lsn",
                "wal_bytes_behind",
                "retained_wal_bytes",
                "max_slot_wal_keep_size_bytes",
                "oldest_unconfirmed_age_seconds",
                "free_disk_bytes",
                "server",
                "role",
                "failover",
                "synced_on_standby",
            ],
            "properties": {
                "slot": {"type": "string"},
                "exists": {"type": "boolean"},
                "active": {"type": "boolean"},
                "wal_status": {"type": ["string", "null"]},
                "safe_wal_size_bytes": _NULLABLE_INT,
                "current_lsn": _LSN,
                "confirmed_flush_lsn": _LSN,
                "wal_bytes_behind": _INT,
                "retained_wal_bytes": _INT,
                "catalog_xmin_age": _NULLABLE_INT,
                "max_slot_wal_keep_size_bytes": _NULLABLE_INT,
                "oldest_unconfirmed_age_seconds": {"type": ["number", "null"], "minimum": 0},
                "free_disk_bytes": _NULLABLE_INT,
                "server": {"type": "string"},
                "role": {"enum": ["primary", "standby"]},
                "failover": {"type": ["boolean", "null"]},
                "synced_on_standby": {"type": ["boolean", "null"]},
            },
            "additionalProperties": True,
        },
        "log": {
            "type": "object",
            "required": ["watermark", "partitions", "read_again", "cancelled"],
            "properties": {
                "watermark": {
                    "type": ["object", "null"],
                    "required": ["lsn", "sequence", "appended_at"],
                    "properties": {"lsn": _LSN, "sequence": _INT, "appended_at": _TIME},
                },
                "partitions": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["topic", "partition", "end_offset"],
                        "properties": {"topic": {"type": "string"}, "partition": _INT, "end_offset": _INT},
                    },
                },
                "read_again": {"type": "array", "items": {"type": "string"}},
                "key_changed": {"type": "array", "items": {"type": "string"}},
                "cancelled": {"type": "array", "items": {"type": "string"}},
            },
        },
        "views": {
            "type": "array",
            "items": {
                "type": "object",
                "required": [
                    "view",
                    "tables",
                    "as_of_lsn",
                    "as_of_appended_at",
                    "events_pending",
                    "wal_bytes_behind",
                    "seconds_behind",
                ],
                "properties": {
                    "view": {"type": "string"},
                    "tables": _INT,
                    "as_of_lsn": _LSN,
                    "as_of_appended_at": _TIME,
                    "events_pending": _INT,
                    "wal_bytes_behind": _INT,
                    "seconds_behind": {"type": "number", "minimum": 0},
                },
            },
        },
    },
}
