"""Folding unchanged columns: values copied exactly, never invented."""

from __future__ import annotations

import orjson
import pytest

from event_format import fold_after
from log_store.errors import FoldError
from log_store.fold import parse_unchanged

PREVIOUS = b'{"before":null,"after":{"id":1,"big":"TOASTED","price":12.50,"n":123456789012345678901234,"tags":["a"]},"op":"c"}'
PARTIAL = b'{"before":null,"after":{"id":1,"price":13.10},"op":"u","source":{"lsn":"0/1"}}'


def test_copies_named_columns_in_the_previous_order() -> None:
    folded = fold_after(PREVIOUS, PARTIAL, ["big", "n", "tags"])
    assert folded == (
        b'{"before":null,"after":{"id":1,"big":"TOASTED","price":13.10,'
        b'"n":123456789012345678901234,"tags":["a"]},"op":"u","source":{"lsn":"0/1"}}'
    )


def test_numbers_keep_their_exact_text() -> None:
    folded = fold_after(b'{"after":{"a":1.10,"b":1e400}}', b'{"after":{"c":0.30}}', ["a", "b"])
    assert folded == b'{"after":{"a":1.10,"b":1e400,"c":0.30}}'


def test_missing_column_is_refused_not_invented() -> None:
    with pytest.raises(FoldError, match="lacks column"):
        fold_after(PREVIOUS, PARTIAL, ["big", "absent"])


@pytest.mark.parametrize(
    ("previous", "partial"), [(b'{"after":null}', PARTIAL), (PREVIOUS, b'{"after":null}'), (b"not json", PARTIAL)]
)
def test_shapes_that_cannot_fold(previous: bytes, partial: bytes) -> None:
    with pytest.raises(FoldError):
        fold_after(previous, partial, ["big"])


def test_unchanged_header() -> None:
    assert parse_unchanged(b'["a","b"]') == ["a", "b"]
    for bad in (b"{", b'{"a":1}', b"[1]"):
        with pytest.raises(FoldError):
            parse_unchanged(bad)
    assert orjson.loads(fold_after(PREVIOUS, PARTIAL, []))["after"] == {"id": 1, "price": 13.1}
