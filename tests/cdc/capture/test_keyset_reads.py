"""Reads by key fetched ahead on every session of a snapshot (:meth:`SnapshotReader.keyset_chunks`).

Real PostgreSQL: a snapshot exported by a transaction that stays open, imported by three sessions (or one); rows
changed after it are never read; every row of the snapshot is read once, in key order, from the first
key or past any key; a read closed part way or failing ends its threads.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import cast

import orjson
import psycopg
import pyarrow as pa
import pytest

from cdc.capture import arrow_fragments
from cdc.capture.errors import SourceError
from cdc.capture.snapshot import SnapshotReader
from cdc.capture.tables import TableShape
from tests.cdc.helpers import execute, snapshot_threads

pytestmark = pytest.mark.pg

INT4, INT8, TEXT = 23, 20, 25
KEYS = ("a", "b")
#: (a, b) rows of the snapshot: a composite key whose second column is not the row's order alone
ROWS = 2_503
#: a value per row holding what a chunk's texts must escape (newline, backslash), a tab, or NULL
VALUE = "CASE WHEN g % 7 = 0 THEN NULL WHEN g % 5 = 0 THEN E'x\\ny\\\\z\\t' || g ELSE 'v' || g END"


def _shape() -> TableShape:
    columns = [("a", INT4, -1), ("b", INT8, -1), ("v", TEXT, -1)]
    return TableShape.build(0, "public", "keyed", "cdc.public.keyed", columns, list(KEYS))


Chunk = tuple[int, int, list[dict[str, object]]]


def _build(first: int, count: int, keys: pa.Array | None, after: list[pa.Array | pa.Scalar]) -> Chunk:
    """A chunk as ``(first, count, its rows)``, each row as the ``after`` JSON the log would get."""
    return first, count, [orjson.loads(row) for row in arrow_fragments.join(after, count).to_pylist()]


@contextmanager
def _reader(url: str, sessions: int) -> Iterator[SnapshotReader]:
    """A reader of ``sessions`` sessions importing a snapshot taken now, while ``keyed`` is changed after it."""
    with _exported(url) as name:
        reader = SnapshotReader(url, name, connections=sessions)
    try:
        # committed after the snapshot: the inserts fall between, before and after its keys
        execute(
            url,
            "INSERT INTO keyed SELECT g / 10, g % 10 + 100, 'late' FROM generate_series(1, 400) g",
            "DELETE FROM keyed WHERE (a * 10 + b) % 13 = 0",
            "UPDATE keyed SET v = 'changed' WHERE a % 3 = 0",
        )
        yield reader
    finally:
        reader.close()


@contextmanager
def _exported(url: str) -> Iterator[str]:
    """The name of a snapshot exported by a REPEATABLE READ transaction open for the block."""
    with psycopg.connect(url) as conn:
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        row = conn.execute("SELECT pg_export_snapshot()").fetchone()
        yield str(cast(tuple[str], row)[0])
        conn.rollback()


def _source(url: str) -> list[dict[str, object]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT a, b, v FROM keyed ORDER BY a, b").fetchall()
    return [{"a": a, "b": b, "v": v} for a, b, v in rows]


@pytest.fixture
def keyed(reference_db: str) -> list[dict[str, object]]:
    """Table ``keyed`` of :data:`ROWS` rows; its rows as the snapshot holds them, in key order."""
    execute(
        reference_db,
        "CREATE TABLE keyed (a int, b bigint, v text, PRIMARY KEY (a, b))",
        f"INSERT INTO keyed SELECT g / 10, g % 10, {VALUE} FROM generate_series(1, {ROWS}) g",
        "ANALYZE keyed",
    )
    return _source(reference_db)


def _read(reader: SnapshotReader, after: tuple[str, ...] | None, first: int, limit: int, **kw: str) -> list[Chunk]:
    chunks: list[Chunk] = []
    for (start, count, rows), last in reader.keyset_chunks(_shape(), _build, KEYS, after, first, limit, **kw):
        assert last == (str(rows[-1]["a"]), str(rows[-1]["b"])), "the chunk's last key is its last row's"
        chunks.append((start, count, rows))
    return chunks


def _assert_in_order(chunks: list[Chunk], first: int, limit: int, expected: list[dict[str, object]]) -> None:
    """Every expected row once, in key order, in full chunks but the last, each numbered from ``first``."""
    assert [row for _, _, rows in chunks for row in rows] == expected
    assert [start for start, _, _ in chunks] == [first + i * limit for i in range(len(chunks))]
    assert all(count == limit for _, count, _ in chunks[:-1]) and 0 < chunks[-1][1] <= limit


@pytest.mark.parametrize("sessions", [3, 1])
def test_a_read_by_key_on_several_sessions_reads_each_row_of_its_snapshot_once_in_key_order(
    reference_db: str, keyed: list[dict[str, object]], sessions: int
) -> None:
    with _reader(reference_db, sessions) as reader:
        assert len(reader.pids) == sessions
        _assert_in_order(_read(reader, None, 0, 100), 0, 100, keyed)
        # past a key (a resumed read), to a last chunk that is exactly full
        past = keyed[502]
        rest = _read(reader, (str(past["a"]), str(past["b"])), 503, 100)
        _assert_in_order(rest, 503, 100, keyed[503:])
        assert len(rest) == 20 and rest[-1][1] == 100
        # a row filter (the publication's): the chunks hold only the rows it passes
        even = _read(reader, None, 0, 64, row_filter="a % 2 = 0")
        _assert_in_order(even, 0, 64, [row for row in keyed if cast(int, row["a"]) % 2 == 0])
        # past the last key: no chunk
        assert _read(reader, (str(keyed[-1]["a"]), str(keyed[-1]["b"])), ROWS, 100) == []
    assert _source(reference_db) != keyed, "the changes after the snapshot were committed"
    assert snapshot_threads() == []


def test_a_read_by_key_closed_part_way_ends_its_threads_and_leaves_its_sessions_to_the_snapshot(
    reference_db: str, keyed: list[dict[str, object]]
) -> None:
    with _reader(reference_db, sessions=2) as reader:
        chunks = reader.keyset_chunks(_shape(), _build, KEYS, None, 0, 50)
        taken = [next(chunks) for _ in range(3)]
        chunks.close()
        assert snapshot_threads() == []
        assert [row for (_, _, rows), _ in taken for row in rows] == keyed[:150]
        # the sessions are free and still in the snapshot: a new read goes on from the third chunk's key
        _assert_in_order(_read(reader, taken[-1][1], 150, 500), 150, 500, keyed[150:])


def test_a_session_lost_during_a_read_by_key_fails_it_with_one_error_and_ends_its_threads(
    reference_db: str, keyed: list[dict[str, object]]
) -> None:
    with _reader(reference_db, sessions=2) as reader:
        chunks = reader.keyset_chunks(_shape(), _build, KEYS, None, 0, 20)
        next(chunks)
        execute(reference_db, f"SELECT pg_terminate_backend({reader.pids[1]})")
        with pytest.raises(SourceError, match="snapshot query failed"):
            for _ in chunks:
                pass
        assert snapshot_threads() == []
