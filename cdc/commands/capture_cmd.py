"""``cdc capture``: snapshot if needed, then stream changes into the log until stopped (or ``--once``)."""

from __future__ import annotations

import signal
import threading
import time
from types import FrameType

import click

from cdc.capture.errors import SlotLostError
from cdc.commands.command_context import pass_context
from cdc.observe.metrics import CaptureMetrics, serve
from cdc.observe.slot_metrics import SlotCollector
from cdc.run.log_compactions import LogCompactions

#: a slot lost this often again after capture made it anew stops capture (``CDC_RECREATE_LOST_SLOT``)
_RECOVERY_WINDOW_S = 600.0


@click.command("capture")
@click.option("--once", is_flag=True, help="Drain up to the WAL position current at start, then exit.")
@click.option(
    "--snapshot-chunk-rows",
    type=click.IntRange(min=1),
    default=None,
    hidden=True,
    help="Rows per snapshot chunk; with this option each chunk of the initial snapshot is one group in the log.",
)
@pass_context
def capture(ctx: object, once: bool, snapshot_chunk_rows: int | None) -> None:
    """Capture changes exactly once into the log. SIGTERM/SIGINT: finish the batch, confirm, exit 0."""
    from cdc.run.coordinator import Capture  # heavy: imported when capturing, not by every `cdc` command
    from cdc.run.tuning import Tuning

    settings = ctx.settings  # type: ignore[attr-defined]
    stop = threading.Event()

    def _request_stop(signum: int, frame: FrameType | None) -> None:
        stop.set()

    metrics = CaptureMetrics()
    metrics.registry.register(SlotCollector(settings))  # the slot's health, as `cdc lag --serve` serves it
    server = serve(metrics.registry, settings.metrics_port)
    previous = {sig: signal.signal(sig, _request_stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    compactions = None
    if not once and not settings.uses_kafka and settings.log_compact_interval_s > 0:
        compactions = LogCompactions(settings.log_compact_interval_s).start()
    try:
        tuning = Tuning(snapshot_chunk_rows=snapshot_chunk_rows) if snapshot_chunk_rows else None
        recoveries: list[float] = []
        while True:
            try:
                stats = Capture(settings, once=once, stop=stop, metrics=metrics, tuning=tuning).run()
                break
            except SlotLostError:
                # CDC_RECREATE_LOST_SLOT: the next run makes the slot again (its warning says what is read
                # again); a slot lost three times within ten minutes is a stop (something else drops it)
                recoveries = [at for at in recoveries if time.monotonic() - at < _RECOVERY_WINDOW_S]
                if not settings.recreate_lost_slot or len(recoveries) >= 2 or stop.is_set():
                    raise
                recoveries.append(time.monotonic())
    finally:
        if compactions is not None:
            compactions.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if server is not None:
            server.shutdown()
    click.echo(
        f"captured {stats.events} events from {stats.transactions} transactions"
        f" ({stats.snapshot_rows} snapshot rows, {stats.skipped} already in the log, {stats.reconnects} reconnects)",
        err=True,
    )
    if stats.resnapshots:
        click.echo(
            "the replication slot did not continue the log (recreated or advanced elsewhere): every captured "
            "table is read again, superseding the log's rows",
            err=True,
        )
