"""A parent by plain inheritance (``INHERITS``) is read as PostgreSQL publishes it: its own rows only, each
child a table of its own, in the initial snapshot, in a read beside the stream and in ``cdc verify``'s
read of the source; a partitioned table published via its root still reads its leaf partitions."""

from __future__ import annotations

from pathlib import Path

import orjson
import psycopg
import pytest

from cdc.run.coordinator import Capture
from derived_views.events.schema import Column, TableSchema
from derived_views.runs.verify_values import SESSION_OPTIONS
from tests.cdc.helpers import execute, replay, settings_for
from tests.rows import compare_rows, source_rows

pytestmark = pytest.mark.pg


def _ids(rows: dict[bytes | None, dict[str, object]]) -> list[object]:
    return sorted(row["id"] for row in rows.values())


def test_a_parent_holds_its_own_rows_and_each_child_its_own(pg_url: str, tmp_path: Path) -> None:
    execute(
        pg_url,
        "CREATE TABLE parent (id int PRIMARY KEY, v text)",
        "CREATE TABLE child (extra int) INHERITS (parent)",
        "ALTER TABLE child ADD PRIMARY KEY (id)",
        "CREATE TABLE later (id int PRIMARY KEY, v text)",
        "CREATE TABLE later_child () INHERITS (later)",
        "ALTER TABLE later_child ADD PRIMARY KEY (id)",
        "CREATE TABLE part (id int PRIMARY KEY, v text) PARTITION BY RANGE (id)",
        "CREATE TABLE part_low PARTITION OF part FOR VALUES FROM (0) TO (100)",
        "CREATE TABLE part_high PARTITION OF part FOR VALUES FROM (100) TO (1000)",
        "INSERT INTO parent VALUES (1, 'p1'), (2, 'p2')",
        "INSERT INTO child VALUES (10, 'c10', 7), (11, 'c11', 8)",
        "INSERT INTO later VALUES (1, 'l1')",
        "INSERT INTO later_child VALUES (20, 'lc20')",
        "INSERT INTO part VALUES (1, 'low'), (500, 'high')",
        # without ONLY the publication takes each child too, as a table of its own
        "CREATE PUBLICATION cdc_publication FOR TABLE parent, part WITH (publish_via_partition_root = true)",
    )
    settings = settings_for(pg_url, tmp_path)
    Capture(settings, once=True).run()  # the initial snapshot: block ranges
    assert _ids(replay(tmp_path, "cdc.public.parent")) == [1, 2]
    assert _ids(replay(tmp_path, "cdc.public.child")) == [10, 11]
    assert _ids(replay(tmp_path, "cdc.public.part")) == [1, 500]

    execute(pg_url, "ALTER PUBLICATION cdc_publication ADD TABLE later", "INSERT INTO later_child VALUES (21, 'lc21')")
    assert Capture(settings, once=True).run().tables_added == 2  # read beside the stream, by key
    assert _ids(replay(tmp_path, "cdc.public.later")) == [1]
    assert _ids(replay(tmp_path, "cdc.public.later_child")) == [20, 21]

    # verify reads the parent's own rows: a view holding a child's rows too differs
    schema = TableSchema("public", "parent", "cdc.public.parent", (Column("id", "int4", key=True), Column("v", "text")))
    with psycopg.connect(pg_url, options=SESSION_OPTIONS) as conn:
        source = source_rows(conn, schema)
        partitioned = source_rows(conn, TableSchema("public", "part", "cdc.public.part", schema.columns))
    assert sorted(row["id"] for row in source) == [1, 2]
    assert sorted(row["id"] for row in partitioned) == [1, 500]
    view = [orjson.loads(orjson.dumps(row)) for row in replay(tmp_path, "cdc.public.parent").values()]
    assert compare_rows("public.parent", schema, source, view) == []
    with_child = [*view, {"id": 10, "v": "c10"}]
    assert compare_rows("public.parent", schema, source, with_child) != []
