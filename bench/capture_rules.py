"""What a publication's rules and masks cost capture, in one run on one table.

Usage: python bench/capture_rules.py [rows]   (default 500,000).

Each case is a capture of its own (its own slot and data directory) of table ``bench`` (``rows`` rows):
the snapshot, then ``rows`` more rows inserted in transactions of 1,000 and streamed.

* ``whole``: no rule (the anchor);
* ``masked``: ``name`` hashed (HMAC-SHA256) and ``amount`` truncated: the masking cost per row, in the
  snapshot and in the stream, is the difference to ``whole``;
* ``list+filter``: the column list ``(id, name)`` and the row filter ``id % 2 = 0``: the server reads every
  row and sends half of them, with two of four columns.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

from bench.capture_common import bench_database, timed
from cdc.capture.snapshot_writer import SnapshotWriter
from cdc.config.settings import Settings
from cdc.run.coordinator import Capture
from cdc.setup.capture_rules import apply_masks
from event_format.masks import Mask

KEY = "a benchmark mask key, long enough"


#: Seconds spent reading and writing snapshot rows: the initial snapshot reads every table beside the
#: stream, a chunk at a time (:meth:`SnapshotWriter.write_next` reads a chunk and appends it), and these
#: are the sums of those calls (the slot's creation, which waits for the transactions running then and
#: for the server's next snapshot record, up to 15 s, and the stream's passes between two chunks are not
#: counted)
WRITES: list[float] = []


def _timed_write(self: SnapshotWriter, *args: Any, **kwargs: Any) -> Any:
    start = time.perf_counter()
    try:
        return _WRITE(self, *args, **kwargs)
    finally:
        WRITES.append(time.perf_counter() - start)


_WRITE = SnapshotWriter.write_next
SnapshotWriter.write_next = _timed_write  # type: ignore[method-assign]


def _case(settings: Settings, url: str, name: str, rows: int, stream: bool) -> tuple[float, float, int, int]:
    """Snapshot seconds, stream seconds, rows snapshotted and rows streamed of one capture."""
    data_dir = Path(tempfile.mkdtemp(prefix=f"cdc-bench-{name}-"))
    slot = f"bench_{name.replace('+', '_')}"
    case = settings.model_copy(update={"data_dir": data_dir, "slot": slot})
    try:
        WRITES.clear()
        first = Capture(case, once=True).run()
        snapshot = sum(WRITES)
        streamed, stream_seconds = 0, 0.0
        if stream:
            _insert(url, rows)
            with timed() as streaming:
                second = Capture(case, once=True).run()
            streamed, stream_seconds = second.events, streaming[0]
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("DELETE FROM bench WHERE id > %s", (rows,))
        return snapshot, stream_seconds, first.snapshot_rows, streamed
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("SELECT pg_drop_replication_slot(%s) FROM pg_replication_slots WHERE slot_name = %s", (slot, slot))
        shutil.rmtree(data_dir, ignore_errors=True)


def _insert(url: str, rows: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        for first in range(rows + 1, 2 * rows + 1, 1000):
            conn.execute(
                "INSERT INTO bench (id, name, amount) SELECT g, 'name ' || g, g * 1.25 "
                "FROM generate_series(%s::bigint, %s::bigint) g",
                (first, min(first + 999, 2 * rows)),
            )


def main(rows: int) -> None:
    with bench_database() as (_server, url, settings):
        settings = settings.model_copy(update={"mask_key": settings.mask_key.__class__(KEY)})
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO bench (id, name, amount) SELECT g, 'name ' || g, g * 1.25 FROM generate_series(1, %s) g",
                (rows,),
            )
            conn.execute("VACUUM ANALYZE bench")
            conn.execute("ALTER TABLE bench SET (autovacuum_enabled = false)")  # no transaction for a slot to wait for
        masks: dict[str, dict[str, Mask]] = {"public.bench": {"name": Mask("hash"), "amount": Mask("truncate", length=3)}}

        def masked(conn: psycopg.Connection[Any]) -> None:
            apply_masks(conn, "cdc_publication", masks)

        def listed_and_filtered(conn: psycopg.Connection[Any]) -> None:
            apply_masks(conn, "cdc_publication", {})
            conn.execute("ALTER PUBLICATION cdc_publication SET TABLE bench (id, name) WHERE (id % 2 = 0)")

        cases: list[tuple[str, Callable[[psycopg.Connection[Any]], None], bool]] = [
            ("whole", lambda conn: None, True),
            ("masked", masked, True),
            ("list+filter", listed_and_filtered, False),
        ]
        results = {}
        for name, prepare, stream in cases:
            with psycopg.connect(url, autocommit=True) as conn:
                prepare(conn)
            results[name] = _case(settings, url, name, rows, stream)
        whole_snapshot, whole_stream, _, _ = results["whole"]
        print(f"rows={rows}")
        for name, (snapshot_s, stream_s, snapshotted, streamed) in results.items():
            line = f"{name:<12} snapshot {snapshotted:>9,} rows in {snapshot_s:6.2f} s = {rows / snapshot_s:>10,.0f} rows/s"
            line += f" (ratio to whole {whole_snapshot / snapshot_s:.2f})"
            if streamed:
                line += f"; stream {streamed:>9,} changes in {stream_s:6.2f} s (ratio to whole {whole_stream / stream_s:.2f})"
            print(line)
        masked_snapshot, masked_stream, _, _ = results["masked"]
        print(
            f"masking cost per row: snapshot {(masked_snapshot - whole_snapshot) / rows * 1e6:.2f} us, "
            f"stream {(masked_stream - whole_stream) / rows * 1e6:.2f} us (two masked columns of four)"
        )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 500_000)
