"""Peak RSS of a capture process that takes one N-row transaction, beside the 256 MB target.

Usage: python bench/capture_memory.py [rows]   (default 1,000,000). The capture runs in a child
process (``cdc capture --once``) so that its peak RSS is measured alone.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import psycopg

from bench.capture_common import bench_database, timed

TARGET_MB = 256


def main(rows: int) -> None:
    cdc = str(Path(sys.executable).with_name("cdc"))
    with bench_database() as (_, url, settings):
        env = {k: v for k, v in os.environ.items() if not k.startswith("CDC_")}
        env.update(CDC_DATABASE_URL=url, CDC_DATA_DIR=str(settings.data_dir), CDC_TABLES="public.bench")
        subprocess.run([cdc, "capture", "--once"], env=env, check=True, capture_output=True)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO bench (id, name, amount) SELECT g, 'name ' || g, g * 1.25 FROM generate_series(1, %s) g",
                (rows,),
            )
        with timed() as took:
            subprocess.run([cdc, "capture", "--once"], env=env, check=True, capture_output=True)
        peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        print(f"rows={rows} in one transaction, captured in {took[0]:.1f} s")
        print(f"peak RSS of capture : {peak_mb:>8.0f} MB")
        print(f"target              : {TARGET_MB:>8} MB")
        print(f"ratio               : {peak_mb / TARGET_MB:.2f} (target <= 1.0)")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000)
