"""``ALTER COLUMN ... TYPE`` that rewrites the stored values (a numeric's scale, a varchar's length, a
timestamp's precision) has the table read again, so the log holds the values the source holds now; a
change that rewrites nothing (a longer varchar) needs no read. Types changed there and back while
capture streams (the values rounded on the way) are caught too."""

from __future__ import annotations

import threading
from pathlib import Path

import psycopg
import pytest

from cdc.run.coordinator import Capture
from cdc.run.tuning import Tuning
from tests.cdc.helpers import execute, replay, settings_for, wait_for

pytestmark = pytest.mark.pg

COLUMNS = ("num_val", "s", "ts")


def _created(url: str, data_dir: Path) -> Capture:
    execute(
        url,
        "CREATE TABLE retyped (id int PRIMARY KEY, num_val numeric(5, 2), s varchar(10), ts timestamp(6))",
        "INSERT INTO retyped VALUES (1, 123.45, 'abcdefghij', '2020-01-01 00:00:00.654321'), (2, -1.5, 'xy', '2020-01-01')",
        "ALTER PUBLICATION cdc_publication ADD TABLE retyped",
    )
    settings = settings_for(url, data_dir, tables="public.retyped")
    Capture(settings, once=True).run()
    return Capture(settings, once=True)


@pytest.mark.parametrize(
    ("statement", "read_again"),
    [
        ("ALTER TABLE retyped ALTER COLUMN num_val TYPE numeric(12, 4)", True),
        ("ALTER TABLE retyped ALTER COLUMN num_val TYPE numeric(12)", True),  # 123.45 -> 123
        ("ALTER TABLE retyped ALTER COLUMN num_val TYPE numeric", False),  # the values stay as they are
        ("ALTER TABLE retyped ALTER COLUMN s TYPE varchar(4) USING s::varchar(4)", True),  # cut to 4 characters
        ("ALTER TABLE retyped ALTER COLUMN s TYPE varchar(20)", False),
        ("ALTER TABLE retyped ALTER COLUMN ts TYPE timestamp(0)", True),  # rounded to the second
        ("ALTER TABLE retyped ALTER COLUMN num_val TYPE numeric(5, 2) USING num_val * 2", True),  # the same type
    ],
    ids=[
        "numeric-scale-up",
        "numeric-scale-to-0",
        "numeric-unconstrained",
        "varchar-cut",
        "varchar-longer",
        "timestamp-0",
        "same-type-using",
    ],
)
def test_a_type_change_that_rewrites_values_has_the_table_read_again(
    reference_db: str, tmp_path: Path, statement: str, read_again: bool
) -> None:
    capture = _created(reference_db, tmp_path)
    execute(reference_db, statement)
    assert capture.run().tables_added == (1 if read_again else 0)
    assert _logged(tmp_path) == _source(reference_db)


def test_types_changed_there_and_back_while_streaming_have_the_table_read_again(reference_db: str, tmp_path: Path) -> None:
    """``numeric`` -> ``numeric(12,4)`` -> ``numeric(12)`` -> ``numeric`` between two looks at the catalog
    ends on the type it started from, but 123.4567 is 123 now: the table is read again."""
    settings = settings_for(reference_db, tmp_path, tables="public.retyped")
    _created(reference_db, tmp_path)
    stop = threading.Event()
    # no periodic discovery: only the column changes the stream carries look at the catalog
    capture = Capture(settings, stop=stop, tuning=Tuning(discover_seconds=3600))
    running = threading.Thread(target=capture.run)
    running.start()
    try:
        execute(
            reference_db,
            "ALTER TABLE retyped ALTER COLUMN num_val TYPE numeric",  # rewrites nothing: no read
            "UPDATE retyped SET num_val = 123.4567 WHERE id = 1",
        )
        # the look after that change saw the column as numeric (its typmod -1)
        wait_for(lambda: _logged(tmp_path) == _source(reference_db), what="the update")
        wait_for(lambda: ":1700:-1:" in _marks(capture), what="the catalog looked at")
        execute(
            reference_db,
            "ALTER TABLE retyped ALTER COLUMN num_val TYPE decimal(12, 4); INSERT INTO retyped (id, num_val) VALUES (4, 2.48); "
            "ALTER TABLE retyped ALTER COLUMN num_val TYPE decimal(12); INSERT INTO retyped (id, num_val) VALUES (5, 1238); "
            "ALTER TABLE retyped ALTER COLUMN num_val TYPE decimal; INSERT INTO retyped (id, num_val) VALUES (6, 1225.1)",
        )
        wait_for(lambda: _logged(tmp_path) == _source(reference_db), what="the values rounded by the type changes")
    finally:
        stop.set()
        running.join(60)
    assert capture.stats.tables_added == 1
    assert _logged(tmp_path)[1][0] == "123"


def _marks(capture: Capture) -> str:
    """The column marks the running capture judges the table's next columns against."""
    entry = capture.ledger.entries.get("public.retyped")
    return (entry.columns or "") if entry else ""


def _logged(data_dir: Path) -> dict[int, tuple[str, ...]]:
    """The log's rows (replayed) by id: each column's value as the log writes it, in PostgreSQL's form."""
    return {
        int(str(row["id"])): tuple(str(row[c]).replace("T", " ") for c in COLUMNS)
        for row in replay(data_dir, "cdc.public.retyped").values()
    }


def _source(url: str) -> dict[int, tuple[str, ...]]:
    """The source's rows by id: each column's value as PostgreSQL prints it."""
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT id, num_val::text, s::text, ts::text FROM retyped").fetchall()
    return {int(row[0]): tuple(str(v) for v in row[1:]) for row in rows}
