"""The warnings of ``cdc lag``: WAL retention near its limit or the source's free disk, lost slots."""

from __future__ import annotations

from cdc.observe.lag import _warn
from cdc.observe.lag_report import LagReport, LogLag, SourceLag

GB = 1 << 30


def _report(**source: object) -> LagReport:
    base: dict[str, object] = {"slot": "s", "exists": True, "wal_status": "reserved"}
    return LagReport(1, "now", SourceLag(**{**base, **source}), LogLag(), [])  # type: ignore[arg-type]


def test_no_warning_when_far_from_every_limit() -> None:
    report = _report(max_slot_wal_keep_size_bytes=10 * GB, safe_wal_size_bytes=9 * GB, retained_wal_bytes=GB)
    _warn(report)
    assert report.warnings == []


def test_warns_near_max_slot_wal_keep_size() -> None:
    report = _report(max_slot_wal_keep_size_bytes=10 * GB, safe_wal_size_bytes=GB)
    _warn(report)
    assert len(report.warnings) == 1 and "max_slot_wal_keep_size" in report.warnings[0]


def test_warns_when_unlimited_retention_nears_free_disk() -> None:
    report = _report(max_slot_wal_keep_size_bytes=None, retained_wal_bytes=6 * GB, free_disk_bytes=10 * GB)
    _warn(report)
    assert len(report.warnings) == 1 and "free disk" in report.warnings[0]


def test_warns_about_a_lost_slot() -> None:
    report = _report(wal_status="lost")
    _warn(report)
    assert "gone" in report.warnings[0]
