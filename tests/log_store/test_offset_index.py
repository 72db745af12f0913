"""The sparse offset index: greatest entry <= target, nonce binding, tolerance of damage."""

from __future__ import annotations

from pathlib import Path

import pytest

from log_store.offset_index import FILE_HEADER_SIZE, OffsetIndex


def _index() -> OffsetIndex:
    index = OffsetIndex()
    for relative, position in [(0, 28), (10, 4000), (25, 9000)]:
        index.append(relative, position)
    return index


def test_lookup_greatest_entry_at_or_below() -> None:
    index = _index()
    assert index.lookup(0) == (0, 28)
    assert index.lookup(9) == (0, 28)
    assert index.lookup(10) == (10, 4000)
    assert index.lookup(1000) == (25, 9000)
    empty = OffsetIndex()
    assert empty.lookup(5) is None and empty.last() is None


def test_entries_must_grow() -> None:
    index = _index()
    with pytest.raises(ValueError):
        index.append(25, 9500)
    with pytest.raises(ValueError):
        index.append(30, 9000)


def test_round_trip_and_nonce_binding(tmp_path: Path) -> None:
    path = tmp_path / "00000000000000000000.index"
    path.write_bytes(_index().to_bytes(nonce=42))
    loaded = OffsetIndex.load(path, 42)
    assert loaded is not None and list(loaded.offsets) == [0, 10, 25]
    assert list(loaded.positions) == [28, 4000, 9000]
    assert OffsetIndex.load(path, 43) is None  # belongs to another segment file instance
    assert OffsetIndex.load(tmp_path / "missing.index", 42) is None


def test_partial_trailing_entry_and_garbage_header(tmp_path: Path) -> None:
    path = tmp_path / "x.index"
    path.write_bytes(_index().to_bytes(nonce=7) + b"\x01\x02\x03")
    loaded = OffsetIndex.load(path, 7)
    assert loaded is not None and len(loaded) == 3
    path.write_bytes(b"garbage" * 4)
    assert OffsetIndex.load(path, 7) is None
    path.write_bytes(_index().to_bytes(nonce=7)[: FILE_HEADER_SIZE - 1])
    assert OffsetIndex.load(path, 7) is None
