"""How far behind each stage is: source → log, the log itself, and log → every view.

:func:`measure` gathers one :class:`LagReport`; ``cdc lag`` prints it as a table or as JSON. The JSON
document is a stable interface for monitoring (``schema_version`` changes only when a field is removed
or changes meaning; new fields may appear):

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

LSNs are PostgreSQL's ``X/Y`` text. The age of the oldest unconfirmed change is the commit time of the
first transaction after the slot's confirmed position, read by peeking the slot when no capture process
holds it; while capture streams, PostgreSQL's own ``flush_lag`` of the walsender stands in for it.
"""

from __future__ import annotations

import shutil
import struct
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg

from cdc.capture.errors import SourceError, connection_failure
from cdc.capture.lsn import Lsn
from cdc.capture.transport.framing import PG_EPOCH_OFFSET_US
from cdc.config.redact import redact_url
from cdc.config.settings import Settings
from cdc.setup.failover import FAILOVER_SERVER, standby_facts

if TYPE_CHECKING:
    from cdc.capture.table_snapshots import SnapshotLedger
    from derived_views import ViewTable
    from log_store import LogStore, Watermark

SCHEMA_VERSION = 1
_WARN_SAFE_FRACTION = 0.2


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


def _iso(ms: int | float | None) -> str | None:
    if not ms:
        return None
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _size_setting(conn: psycopg.Connection[Any], name: str) -> int | None:
    """A size GUC in bytes (``-1`` -> None, meaning unlimited)."""
    row = conn.execute("SELECT setting::bigint, unit FROM pg_settings WHERE name = %s", (name,)).fetchone()
    if row is None or row[0] < 0:
        return None
    units = {"B": 1, "kB": 1024, "8kB": 8192, "MB": 1 << 20, "GB": 1 << 30}
    return int(row[0]) * units.get(row[1] or "B", 1)


def _oldest_unconfirmed_age(conn: psycopg.Connection[Any], slot: str, publication: str) -> float | None:
    """Seconds since the commit of the first transaction the slot has not confirmed (0: nothing pending).

    Peeking decodes without consuming: the slot's position does not move.
    """
    row = conn.execute(
        "SELECT data FROM pg_logical_slot_peek_binary_changes(%s, NULL, 1, "
        "'proto_version', '1', 'publication_names', %s) LIMIT 1",
        (slot, publication),
    ).fetchone()
    if row is None:
        return 0.0  # the WAL behind the slot holds no change of a published table
    data = bytes(row[0])
    if data[:1] != b"B" or len(data) < 21:
        return None
    _final_lsn, commit_us, _xid = struct.unpack_from(">QqI", data, 1)
    return max(0.0, time.time() - (commit_us + PG_EPOCH_OFFSET_US) / 1_000_000)


def measure_source(settings: Settings, *, peek: bool = True, connect_timeout: int = 10) -> SourceLag:
    """Query the slot; a source that cannot be reached raises :class:`SourceError`.

    ``peek``: while no capture holds the slot, find the age of its oldest unconfirmed change by decoding
    from it (:func:`_oldest_unconfirmed_age`). That decodes the WAL from the slot's restart position, so a
    caller asking often (a metrics scrape) passes ``False`` and the age is left unknown.
    """
    lag = SourceLag(slot=settings.slot, exists=False)
    try:
        conn = psycopg.connect(settings.database_url, autocommit=True, connect_timeout=connect_timeout)
    except psycopg.OperationalError as exc:
        reason = connection_failure(exc)
        raise SourceError(
            f"cannot reach the source {settings.safe_database_url()}: {redact_url(reason)}; check CDC_DATABASE_URL"
        ) from None
    with conn:
        lag.server = f"{conn.info.host}:{conn.info.port}"
        in_recovery, position = conn.execute(  # a standby has no current WAL position: what it replayed stands in
            "SELECT pg_is_in_recovery(), (CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() "
            "ELSE pg_current_wal_lsn() END)::text"
        ).fetchone()  # type: ignore[misc]
        lag.role = "standby" if in_recovery else "primary"
        current = Lsn.parse(position or "0/0")
        lag.current_lsn = str(current)
        if conn.info.server_version >= FAILOVER_SERVER:
            flag = conn.execute("SELECT failover FROM pg_replication_slots WHERE slot_name = %s", (settings.slot,)).fetchone()
            lag.failover = None if flag is None else bool(flag[0])
        if settings.standby_url:
            standby = standby_facts(settings.standby_url, settings.slot)  # after a promotion it is no standby
            lag.synced_on_standby = bool(standby.slot_synced) if standby.in_recovery else None
        lag.max_slot_wal_keep_size_bytes = _size_setting(conn, "max_slot_wal_keep_size")
        row = conn.execute(
            "SELECT active, wal_status, safe_wal_size, confirmed_flush_lsn::text, restart_lsn::text, age(catalog_xmin) "
            "FROM pg_replication_slots WHERE slot_name = %s",
            (settings.slot,),
        ).fetchone()
        if row is None:
            return lag
        active, wal_status, safe_wal_size, confirmed, restart, xmin_age = row
        lag.exists, lag.active, lag.wal_status = True, bool(active), wal_status
        lag.catalog_xmin_age = int(xmin_age) if xmin_age is not None else None
        lag.safe_wal_size_bytes = int(safe_wal_size) if safe_wal_size is not None else None
        if confirmed:
            lag.confirmed_flush_lsn = confirmed
            lag.wal_bytes_behind = max(0, current - Lsn.parse(confirmed))
        if restart:
            lag.retained_wal_bytes = max(0, current - Lsn.parse(restart))
        if peek and lag.wal_bytes_behind and not lag.active and wal_status != "lost":
            try:
                lag.oldest_unconfirmed_age_seconds = _oldest_unconfirmed_age(conn, settings.slot, settings.publication)
            except psycopg.Error:
                lag.oldest_unconfirmed_age_seconds = None
        elif lag.active:
            flush_lag = conn.execute(
                "SELECT extract(epoch FROM r.flush_lag) FROM pg_stat_replication r "
                "JOIN pg_replication_slots s ON s.active_pid = r.pid WHERE s.slot_name = %s",
                (settings.slot,),
            ).fetchone()
            if flush_lag and flush_lag[0] is not None and lag.wal_bytes_behind:
                lag.oldest_unconfirmed_age_seconds = float(flush_lag[0])
        if lag.wal_bytes_behind == 0:
            lag.oldest_unconfirmed_age_seconds = 0.0
        lag.free_disk_bytes = _source_free_disk(conn)
    return lag


def _source_free_disk(conn: psycopg.Connection[Any]) -> int | None:
    """Free bytes on the source's data directory when it is on this machine and visible to us."""
    try:
        row = conn.execute("SELECT current_setting('data_directory')").fetchone()
    except psycopg.Error:
        return None
    if not row or not Path(row[0]).exists():
        return None
    try:
        return shutil.disk_usage(row[0]).free
    except OSError:
        return None


def measure_log(settings: Settings, *, owed: bool = True) -> LogLag:
    """End offsets at the latest watermark (an absent embedded log is an empty one).

    ``owed``: also ask the source which tables capture reads again (:func:`_reads_owed`)."""
    from cdc.capture.table_snapshots import SnapshotLedger
    from cdc.config.log_backend import open_log
    from log_store import LogStore, TopicPartition

    lag = LogLag()
    if not settings.uses_kafka and not settings.log_dir.exists():
        return lag
    with open_log(settings) as store:
        watermark = store.latest_watermark()
        if watermark is None:
            return lag
        lag.watermark = {
            "lsn": str(Lsn.from_hex16(watermark.position)) if watermark.position else None,
            "sequence": watermark.sequence,
            "appended_at": _iso(watermark.timestamp_ms),
        }
        for topic in store.topics():
            for partition in range(store.partitions(topic)):
                lag.partitions.append(PartitionEnd(topic, partition, watermark.end_offset(TopicPartition(topic, partition))))
        if isinstance(store, LogStore):
            lag.groups = _group_lags(store, watermark)
        topic = f"{settings.topic_prefix}.__snapshots"
        if topic in store.topics():
            ledger = SnapshotLedger.load(store, topic)
            if owed:
                lag.read_again, lag.key_changed = _reads_owed(settings, ledger)
            lag.cancelled = sorted(ledger.cancelled)
    return lag


def _group_lags(store: LogStore, watermark: Watermark) -> list[GroupLag]:
    """Every consumer group's committed offsets against the watermark's ends, per topic."""
    out: list[GroupLag] = []
    for group in store.consumer_groups():
        per_topic: dict[str, tuple[int, int, int]] = {}
        for tp, offset in store.committed_offsets(group).items():
            end = watermark.end_offset(tp)
            committed, ends, behind = per_topic.get(tp.topic, (0, 0, 0))
            per_topic[tp.topic] = (committed + offset, ends + end, behind + max(0, end - offset))
        out += [GroupLag(group, topic, *figures) for topic, figures in sorted(per_topic.items())]
    return out


def ledger_reads(settings: Settings) -> tuple[dict[str, int], list[str]]:
    """The LSN capture's latest read of each table is as of (by log name, from the log's snapshot ledger),
    and the tables whose rule changed since that read (:func:`_reads_owed`: capture reads them again)."""
    from cdc.capture.table_snapshots import SnapshotLedger
    from cdc.config.log_backend import open_log

    if not settings.uses_kafka and not settings.log_dir.exists():
        return {}, []
    with open_log(settings) as store:
        topic = f"{settings.topic_prefix}.__snapshots"
        if topic not in store.topics():
            return {}, []
        ledger = SnapshotLedger.load(store, topic)
    return {name: entry.lsn for name, entry in ledger.entries.items()}, _reads_owed(settings, ledger)[0]


def _reads_owed(settings: Settings, ledger: SnapshotLedger) -> tuple[list[str], list[str]]:
    """The published tables capture reads again, by why (a source that cannot be reached: none):

    - those whose rule digest (column list, row filter, masks: see
      :meth:`cdc.capture.catalog.Catalog.published_tables`) differs from the one the log's snapshot
      ledger holds for them;
    - those whose events are keyed by other columns than when the ledger recorded them (a new primary
      key, another replica identity index, a key column renamed: :func:`cdc.capture.catalog.key_changed`),
      as capture judges them (:meth:`cdc.capture.table_snapshots.SnapshotLedger.covers`)."""
    from cdc.capture.catalog import Catalog, key_changed, rule_of

    catalog = Catalog(settings.database_url, publication=settings.publication, mask_key=settings.mask_key_bytes)
    try:
        tables = catalog.published_tables(settings.publication)
    except SourceError:
        return [], []
    finally:
        catalog.close()
    rules, keys = [], []
    for table in tables:
        entry = ledger.entries.get(table.log_name)
        if entry is None:
            continue
        if entry.membership is not None and rule_of(entry.membership) != rule_of(table.membership):
            rules.append(table.qualified)
        if entry.columns is not None and key_changed(entry.columns, table.columns):
            keys.append(table.qualified)
    return sorted(rules), sorted(keys)


def measure_views(settings: Settings, log: LogLag, listed: list[ViewTable]) -> list[ViewLag]:
    """Per view, the least advanced of its tables against the log's latest watermark.

    Every table the view has over the captured tables counts (``listed``, see
    :func:`cdc.config.view_arguments.listed_tables`): one not synced yet leaves the view without an as-of LSN, with
    every event of its topics pending, and at least as far behind as its least advanced synced table."""
    from derived_views import tables_of
    from derived_views.definitions import load

    ends = {(p.topic, p.partition): p.end_offset for p in log.partitions}
    latest = log.watermark or {}
    latest_lsn = Lsn.parse(latest["lsn"]) if latest.get("lsn") else Lsn(0)
    latest_ms = ms_of_iso(latest.get("appended_at"))
    out: list[ViewLag] = []
    for view in load(settings.views_file).view_names():
        tables = tables_of(listed, view)
        if not tables:
            continue
        applied: dict[tuple[str, int], int] = {}
        for table in tables:
            for topic, partition in ends:
                if topic in table.topics:
                    offset = table.progress.next_offset(topic, str(partition))
                    applied[topic, partition] = min(applied.get((topic, partition), offset), offset)
        pending = sum(max(0, ends.get(key, 0) - offset) for key, offset in applied.items())
        synced = [table.progress for table in tables if table.progress.position]
        slowest = min(synced, key=lambda progress: progress.lsn, default=None)
        whole = slowest is not None and len(synced) == len(tables)
        oldest_ms = slowest.watermark_ts_ms if slowest is not None else latest_ms
        as_of = Lsn(slowest.lsn if slowest is not None else 0)
        out.append(
            ViewLag(
                view=view,
                tables=len(tables),
                as_of_lsn=str(as_of) if whole else None,
                as_of_appended_at=_iso(oldest_ms) if whole else None,
                events_pending=pending,
                wal_bytes_behind=max(0, latest_lsn - as_of) if pending and slowest is not None else 0,
                seconds_behind=max(0.0, (latest_ms - oldest_ms) / 1000) if pending else 0.0,
            )
        )
    return out


def measure_tables(settings: Settings, listed: list[ViewTable]) -> list[TableLag]:
    """Each view table of ``listed`` that exists, once (with every view that has it), with its health."""
    root = str(settings.views_dir.resolve()).rstrip("/") + "/"
    now = time.time()
    out: dict[str, TableLag] = {}
    for table in listed:
        health = table.health
        if health is None:
            continue
        name = table.path.removeprefix(root)
        if name in out:
            out[name].views.append(table.view)
            continue
        out[name] = TableLag(
            name,
            [table.view],
            health.files,
            health.bytes,
            health.version,
            health.versions_since_compaction,
            health.last_maintenance_at,
            health.seconds_since_maintenance(now),
        )
    return list(out.values())


def ms_of_iso(iso: str | None) -> int:
    if not iso:
        return 0
    return int(datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() * 1000)


def measure(settings: Settings, *, max_lag_seconds: float | None = None, max_wal_bytes: int | None = None) -> LagReport:
    """One report over every stage, with warnings and threshold violations filled in."""
    from cdc.config.view_arguments import listed_tables
    from log_store.errors import LogStoreError

    source = measure_source(settings)
    unreadable = None
    try:
        log = measure_log(settings)
    except LogStoreError as exc:  # Kafka down: the source's lag still shows, and says why capture is stuck
        log, unreadable = LogLag(), exc
    # a view's tables are listed from the captured topics, which an unreadable log cannot tell
    listed = listed_tables(settings, lenient=True, health=True) if unreadable is None else []
    views = measure_views(settings, log, listed) if unreadable is None else []
    report = LagReport(SCHEMA_VERSION, _iso(time.time() * 1000) or "", source, log, views)
    report.tables = measure_tables(settings, listed)
    if unreadable is not None:
        report.violations.append(f"the log cannot be read: {unreadable}")
    else:
        from cdc.observe.read_status import read_status

        try:
            report.reads = read_status(settings)
        except LogStoreError:  # no log yet: nothing is read
            report.reads = []
    _warn(report)
    from derived_views import read_failures as read_all

    # a table whose batch failed falls behind while the rest of its view moves on: never ok
    report.violations.extend(failure.line() for failure in read_all(settings.views_dir))
    if max_wal_bytes is not None and source.wal_bytes_behind > max_wal_bytes:
        report.violations.append(f"slot {source.slot} is {source.wal_bytes_behind} WAL bytes behind (limit {max_wal_bytes})")
    if max_lag_seconds is not None:
        age = source.oldest_unconfirmed_age_seconds or 0.0
        if age > max_lag_seconds:
            report.violations.append(f"oldest unconfirmed change is {age:.1f}s old (limit {max_lag_seconds:g}s)")
        for view in views:
            if view.seconds_behind > max_lag_seconds:
                report.violations.append(f"view {view.view} is {view.seconds_behind:.1f}s behind (limit {max_lag_seconds:g}s)")
    return report


def _warn(report: LagReport) -> None:
    report.warnings.extend(
        f"{table}: its column list, row filter or masks changed; capture reads it again under the new rule "
        "(until then the log holds it under the old one)"
        for table in report.log.read_again
    )
    report.warnings.extend(
        f"{table}: its primary key or replica identity index changed; capture reads it again under the new key, "
        "with a tombstone for every key the log holds (until then a view may hold a row changed since under both keys)"
        for table in report.log.key_changed
    )
    report.warnings.extend(
        f"{table}: its read was cancelled (cdc snapshot --cancel); capture leaves it out and its views lack "
        f"changes until `cdc snapshot {table}` reads it whole again"
        for table in report.log.cancelled
    )
    source = report.source
    if not source.exists:
        report.warnings.append(f"slot {source.slot} does not exist: run `cdc setup`")
        return
    if source.wal_status in ("unreserved", "lost"):
        report.warnings.append(
            f"slot {source.slot} wal_status is {source.wal_status}: WAL it needs is "
            f"{'gone' if source.wal_status == 'lost' else 'about to be removed'}"
        )
    if source.exists and source.synced_on_standby is False:
        report.warnings.append(
            f"slot {source.slot} is not synced to the standby (CDC_STANDBY_URL): a failover now would lose it, and "
            "capture would re-read the tables after `cdc setup`"
        )
    keep = source.max_slot_wal_keep_size_bytes
    if keep and source.safe_wal_size_bytes is not None and source.safe_wal_size_bytes < keep * _WARN_SAFE_FRACTION:
        report.warnings.append(
            f"retained WAL is near max_slot_wal_keep_size: {source.safe_wal_size_bytes} bytes left before "
            "the slot is invalidated; start or speed up capture"
        )
    if keep is None and source.free_disk_bytes is not None and source.retained_wal_bytes > source.free_disk_bytes / 2:
        report.warnings.append(
            f"the slot retains {source.retained_wal_bytes} WAL bytes, over half the source's free disk "
            f"({source.free_disk_bytes} bytes), and max_slot_wal_keep_size is unlimited"
        )


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
