"""A column added with a constant default reaches the rows that predate it without a read of the table:
capture writes the value they hold into the column's entry of the table's schema record, from the
position of the first event carrying the column (cdc/capture/added_column_fills.py). The value is encoded
as events encode the column's values (masked when the column is masked); a column the publication does
not publish gets nothing; a volatile default still reads the table again."""

from __future__ import annotations

from contextlib import closing
from pathlib import Path

import orjson
import psycopg
import pytest

from cdc.capture.added_column_fills import filled_values
from cdc.capture.catalog import Catalog
from cdc.capture.lsn import Lsn
from cdc.capture.tables import TableShape
from cdc.run.coordinator import Capture
from event_format.masks import Mask
from tests.cdc.capture.test_publication_rules import files_holding, secret
from tests.cdc.helpers import execute, filled_columns, read_topic, replay, settings_for, source_table

pytestmark = pytest.mark.pg

ROWS = 20_000
#: column -> its definition: a default of each kind of value the events encode differently
ADDED = {
    "flag": "int DEFAULT 7",
    "label": """text DEFAULT 'a "quoted", {braced} label'""",
    "price": "numeric(10,2) DEFAULT 12.345",
    "at": "timestamptz DEFAULT '2020-01-01 12:00:00.123456+02'",
    "ok": "bool DEFAULT true",
    "tags": """text[] DEFAULT '{x,"y z",NULL}'""",
    "doc": """jsonb DEFAULT '{"k": [1, 2.50], "s": "é"}'""",
}


def _schema_record(data_dir: Path, table: str) -> dict[str, object]:
    records = [r for r in read_topic(data_dir, "cdc.__schemas") if r.key == orjson.dumps(f"public.{table}") and r.value]
    return orjson.loads(records[-1].value)  # type: ignore[arg-type,no-any-return]


def _wal_position(url: str) -> int:
    with psycopg.connect(url) as conn:
        return int(Lsn.parse(str(conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0])))  # type: ignore[index]


def test_a_constant_default_reaches_the_older_rows_as_a_fact_not_a_read(reference_db: str, tmp_path: Path) -> None:
    execute(
        reference_db,
        "CREATE TABLE big (id int PRIMARY KEY, v text)",
        f"INSERT INTO big SELECT g, 'v' || g FROM generate_series(1, {ROWS}) g",
        "ALTER PUBLICATION cdc_publication ADD TABLE big",
    )
    settings = settings_for(reference_db, tmp_path, tables="public.big")
    assert Capture(settings, once=True).run().snapshot_rows == ROWS
    ledger_records = len(read_topic(tmp_path, "cdc.__snapshots"))

    execute(reference_db, *(f"ALTER TABLE big ADD COLUMN {name} {definition}" for name, definition in ADDED.items()))
    altered = _wal_position(reference_db)
    # a capture that starts now, before any event carries the columns, reads nothing either
    assert Capture(settings, once=True).run().tables_added == 0
    execute(
        reference_db,
        "INSERT INTO big (id, v) VALUES (0, 'defaults')",  # its event carries every default as events encode it
        "UPDATE big SET flag = 8, label = 'changed', tags = NULL WHERE id % 1000 = 0",
        "UPDATE big SET v = 'touched' WHERE id % 777 = 0",
        "DELETE FROM big WHERE id = 5",
    )
    stats = Capture(settings, once=True).run()
    assert stats.tables_added == 0 and stats.snapshot_rows == 0

    values = [orjson.loads(r.value) for r in read_topic(tmp_path, "cdc.public.big") if r.value is not None]
    after_alter = [v for v in values if v["source"]["lsn"] >= altered]
    # no read of the table after the ALTER: no reads, no truncate marker, no read progress in the ledger
    assert after_alter and {v["op"] for v in after_alter} <= {"c", "u", "d"}
    assert len(read_topic(tmp_path, "cdc.__snapshots")) == ledger_records

    record = _schema_record(tmp_path, "big")
    filled = {c["name"]: c["filled"] for c in record["columns"] if "filled" in c}  # type: ignore[attr-defined]
    assert set(filled) == set(ADDED)
    # the position: the first event carrying the columns, after the ALTER's commit
    first = min((v["source"]["lsn"], v["source"]["sequence"]) for v in after_alter if "flag" in (v["after"] or {}))
    assert {(f["lsn"], f["sequence"]) for f in filled.values()} == {first} and first[0] > altered
    # the value: what an event carries for the same value
    (defaults,) = [v["after"] for v in values if v["op"] == "c" and v["after"]["id"] == 0]
    assert {name: fact["value"] for name, fact in filled.items()} == {name: defaults[name] for name in ADDED}
    assert defaults["price"] == "12.35" and defaults["at"] == "2020-01-01T10:00:00.123456Z"
    assert defaults["tags"] == ["x", "y z", None] and defaults["label"] == 'a "quoted", {braced} label'

    # replaying the log with the fact (rows whose last event precedes it hold the value) gives the source
    replayed = replay(tmp_path, "cdc.public.big")
    source = source_table(reference_db, "big")
    assert replayed.keys() == source.keys() and len(replayed) == ROWS
    for key, row in source.items():
        got = replayed[key]
        assert (got["id"], got["v"], got["flag"], got["label"], got["ok"]) == (
            row["id"],
            row["v"],
            row["flag"],
            row["label"],
            row["ok"],
        )
        assert got["tags"] == (None if row["tags"] is None else defaults["tags"])
    with psycopg.connect(reference_db) as conn:
        differing = conn.execute(
            "SELECT count(*) FROM big b WHERE EXISTS (SELECT 1 FROM big d WHERE d.id = 0 AND "
            "(b.price, b.at, b.doc) IS DISTINCT FROM (d.price, d.at, d.doc))"
        ).fetchone()
    assert differing == (0,)
    assert {(r["price"], r["at"], r["doc"]) for r in replayed.values()} == {(defaults["price"], defaults["at"], defaults["doc"])}

    # a restart reads nothing: the fact is in the log
    assert Capture(settings, once=True).run().tables_added == 0


def test_a_rewrite_after_a_stored_default_reads_the_table_once(reference_db: str, tmp_path: Path) -> None:
    """``VACUUM FULL`` writes a stored default into every row and clears it by updating the column's
    ``pg_attribute`` row, as a type changed and back would: capture reads the table once, and not again at
    the next rewrite."""
    execute(
        reference_db,
        "CREATE TABLE packed (id int PRIMARY KEY, v text)",
        "INSERT INTO packed SELECT g, 'v' || g FROM generate_series(1, 50) g",
        "ALTER PUBLICATION cdc_publication ADD TABLE packed",
    )
    settings = settings_for(reference_db, tmp_path, tables="public.packed")
    Capture(settings, once=True).run()
    execute(reference_db, "ALTER TABLE packed ADD COLUMN flag int DEFAULT 7", "UPDATE packed SET v = 'x' WHERE id = 1")
    assert Capture(settings, once=True).run().tables_added == 0
    assert [name for name, *_ in filled_columns(tmp_path, "cdc.public.packed")] == ["flag"]
    execute(reference_db, "VACUUM FULL packed")
    with psycopg.connect(reference_db) as conn:
        assert conn.execute(
            "SELECT atthasmissing FROM pg_attribute WHERE attrelid = 'packed'::regclass AND attname = 'flag'"
        ).fetchone() == (False,)
    assert Capture(settings, once=True).run().tables_added == 1
    assert replay(tmp_path, "cdc.public.packed") == source_table(reference_db, "packed")
    execute(reference_db, "VACUUM FULL packed")
    assert Capture(settings, once=True).run().tables_added == 0


def test_an_unpublished_column_gets_no_fact_and_leaves_nothing(pg_url: str, tmp_path: Path) -> None:
    execute(
        pg_url,
        "CREATE TABLE listed (id int PRIMARY KEY, v text)",
        "INSERT INTO listed SELECT g, 'v' || g FROM generate_series(1, 20) g",
        "CREATE PUBLICATION cdc_publication FOR TABLE listed (id, v)",
    )
    settings = settings_for(pg_url, tmp_path)
    Capture(settings, once=True).run()
    hidden = secret("hidden", 1)
    execute(pg_url, f"ALTER TABLE listed ADD COLUMN hidden text DEFAULT '{hidden}'", "UPDATE listed SET v = 'after' WHERE id = 1")
    assert Capture(settings, once=True).run().tables_added == 0
    assert [c["name"] for c in _schema_record(tmp_path, "listed")["columns"]] == ["id", "v"]  # type: ignore[attr-defined]
    assert filled_columns(tmp_path, "cdc.public.listed") == []
    assert files_holding(tmp_path, [hidden]) == {}
    assert files_holding(tmp_path, ["after"]) != {}  # the search finds what is there


def test_a_masked_columns_fact_holds_the_masked_value(reference_db: str) -> None:
    execute(
        reference_db, "CREATE TABLE masked (id int PRIMARY KEY)", "ALTER TABLE masked ADD COLUMN code text DEFAULT 'clear-code'"
    )
    with closing(Catalog(reference_db, mask_key=b"a mask key that is long enough")) as catalog:
        with psycopg.connect(reference_db) as conn:
            relid = int(conn.execute("SELECT 'masked'::regclass::oid").fetchone()[0])  # type: ignore[index]
        info = catalog.table(relid)
        previous = orjson.dumps({"columns": [{"name": "id", "attnum": 1}]})

        def shape(mask: str | None) -> TableShape:
            masks = catalog.mask_functions({"code": Mask.parse(mask)}) if mask else None
            return TableShape.build(
                relid, "public", "masked", "cdc.public.masked", list(info.columns), ["id"], attnums=info.attnums, masks=masks
            )

        assert filled_values(catalog, shape("fixed:***"), previous) == {"code": "***"}
        assert filled_values(catalog, shape("truncate:5"), previous) == {"code": "clear"}
        assert filled_values(catalog, shape(None), previous) == {"code": "clear-code"}
        assert filled_values(catalog, shape(None), None) == {}  # a table's first record comes with its snapshot


@pytest.mark.kafka
def test_kafka_consumers_receive_the_fact_in_the_schema_record(
    reference_db: str, tmp_path: Path, kafka_bootstrap: str, kafka_prefix: str
) -> None:
    execute(
        reference_db,
        "CREATE TABLE remote (id int PRIMARY KEY, v text)",
        "INSERT INTO remote SELECT g, 'v' || g FROM generate_series(1, 100) g",
        "ALTER PUBLICATION cdc_publication ADD TABLE remote",
    )
    kafka = settings_for(
        reference_db, tmp_path, log=f"kafka://{kafka_bootstrap}", topic_prefix=kafka_prefix, tables="public.remote"
    )
    Capture(kafka, once=True).run()
    execute(
        reference_db, "ALTER TABLE remote ADD COLUMN price numeric(10,2) DEFAULT 1.5", "UPDATE remote SET price = 2 WHERE id = 1"
    )
    assert Capture(kafka, once=True).run().tables_added == 0
    topic = f"{kafka_prefix}.public.remote"
    ((name, value, lsn, _),) = filled_columns(kafka, topic)
    assert (name, value) == ("price", "1.50") and lsn > 0
    replayed = {int(row["id"]): row["price"] for row in replay(kafka, topic).values()}  # type: ignore[call-overload]
    assert replayed == {**dict.fromkeys(range(1, 101), "1.50"), 1: "2.00"}
