"""``cdc lag --serve PORT``: the slot's, the log's and the views' lag as Prometheus metrics, read from
PostgreSQL and the log alone.

It needs no running capture or sync, and loads neither Spark nor a JVM (listing the views reads their
Delta logs with ``deltalake``: :func:`cdc.config.view_arguments.listed_tables`), so it can run beside the source as
a small, always-on probe: the moment capture is down is the moment its own endpoint serves nothing.
Everything is measured when scraped; nothing is cached between scrapes.

Served at ``http://ADDRESS:PORT/metrics``, besides the slot's gauges (:mod:`cdc.observe.slot_metrics`):

==========================================  ========================================================
``cdc_log_up``                              1 when the log could be read this scrape, else 0 (and
                                            no other ``cdc_log_*`` or ``cdc_lag_view_*`` gauge)
``cdc_log_watermark_lsn``                   the latest commit watermark's LSN (absent before the first)
``cdc_log_watermark_timestamp_seconds``     when that watermark was appended (POSIX seconds)
``cdc_lag_view_events_pending``             events of the log the view has not applied (``view``)
``cdc_lag_view_wal_bytes_behind``           the log's watermark LSN minus the view's as-of LSN
``cdc_lag_view_seconds_behind``             commit time of the newest captured change minus the view's
``cdc_lag_view_synced``                     1 when every table of the view has synced (it has an as-of
                                            LSN), 0 while one has not
==========================================  ========================================================

How far the log is behind the source is ``cdc_slot_wal_bytes_behind``: capture confirms a position to
the slot only once the log holds everything before it. The figures are those of ``cdc lag``
(:func:`cdc.observe.lag.measure_log`, :func:`cdc.observe.lag.measure_views`), whose documentation states what each
means.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily

from cdc.capture.lsn import Lsn
from cdc.config.settings import Settings
from cdc.errors import CdcError
from cdc.observe.lag import measure_log, measure_views, ms_of_iso
from cdc.observe.metrics import serve
from cdc.observe.slot_metrics import SlotCollector

log = logging.getLogger("cdc.metrics")


def _unreadable() -> tuple[type[BaseException], ...]:
    """What reading the log or the views file may raise that the next scrape may not: the user's to fix."""
    from derived_views.errors import ViewError
    from log_store.errors import LogStoreError

    return (CdcError, LogStoreError, ViewError, OSError)


class PipelineCollector:
    """The log's watermark and each view's lag, measured at every scrape."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings

    def collect(self) -> Iterator[GaugeMetricFamily]:
        from cdc.config.view_arguments import listed_tables

        up = GaugeMetricFamily("cdc_log_up", "1 when the log (and the views file) could be read this scrape")
        try:
            lag = measure_log(self._settings, owed=False)
            views = measure_views(self._settings, lag, listed_tables(self._settings, lenient=True))
        except _unreadable() as exc:
            log.warning("cannot measure the log and the views", extra={"fields": {"error": str(exc)}})
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        if lag.watermark is not None and lag.watermark.get("lsn"):
            yield GaugeMetricFamily(
                "cdc_log_watermark_lsn", "The latest commit watermark's LSN", value=int(Lsn.parse(lag.watermark["lsn"]))
            )
            yield GaugeMetricFamily(
                "cdc_log_watermark_timestamp_seconds",
                "When the latest commit watermark was appended",
                value=ms_of_iso(lag.watermark.get("appended_at")) / 1000,
            )
        families = {
            "pending": GaugeMetricFamily("cdc_lag_view_events_pending", "Log events the view has not applied", labels=["view"]),
            "wal": GaugeMetricFamily(
                "cdc_lag_view_wal_bytes_behind", "The log's watermark LSN minus the view's as-of LSN", labels=["view"]
            ),
            "seconds": GaugeMetricFamily(
                "cdc_lag_view_seconds_behind",
                "Commit time of the newest captured change minus the view's as-of commit time",
                labels=["view"],
            ),
            "synced": GaugeMetricFamily("cdc_lag_view_synced", "1 when every table of the view has synced", labels=["view"]),
        }
        for view in views:
            families["pending"].add_metric([view.view], view.events_pending)
            families["wal"].add_metric([view.view], view.wal_bytes_behind)
            families["seconds"].add_metric([view.view], view.seconds_behind)
            families["synced"].add_metric([view.view], int(view.as_of_lsn is not None))
        yield from families.values()


def exporter_registry(settings: Settings) -> CollectorRegistry:
    """A registry with the slot's gauges and the log's and views' lag."""
    registry = CollectorRegistry()
    registry.register(SlotCollector(settings))
    registry.register(PipelineCollector(settings))
    return registry


def run(settings: Settings, port: int, address: str, stop: threading.Event) -> None:
    """Serve the metrics on ``address:port`` until ``stop`` is set."""
    server = serve(exporter_registry(settings), port, address)
    log.info("serving slot health", extra={"fields": {"url": f"http://{address}:{port}/metrics", "slot": settings.slot}})
    try:
        stop.wait()
    finally:
        if server is not None:
            server.shutdown()
