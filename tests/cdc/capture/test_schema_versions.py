"""Schema records that carry a table's earlier column versions, attribute numbers, and TOASTed keys."""

from __future__ import annotations

import orjson
import pytest

from cdc.capture.change_replayer import _attribute_numbers
from cdc.capture.errors import MissingValueError
from cdc.capture.events import EventBuilder, TxContext
from cdc.capture.pgoutput.messages import UNCHANGED
from cdc.capture.published_tables import TableInfo
from cdc.capture.tables import TableShape, fingerprint_of


def _shape(columns: list[tuple[str, int, int]], attnums: tuple[tuple[str, int], ...]) -> TableShape:
    return TableShape.build(7, "public", "t", "cdc.public.t", columns, ["id"], attnums=attnums)


def test_a_record_carries_the_versions_whose_columns_changed_type_were_renamed_or_dropped() -> None:
    first = _shape([("id", 23, -1), ("n", 23, -1)], (("id", 1), ("n", 2)))
    record = first.schema_value(100)
    assert "versions" not in orjson.loads(record) and orjson.loads(record)["columns"][1]["attnum"] == 2
    added = _shape([("id", 23, -1), ("n", 23, -1), ("m", 25, -1)], (("id", 1), ("n", 2), ("m", 3)))
    assert "versions" not in orjson.loads(added.schema_value(200, record))  # an added column changes no old event
    retyped = _shape([("id", 23, -1), ("n", 20, -1), ("m", 25, -1)], (("id", 1), ("n", 2), ("m", 3)))
    second = retyped.schema_value(300, added.schema_value(200, record))
    assert orjson.loads(second)["versions"] == [
        {
            "lsn": 200,
            "sequence": 0,
            "columns": [
                {"name": "id", "type": "int4", "typmod": -1, "attnum": 1},
                {"name": "n", "type": "int4", "typmod": -1, "attnum": 2},
                {"name": "m", "type": "text", "typmod": -1, "attnum": 3},
            ],
        }
    ]
    renamed = _shape([("id", 23, -1), ("n", 20, -1), ("remark", 25, -1)], (("id", 1), ("n", 2), ("remark", 3)))
    third = orjson.loads(renamed.schema_value(400, second))
    assert [v["lsn"] for v in third["versions"]] == [200, 300]  # carried on, oldest first
    # once there are versions every record becomes one, even when it only adds a column: no gap
    grown = _shape(
        [("id", 23, -1), ("n", 20, -1), ("remark", 25, -1), ("z", 23, -1)], (("id", 1), ("n", 2), ("remark", 3), ("z", 4))
    )
    fourth = orjson.loads(grown.schema_value(500, renamed.schema_value(400, second, sequence=7), sequence=3))
    assert [(v["lsn"], v["sequence"]) for v in fourth["versions"]] == [(200, 0), (300, 0), (400, 7)]
    assert (fourth["lsn"], fourth["sequence"]) == (500, 3)


def test_a_stored_defaults_fact_is_carried_by_every_later_record_under_the_same_mask() -> None:
    """``filled`` (cdc/capture/added_column_fills.py) stays on its column's entry while the column keeps its
    number and mask, and is no part of the fingerprint (it describes rows, not columns)."""
    first = _shape([("id", 23, -1)], (("id", 1),))
    added = _shape([("id", 23, -1), ("flag", 23, -1)], (("id", 1), ("flag", 2)))
    record = added.schema_value(200, first.schema_value(100), sequence=4, filled={"flag": 7})
    columns = orjson.loads(record)["columns"]
    assert "filled" not in columns[0] and columns[1]["filled"] == {"value": 7, "lsn": 200, "sequence": 4}
    assert fingerprint_of(orjson.loads(record)) == added.fingerprint()
    renamed = _shape([("key", 23, -1), ("flag", 23, -1), ("more", 25, -1)], (("key", 1), ("flag", 2), ("more", 3)))
    later = orjson.loads(renamed.schema_value(300, record))
    assert [c.get("filled") for c in later["columns"]] == [None, {"value": 7, "lsn": 200, "sequence": 4}, None]
    readded = _shape([("id", 23, -1), ("flag", 23, -1)], (("id", 1), ("flag", 9)))  # dropped and added again
    assert "filled" not in orjson.loads(readded.schema_value(400, record))["columns"][1]
    masked = added.with_masks({"flag": ("fixed:x", lambda _text: "x")})
    assert "filled" not in orjson.loads(masked.schema_value(500, record))["columns"][1]


def test_attribute_numbers_follow_a_rename_the_catalog_already_holds() -> None:
    info = TableInfo(
        7, "public", "t", (("id", 23, -1), ("remark", 25, -1)), ("id",), (), "default", frozenset(), (("id", 1), ("remark", 3))
    )
    # the Relation message still says "note": the same place and type in the catalog is the same column
    assert _attribute_numbers([("id", 23, -1), ("note", 25, -1)], info) == (("id", 1), ("note", 3))
    # a column the catalog lacks at another count is unknown
    assert _attribute_numbers([("id", 23, -1), ("note", 25, -1), ("x", 23, -1)], info) == (("id", 1), ("note", 0), ("x", 0))
    assert _attribute_numbers([("id", 23, -1)], None) == ()


def test_an_unchanged_toasted_key_is_taken_from_the_old_key_and_never_null() -> None:
    builder = EventBuilder(prefix="cdc", database="db", partitions=3)
    shape = TableShape.build(1, "public", "t", "cdc.public.t", [("k", 25, -1), ("other", 23, -1)], ["k"])
    long_key = "k" * 3000
    (record,) = builder.update(shape, "K", (long_key, None), (UNCHANGED, "2"), TxContext(100, 5, 1000))
    assert record.key == orjson.dumps({"k": long_key})
    value = orjson.loads(record.value or b"")
    assert value["op"] == "u" and value["after"] == {"k": long_key, "other": 2} and not record.headers
    with pytest.raises(MissingValueError, match="REPLICA IDENTITY FULL"):
        builder.update(shape, None, None, (UNCHANGED, "2"), TxContext(100, 5, 1000))
