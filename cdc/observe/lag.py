"""How far behind each stage is: source → log, the log itself, and log → every view.

:func:`measure` gathers one :class:`~cdc.observe.lag_report.LagReport` (:mod:`cdc.observe.lag_report` says
what each field means); ``cdc lag`` prints it as a table or as JSON. The source's part is measured by
:mod:`cdc.observe.source_lag`.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from cdc.capture.errors import SourceError
from cdc.capture.lsn import Lsn
from cdc.config.settings import Settings
from cdc.observe.lag_report import SCHEMA_VERSION, GroupLag, LagReport, LogLag, PartitionEnd, TableLag, ViewLag
from cdc.observe.source_lag import measure_source

if TYPE_CHECKING:
    from cdc.capture.table_snapshots import SnapshotLedger
    from derived_views import ViewTable
    from log_store import LogStore, Watermark

_WARN_SAFE_FRACTION = 0.2


def _iso(ms: int | float | None) -> str | None:
    if not ms:
        return None
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


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
      key, another replica identity index, a key column renamed: :func:`cdc.capture.column_marks.key_changed`),
      as capture judges them (:meth:`cdc.capture.table_snapshots.SnapshotLedger.covers`)."""
    from cdc.capture.catalog import Catalog
    from cdc.capture.column_marks import key_changed
    from cdc.capture.published_tables import rule_of

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
