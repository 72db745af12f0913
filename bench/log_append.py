"""Benchmark of the log store: append, sequential scan and compaction, beside this disk's own rate.

Run: ``.venv/bin/python bench/log_append.py [--dir DIR] [--groups N]``. Prints figures, asserts nothing.

* append: 200-byte records (20-byte key, 180-byte value) in groups of 1,000, one ``append_group`` (so one
  fsync round) per group, to a one-partition topic and to a three-partition topic;
* anchor: what a plain append log with no log logic would do for the same data, in the same run and
  directory, interleaved with the log in rounds of 10 groups (so both see the same disk conditions):
  one file opened ``O_APPEND`` and grown by appends exactly as a segment is (no preallocation), and per
  group one ``write`` of as many bytes as the log's segment files grew by per group in that round
  (record bytes plus batch framing) followed by one ``fdatasync`` (the call the log's segments use; it
  flushes the file-size change too). The log's extra work per group - encoding, CRCs, the sparse index,
  the watermark record and its ``fdatasync`` beside the segments', publishing - is what the ratio
  measures. The ratio is log throughput / anchor throughput (target >= 0.5);
  The log's CPU time per group (``time.process_time``, this process's threads) is printed beside its
  wall time: unlike fsync latency it hardly depends on what else the machine's disk is doing, so it
  shows how much of the gap to the anchor is the log's own work;
* scan: reading the one-partition topic from offset 0 in reads of 10,000 records;
* compaction: 1,000,000 records over 100,000 keys, then one compaction pass.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

from log_store import LogConfig, LogStore, ProducerRecord, TopicPartition

RECORD_BYTES = 200
KEY_BYTES = 20
GROUP = 1_000


def make_groups(groups: int, keys: int, topic: str) -> list[list[ProducerRecord]]:
    """``groups`` lists of ``GROUP`` records cycling over ``keys`` keys."""
    value = b"v" * (RECORD_BYTES - KEY_BYTES)
    out: list[list[ProducerRecord]] = []
    n = 0
    for _ in range(groups):
        batch = []
        for _ in range(GROUP):
            key = b"%020d" % (n % keys)
            batch.append(ProducerRecord(topic, key, value, 1_700_000_000_000 + n))
            n += 1
        out.append(batch)
    return out


def bench_append(directory: Path, groups: int, partitions: int) -> tuple[float, int, float, float]:
    """(log seconds, bytes on disk, anchor seconds, log CPU seconds) for ``groups`` groups.

    The log and the anchor run interleaved in rounds of 10 groups, so that both see the same disk
    conditions (other load on the machine moves fsync latency a lot).
    """
    root = directory / f"append-{partitions}"
    data = make_groups(groups, 1 << 40, "bench")
    anchor_path = directory / "anchor.bin"
    anchor_fd = os.open(anchor_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
    log_s = anchor_s = log_cpu = 0.0
    written = 0
    with LogStore.open(root, LogConfig(), writer=True) as log:
        log.ensure_topic("bench", partitions, compacted=True)
        segments = root / "topics" / "bench"
        for first in range(0, groups, 10):
            start, cpu = time.perf_counter(), time.process_time()
            for i in range(first, min(first + 10, groups)):
                log.append_group(data[i], f"{i:016X}")
            log_s += time.perf_counter() - start
            log_cpu += time.process_time() - cpu
            on_disk = sum(p.stat().st_size for p in segments.rglob("*.log"))
            chunk = b"x" * ((on_disk - written) // max(1, min(10, groups - first)))
            start = time.perf_counter()
            for _ in range(first, min(first + 10, groups)):
                os.write(anchor_fd, chunk)
                os.fdatasync(anchor_fd)
            anchor_s += time.perf_counter() - start
            written = on_disk
    os.close(anchor_fd)
    anchor_path.unlink()
    return log_s, written, anchor_s, log_cpu


def bench_scan(directory: Path) -> tuple[float, int]:
    """(seconds, records) reading the one-partition append topic from offset 0."""
    log = LogStore.open(directory / "append-1")
    tp = TopicPartition("bench", 0)
    offset, count = 0, 0
    start = time.perf_counter()
    while True:
        records = log.read(tp, offset, max_records=10_000)
        if not records:
            break
        count += len(records)
        offset = records[-1].offset + 1
    elapsed = time.perf_counter() - start
    log.close()
    return elapsed, count


def bench_compaction(directory: Path, records: int, keys: int) -> tuple[float, float, int, int]:
    """(append seconds, compaction seconds, records read, records kept)."""
    root = directory / "compact"
    data = make_groups(records // GROUP, keys, "bench")
    with LogStore.open(root, LogConfig(segment_bytes=16 << 20), writer=True) as log:
        log.ensure_topic("bench", 1)
        start = time.perf_counter()
        for i, batch in enumerate(data):
            log.append_group(batch, f"{i:016X}")
        appended = time.perf_counter() - start
        log.roll()
        start = time.perf_counter()
        report = log.compact()
        compacted = time.perf_counter() - start
    return appended, compacted, report.records_read, report.records_kept


def main() -> None:
    """Run every benchmark once and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: a temp dir)")
    parser.add_argument("--groups", type=int, default=500, help="append groups of 1,000 records")
    parser.add_argument("--compact-records", type=int, default=1_000_000)
    parser.add_argument("--compact-keys", type=int, default=100_000)
    args = parser.parse_args()
    directory = Path(tempfile.mkdtemp(prefix="log-bench-", dir=args.dir))
    try:
        print(f"directory: {directory}")
        for partitions in (1, 3):
            log_s, on_disk, anchor_s, log_cpu = bench_append(directory, args.groups, partitions)
            n = args.groups * GROUP
            print(
                f"append {partitions} partition(s): {n / log_s:,.0f} records/s, "
                f"{on_disk / log_s / 1e6:,.1f} MB/s on disk, {args.groups / log_s:,.0f} groups/s, "
                f"{log_s / args.groups * 1e3:.3f} ms/group (CPU {log_cpu / args.groups * 1e3:.3f})"
            )
            print(
                f"  disk anchor (same {on_disk / 1e6:,.1f} MB, {args.groups} write+fdatasync rounds): "
                f"{on_disk / anchor_s / 1e6:,.1f} MB/s, {anchor_s / args.groups * 1e3:.3f} ms/group "
                f"-> ratio log/disk = {anchor_s / log_s:.2f} (target >= 0.5)"
            )
        scan_s, count = bench_scan(directory)
        print(f"sequential scan: {count:,} records in {scan_s:.2f} s = {count / scan_s:,.0f} records/s")
        appended, compacted, read, kept = bench_compaction(directory, args.compact_records, args.compact_keys)
        print(
            f"compaction: {read:,} records over {args.compact_keys:,} keys -> {kept:,} kept in "
            f"{compacted:.2f} s = {read / compacted:,.0f} records/s "
            f"(appending them took {appended:.2f} s)"
        )
    finally:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
