"""Record the pgoutput messages a real server sends for a fixed workload into ``pgoutput_v2.jsonl``.

Run once against a server with ``wal_level=logical``: ``python tests/cdc/data/record_pgoutput.py URL``.
Each line holds the XLogData start LSN and the payload as hex; the decoder tests replay them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import psycopg

from cdc.capture.transport import ReplicationConnection, XLogData

WORKLOAD = [
    "CREATE TYPE mood AS ENUM ('sad', 'happy')",
    "CREATE DOMAIN posint AS integer CHECK (VALUE > 0)",
    """CREATE TABLE things (id bigint PRIMARY KEY, n numeric(12,2), f float8, b boolean, t text,
        ts timestamptz, d date, u uuid, j jsonb, by bytea, arr text[], m mood, p posint, big text)""",
    "CREATE TABLE nokey (a int, b text)",
    "CREATE PUBLICATION rec_pub FOR TABLE things, nokey",
    "SLOT",
    """INSERT INTO things VALUES (1, 19.90, 1.5, true, 'héllo', '2026-11-21 13:45:00.123456+02', '2026-11-21',
        '6f1c2b1e-0000-4000-8000-000000000001', '{"a": [1, 2]}', '\\xdeadbeef', ARRAY['x','y,z'], 'happy', 7,
        repeat('abcdefghij', 300))""",
    "UPDATE things SET n = 20.00 WHERE id = 1",
    "INSERT INTO nokey VALUES (1, 'a')",
    "ALTER TABLE things ADD COLUMN extra int",
    "UPDATE things SET extra = 5 WHERE id = 1",
    "ALTER TABLE things REPLICA IDENTITY FULL",
    "UPDATE things SET extra = 6 WHERE id = 1",
    "DELETE FROM things WHERE id = 1",
    "TRUNCATE things",
    "SELECT pg_logical_emit_message(true, 'pfx', 'hello')",
    "BIG",
]


def main(url: str, out: Path) -> None:
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute("DROP DATABASE IF EXISTS rec")
        admin.execute("CREATE DATABASE rec")
    db_url = url.rsplit("/", 1)[0] + "/rec"
    repl = None
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("SET logical_decoding_work_mem = '64kB'")
        for statement in WORKLOAD:
            if statement == "SLOT":
                repl = ReplicationConnection(db_url)
                repl.create_slot("rec_slot", export_snapshot=False)
            elif statement == "BIG":
                with conn.transaction():
                    conn.execute("INSERT INTO things (id, t) SELECT g, 'row ' || g FROM generate_series(10, 3009) g")
                    conn.execute("INSERT INTO nokey VALUES (2, 'b')")
            else:
                conn.execute(statement)
    assert repl is not None
    conn = psycopg.connect(url, autocommit=True)
    conn.execute("ALTER SYSTEM SET logical_decoding_work_mem = '64kB'")
    conn.execute("SELECT pg_reload_conf()")
    repl.start("rec_slot", 0, "rec_pub", proto_version=2, streaming=True)  # type: ignore[arg-type]
    lines = []
    while (frame := repl.read(3.0)) is not None:  # until the server has been idle for 3 s
        if isinstance(frame, XLogData):
            lines.append(json.dumps({"lsn": frame.data_start, "hex": frame.payload.hex()}))
    repl.close()
    conn.execute("ALTER SYSTEM RESET logical_decoding_work_mem")
    conn.execute("SELECT pg_reload_conf()")
    conn.close()
    out.write_text("\n".join(lines) + "\n")
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute("SELECT pg_drop_replication_slot('rec_slot')")
        admin.execute("DROP DATABASE rec")
    print(f"recorded {len(lines)} messages into {out}")


if __name__ == "__main__":
    main(sys.argv[1], Path(__file__).with_name("pgoutput_v2.jsonl"))
