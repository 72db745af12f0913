"""The replication slot's health as Prometheus gauges, measured from PostgreSQL at each scrape.

Served by ``cdc lag --serve`` (:mod:`cdc.observe.lag_exporter`, which needs no running capture) and by capture's
own endpoint (:mod:`cdc.observe.metrics`), under the same names, each labelled by ``slot``:

=====================================  ===========================================================
``cdc_source_up``                      1 when the source answered this scrape, 0 when it could not be
                                       reached (then no other gauge of this collector is served)
``cdc_slot_exists``                    1 when the slot exists
``cdc_slot_active``                    1 while a process (capture) streams from the slot
``cdc_slot_retained_wal_bytes``        current WAL position minus the slot's ``restart_lsn``: the WAL
                                       PostgreSQL keeps on disk for the slot
``cdc_slot_wal_bytes_behind``          current WAL position minus the slot's ``confirmed_flush_lsn``
                                       (the log holds everything before it)
``cdc_slot_safe_wal_size_bytes``       WAL that may still be written before the slot is invalidated
                                       (absent while ``max_slot_wal_keep_size`` is unlimited)
``cdc_slot_wal_status``                1 for the slot's ``wal_status`` (label ``status``: ``reserved``,
                                       ``extended``, ``unreserved`` or ``lost``), 0 for the others
``cdc_slot_catalog_xmin_age``          transactions since the slot's ``catalog_xmin``: the catalog
                                       rows it keeps vacuum from removing
=====================================  ===========================================================

A standby has no current WAL position: what it replayed stands in (:func:`cdc.observe.source_lag.measure_source`).
Each scrape opens one short connection and runs a few catalog queries; it never decodes the WAL.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import psycopg
from prometheus_client.core import GaugeMetricFamily

from cdc.capture.errors import SourceError
from cdc.config.settings import Settings
from cdc.observe.lag_report import SourceLag
from cdc.observe.source_lag import measure_source

log = logging.getLogger("cdc.metrics")

#: every ``wal_status`` PostgreSQL reports for a slot
WAL_STATUSES = ("reserved", "extended", "unreserved", "lost")
#: seconds a scrape waits for the source's connection (below Prometheus's default scrape timeout of 10 s)
CONNECT_TIMEOUT_S = 5


def _gauge(name: str, documentation: str, *labels: str) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, labels=["slot", *labels])


def slot_families(source: SourceLag) -> Iterator[GaugeMetricFamily]:
    """The gauges of one measured slot."""
    slot = [source.slot]
    up = _gauge("cdc_source_up", "1 when the source PostgreSQL answered this scrape")
    up.add_metric(slot, 1)
    yield up
    exists = _gauge("cdc_slot_exists", "1 when the replication slot exists")
    exists.add_metric(slot, int(source.exists))
    yield exists
    if not source.exists:
        return
    figures = (
        ("cdc_slot_active", "1 while a process streams from the slot", int(source.active)),
        ("cdc_slot_retained_wal_bytes", "Current WAL position minus the slot's restart_lsn", source.retained_wal_bytes),
        ("cdc_slot_wal_bytes_behind", "Current WAL position minus the slot's confirmed_flush_lsn", source.wal_bytes_behind),
        ("cdc_slot_safe_wal_size_bytes", "WAL that may be written before the slot is invalidated", source.safe_wal_size_bytes),
        ("cdc_slot_catalog_xmin_age", "Transactions since the slot's catalog_xmin", source.catalog_xmin_age),
    )
    for name, documentation, value in figures:
        if value is not None:
            family = _gauge(name, documentation)
            family.add_metric(slot, value)
            yield family
    status = _gauge("cdc_slot_wal_status", "1 for the slot's wal_status, 0 for the others", "status")
    for name in WAL_STATUSES:
        status.add_metric([*slot, name], int(source.wal_status == name))
    yield status


class SlotCollector:
    """A collector that measures the slot the settings name at every scrape; a source that cannot be
    reached yields ``cdc_source_up`` 0 (and a warning line) instead of failing the scrape."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings

    def collect(self) -> Iterator[GaugeMetricFamily]:
        try:
            source = measure_source(self._settings, peek=False, connect_timeout=CONNECT_TIMEOUT_S)
        except (SourceError, psycopg.Error) as exc:  # down, or gone mid-scrape: the next scrape tries again
            log.warning("cannot measure the slot", extra={"fields": {"slot": self._settings.slot, "error": str(exc)}})
            up = _gauge("cdc_source_up", "1 when the source PostgreSQL answered this scrape")
            up.add_metric([self._settings.slot], 0)
            yield up
            return
        yield from slot_families(source)
