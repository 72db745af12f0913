"""Which tables are read by key, and which held changes a resumed read writes (pure rules, no database)."""

from __future__ import annotations

from cdc.capture import snapshot_chunks
from cdc.capture.reads.online_read import keyset_keys, progress_plan, run_keep
from cdc.capture.snapshot_chunks import KEYSET_TYPES, last_key
from cdc.capture.table_snapshots import ReadProgress
from cdc.capture.tables import TableShape

INT4, TEXT, UUID = 23, 25, 2950


def _shape(columns: list[tuple[str, int]], keys: list[str]) -> TableShape:
    return TableShape.build(1, "public", "t", "cdc.public.t", [(n, oid, -1) for n, oid in columns], keys)


def test_only_integer_and_uuid_primary_keys_are_read_by_key_in_index_order() -> None:
    composite = _shape([("part", INT4), ("id", INT4), ("v", TEXT)], ["part", "id"])
    assert keyset_keys(composite, ("id", "part")) == ("id", "part")
    assert keyset_keys(_shape([("id", TEXT)], ["id"]), ("id",)) is None
    assert keyset_keys(_shape([("id", INT4)], []), ()) is None


def test_a_chunk_read_by_key_ends_at_the_last_line_of_each_key_column() -> None:
    # a key type's text is sent as it is (never escaped, no newline): the last line is the last row's
    assert KEYSET_TYPES <= snapshot_chunks._PLAIN
    row = [b"1\n2\n10", b"x\\n\ny\nz", b"0f\nab\ncd", 3]
    assert last_key(row, [0, 2]) == ("10", "cd")
    assert last_key([b"7", b"v", 1], [0]) == ("7",)


def test_a_held_change_goes_to_the_log_only_for_the_keys_read_by_runs_whose_snapshot_missed_it() -> None:
    shape = _shape([("id", INT4), ("v", TEXT)], ["id"])
    # run 0 wrote keys up to 50, run 1 up to 80; this run, 2, reads the rest
    keep = run_keep(shape, ("id",), (("50",), ("80",)))
    assert not keep(0, b'{"id":1}')  # run 0's snapshot saw it: every row holds it
    assert keep(1, b'{"id":50}') and not keep(1, b'{"id":51}')  # first seen by run 1
    assert keep(2, b'{"id":80}') and not keep(2, b'{"id":81}')  # first seen by this run
    assert keep(3, b'{"id":99999}') and keep(3, b'{"id":1}')  # no snapshot of the read saw it
    # a key change from 40 to 60 first seen by run 1: the delete of 40 is kept, the create of 60 is not
    assert keep(1, b'{"id":40}') and not keep(1, b'{"id":60}')
    # no key written before this run: nothing an earlier run missed
    assert not run_keep(shape, ("id",), (None,))(1, b'{"id":1}')
    # a read in one run (by block ranges, or the first run of a read by key)
    single = run_keep(shape, None, ())
    assert single(1, b'{"id":1}') and not single(0, b'{"id":1}')


def test_a_resume_goes_on_past_the_key_of_the_same_shape_only() -> None:
    shape = _shape([("id", INT4), ("v", TEXT)], ["id"])
    progress = ReadProgress(1, "cdc.public.t", 100, ("50",), 50, shape.fingerprint().hex())
    plan = progress_plan(progress, ("id",), shape, 200)
    assert plan is not None and plan.after == ("50",) and plan.rows == 50 and plan.earlier == ((100, ("50",)),)
    other = ReadProgress(1, "cdc.public.t", 100, ("50",), 50, "00")
    fresh = progress_plan(other, ("id",), shape, 200)
    assert fresh is not None and fresh.after is None and fresh.rows == 0 and fresh.boundary == 200
