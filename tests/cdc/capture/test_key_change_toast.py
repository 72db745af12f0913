"""An update that changes a row's key and leaves a TOAST value unchanged keeps that value (promise 4).

Under the default replica identity pgoutput sends only the old key and marks the unchanged 100 kB
column 'u'; the create of the new key must still hold the whole value, whether the old row came from
the snapshot, an earlier group, an earlier event of the same transaction, or a partial update before.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import psycopg
import pytest

from cdc.run.coordinator import Capture
from event_format import fold_after
from log_store import LogConfig, LogStore
from tests.cdc.helpers import execute, read_topic, replay, settings_for

pytestmark = pytest.mark.pg

TOPIC = "cdc.public.docs"
#: ~100 kB of md5 text: incompressible, so it is stored out of line (TOAST)
BIG = "(SELECT string_agg(md5(g::text || '{seed}'), '') FROM generate_series(1, 3200) g)"


def _source(url: str) -> dict[bytes | None, dict[str, object]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT id, body, n FROM docs").fetchall()
    return {orjson.dumps({"id": i}): {"id": i, "body": body, "n": n} for i, body, n in rows}


def _creates(data_dir: Path) -> dict[int, tuple[dict[str, object], object]]:
    """The new keys' create events (op c after a delete in the same transaction), by id."""
    out: dict[int, tuple[dict[str, object], object]] = {}
    for record in read_topic(data_dir, TOPIC):
        if record.value is None:
            continue
        value = orjson.loads(record.value)
        if value["op"] == "c":
            out[value["after"]["id"]] = (value["after"], record.header("unchanged"))
    return out


def test_key_change_keeps_unchanged_toast_value(reference_db: str, tmp_path: Path) -> None:
    execute(
        reference_db,
        "CREATE TABLE docs (id int PRIMARY KEY, body text, n int)",
        "ALTER PUBLICATION cdc_publication ADD TABLE docs",
        f"INSERT INTO docs SELECT g, {BIG.format(seed='s')} || g, 0 FROM generate_series(1, 3) g",
    )
    settings = settings_for(reference_db, tmp_path)
    assert Capture(settings, once=True).run().snapshot_rows >= 3  # rows 1-3 come from the snapshot
    execute(reference_db, f"INSERT INTO docs SELECT g, {BIG.format(seed='t')} || g, 0 FROM generate_series(4, 6) g")
    Capture(settings, once=True).run()  # rows 4-6 are streamed in an earlier group
    with psycopg.connect(reference_db, autocommit=True) as conn:
        conn.execute("UPDATE docs SET n = 1 WHERE id = 5")  # a partial row (body unchanged) in the log
        with conn.transaction():
            conn.execute("UPDATE docs SET id = id + 100 WHERE id IN (1, 2, 3, 4)")  # snapshot and stream rows
            conn.execute("UPDATE docs SET n = 2 WHERE id = 6")  # a partial row earlier in the same transaction
            conn.execute("UPDATE docs SET id = 106 WHERE id = 6")
            conn.execute("UPDATE docs SET id = 105 WHERE id = 5")
            conn.execute("UPDATE docs SET id = 204 WHERE id = 104")  # the old key was created by this transaction
    stats = Capture(settings, once=True).run()
    assert stats.events > 0
    creates = _creates(tmp_path)
    source = _source(reference_db)
    for new_id in (101, 102, 103, 104, 105, 106, 204):
        after, unchanged = creates[new_id]
        assert unchanged is None, new_id
        expected = source.get(orjson.dumps({"id": new_id}))
        if expected is not None:
            assert after == expected, new_id
        assert len(str(after["body"])) == 3200 * 32 + len(str(new_id - 100 if new_id < 200 else 4)), new_id
    assert replay(tmp_path, TOPIC) == source
    with LogStore.open(tmp_path / "log", LogConfig(fold=fold_after), writer=True) as log:
        log.roll()
        log.compact()
    assert replay(tmp_path, TOPIC, strict=False) == source
