"""Arrow fragments and objects are byte for byte what the stream's row codec writes for the same texts."""

from __future__ import annotations

import orjson
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from cdc.capture import arrow_fragments
from cdc.capture.row_codec import RowCodec, fragmenter
from cdc.capture.snapshot_chunks import _split, _unescaped
from cdc.capture.tables import ColumnShape
from cdc.capture.values import converter_for

#: Text forms per base type: the fast kernels' cases and the ones they must hand to the fragmenter.
_TEXTS: dict[str, list[str]] = {
    "int8": ["0", "-9223372036854775808", "42"],
    "numeric": ["1.25", "NaN", "-0.000100", "12345678901234567890.0123456789"],
    "uuid": ["a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"],
    "bool": ["t", "f"],
    "text": ["plain", "", 'say "hi"', "back\\slash", "tab\there", "new\nline", "\x01\x1f", "é ✓", "\\N", "null"],
    "timestamptz": [
        "2026-11-21 13:45:00.5+00",
        "2026-11-21 13:45:00+05:30",
        "infinity",
        "-infinity",
        "0044-03-15 12:00:00+00 BC",
        "1999-12-31 23:59:59.999999+00",
    ],
    "timestamp": ["2026-11-21 13:45:00.5", "infinity", "0044-03-15 12:00:00 BC", "-infinity"],
    "jsonb": ['{"a": [1, 2.50]}', '"just a string"', "[]"],
    "float8": ["NaN", "-Infinity", "1e+20", "1.5e-07"],
    "_int4": ["{1,2,NULL}", "{}", "[2:3]={7,8}"],
    "date": ["2026-11-21", "infinity", "0044-03-15 BC"],
}
_OIDS = {
    "int8": 20,
    "numeric": 1700,
    "uuid": 2950,
    "bool": 16,
    "text": 25,
    "timestamptz": 1184,
    "timestamp": 1114,
    "jsonb": 3802,
    "float8": 701,
    "_int4": 1007,
    "date": 1082,
}


def _expected(type_name: str, texts: list[str | None]) -> list[bytes]:
    encode = fragmenter(type_name, converter_for(_OIDS[type_name], {}))
    return [b"null" if t is None else encode(t.encode()) for t in texts]


def _fragments(type_name: str, texts: list[str | None]) -> list[bytes]:
    array = pa.array([b"" if t is None else t.encode() for t in texts], arrow_fragments.BYTES)
    nulls = pa.array([t is None for t in texts])
    encode = fragmenter(type_name, converter_for(_OIDS[type_name], {}))
    pieces = arrow_fragments.fragments(array, nulls if any(t is None for t in texts) else None, encode)
    return arrow_fragments.join(pieces, len(texts)).to_pylist()


@settings(max_examples=60, deadline=None)
@given(type_name=st.sampled_from(sorted(_TEXTS)), data=st.data())
def test_fragments_equal_the_row_codec(type_name: str, data: st.DataObject) -> None:
    texts = data.draw(st.lists(st.one_of(st.none(), st.sampled_from(_TEXTS[type_name])), min_size=1, max_size=12))
    assert _fragments(type_name, texts) == _expected(type_name, texts)


@settings(max_examples=60, deadline=None)
@given(texts=st.lists(st.one_of(st.none(), st.text()), min_size=1, max_size=12))
def test_any_text_is_escaped_as_orjson_escapes_it(texts: list[str | None]) -> None:
    texts = [None if t is None else t.replace("\x00", "") for t in texts]  # PostgreSQL text holds no NUL
    assert _fragments("text", texts) == [b"null" if t is None else orjson.dumps(t) for t in texts]


def test_objects_and_keys_equal_the_row_codec() -> None:
    names, types = ["id", "name", "at"], ["int8", "text", "timestamptz"]
    codec = RowCodec(names, types, [converter_for(_OIDS[t], {}) for t in types], [0])
    rows = [["1", 'a "b"', "2026-11-21 13:45:00+00"], ["2", None, None]]
    parts = [
        arrow_fragments.fragments(
            pa.array([b"" if r[i] is None else r[i].encode() for r in rows], arrow_fragments.BYTES),
            pa.array([r[i] is None for r in rows]),
            codec.fragmenters[i],
        )
        for i in range(3)
    ]
    objects = arrow_fragments.join(arrow_fragments.object_pieces(codec.prefixes, parts), 2).to_pylist()
    assert objects == [codec.obj([codec.fragment(i, v) for i, v in enumerate(r)]) for r in rows]
    assert orjson.loads(objects[0]) == {"id": 1, "name": 'a "b"', "at": "2026-11-21T13:45:00Z"}


@settings(max_examples=60, deadline=None)
@given(texts=st.lists(st.one_of(st.none(), st.text(alphabet=st.sampled_from("ab\\\nN"))), min_size=1, max_size=10))
def test_split_and_unescape_give_back_the_server_texts(texts: list[str | None]) -> None:
    # what the chunk query sends for an escaped column: backslash and newline escaped, \N for NULL
    sent = [r"\N" if t is None else t.replace("\\", "\\\\").replace("\n", "\\n") for t in texts]
    column = ColumnShape("c", 25, -1, "text", False, True)
    array = _split("\n".join(sent).encode(), len(texts), column)
    nulls = pa.array([s == r"\N" for s in sent])
    back = _unescaped(array, nulls).to_pylist()
    assert [None if n else b for b, n in zip(back, nulls.to_pylist())] == [None if t is None else t.encode() for t in texts]
