"""The snapshot reader's hand-over of chunks to the caller, on chunks that stand in for the server's.

The fetching, converting and ordering threads of :meth:`SnapshotReader.column_chunks` are exercised
here without a server: the fetched rows come from a generator the test paces, and a chunk is built
into ``(first, count)``. The reads themselves are tested against PostgreSQL in
``test_parallel_snapshot.py``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from types import SimpleNamespace

import pytest

from cdc.capture import snapshot
from cdc.capture.errors import SourceError
from tests.cdc.helpers import snapshot_threads


def _chunks(monkeypatch: pytest.MonkeyPatch, fetched: Callable[[], Iterator[Sequence[object]]]) -> Iterator[object]:
    """``column_chunks`` of a reader whose fetched chunk rows are ``fetched()`` (a row's last item is its count)."""
    monkeypatch.setattr(snapshot, "column_query", lambda shape, row_filter=None, partitioned=False: None)
    monkeypatch.setattr(snapshot.SnapshotReader, "partitioned", lambda self, relid: False)
    monkeypatch.setattr(snapshot.SnapshotReader, "blocks", lambda self, relid: (100, 100.0, 0.0))
    monkeypatch.setattr(snapshot.SnapshotReader, "_prefetched", lambda self, plan, ranges: fetched())
    monkeypatch.setattr(snapshot, "_built", lambda shape, row, build, first, count: (first, count))
    reader = snapshot.SnapshotReader.__new__(snapshot.SnapshotReader)
    return reader.column_chunks(SimpleNamespace(relid=1), lambda *args: args)  # type: ignore[arg-type]


def test_the_first_chunk_reaches_the_caller_before_the_next_is_fetched(monkeypatch: pytest.MonkeyPatch) -> None:
    caller_has_it = threading.Event()
    waited_in_vain: list[bool] = []

    def fetched() -> Iterator[Sequence[object]]:
        yield [10]
        # the next fetch takes until the caller holds the first chunk (at most 5 s)
        waited_in_vain.append(not caller_has_it.wait(5))
        yield [7]

    chunks = _chunks(monkeypatch, fetched)
    assert next(chunks) == (0, 10)
    caller_has_it.set()
    assert list(chunks) == [(10, 7)]
    assert waited_in_vain == [False]
    assert snapshot_threads() == []


def test_a_failed_fetch_reaches_the_caller_after_the_chunks_before_it(monkeypatch: pytest.MonkeyPatch) -> None:
    def fetched() -> Iterator[Sequence[object]]:
        yield [10]
        yield [0]  # an empty range builds nothing
        raise SourceError("snapshot query failed: the server went away")

    chunks = _chunks(monkeypatch, fetched)
    assert next(chunks) == (0, 10)
    with pytest.raises(SourceError, match="went away"):
        next(chunks)
    assert snapshot_threads() == []


def test_a_feeder_that_ends_without_a_word_is_an_error_not_a_hang(monkeypatch: pytest.MonkeyPatch) -> None:
    handed = snapshot._hand_over

    def losing_the_end(results: object, item: object, stop: threading.Event) -> bool:
        return True if item is None else handed(results, item, stop)  # type: ignore[arg-type]

    def fetched() -> Iterator[Sequence[object]]:
        yield [10]

    monkeypatch.setattr(snapshot, "_hand_over", losing_the_end)
    chunks = _chunks(monkeypatch, fetched)
    assert next(chunks) == (0, 10)
    with pytest.raises(RuntimeError, match="snapshot-feed ended without handing over"):
        next(chunks)
    assert snapshot_threads() == []
