"""Text-format column values to faithful JSON values, chosen by the column's type OID.

Input is PostgreSQL's text output form, as pgoutput sends it and as ``COPY ... TO STDOUT`` (after
unescaping) yields it; the capture sessions run with ``TimeZone=UTC``, ``DateStyle=ISO`` and
``bytea_output=hex`` so that this form is fixed. Output follows docs/event-format.md: numeric stays an
exact decimal string (never a float), timestamptz becomes ISO-8601 in UTC with ``Z``, bytea becomes
base64, arrays become (nested) JSON arrays, and any type not listed keeps its text form, so nothing is
ever rounded or dropped. Conversions are pure functions without state.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

Converter = Callable[[str], Any]

#: Built-in scalar type OIDs -> type name (pg_type.typname).
TYPE_NAMES: dict[int, str] = {
    16: "bool",
    17: "bytea",
    18: "char",
    19: "name",
    20: "int8",
    21: "int2",
    23: "int4",
    25: "text",
    26: "oid",
    114: "json",
    142: "xml",
    650: "cidr",
    700: "float4",
    701: "float8",
    790: "money",
    869: "inet",
    1042: "bpchar",
    1043: "varchar",
    1082: "date",
    1083: "time",
    1114: "timestamp",
    1184: "timestamptz",
    1186: "interval",
    1266: "timetz",
    1560: "bit",
    1562: "varbit",
    1700: "numeric",
    2950: "uuid",
    3802: "jsonb",
    829: "macaddr",
}
#: Built-in array type OIDs -> element type OID.
ARRAY_ELEMENTS: dict[int, int] = {
    1000: 16,
    1001: 17,
    1002: 18,
    1003: 19,
    1016: 20,
    1005: 21,
    1007: 23,
    1009: 25,
    1028: 26,
    199: 114,
    143: 142,
    651: 650,
    1021: 700,
    1022: 701,
    791: 790,
    1041: 869,
    1014: 1042,
    1015: 1043,
    1182: 1082,
    1183: 1083,
    1115: 1114,
    1185: 1184,
    1187: 1186,
    1270: 1266,
    1561: 1560,
    1563: 1562,
    1231: 1700,
    2951: 2950,
    3807: 3802,
    1040: 829,
}
for _array_oid, _element in ARRAY_ELEMENTS.items():
    TYPE_NAMES[_array_oid] = "_" + TYPE_NAMES[_element]
#: Type name -> OID, to resolve non-built-in types (domains, enums) that pgoutput names in Type messages.
OIDS_BY_NAME: dict[str, int] = {name: oid for oid, name in TYPE_NAMES.items()}


def to_int(text: str) -> int:
    return int(text)


def to_bool(text: str) -> bool:
    return text == "t"


def to_float(text: str) -> float | str:
    """Floats as numbers; NaN and infinities as the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"``."""
    if text in ("NaN", "Infinity", "-Infinity"):
        return text
    return float(text)


def to_text(text: str) -> str:
    return text


def to_bytea(text: str) -> str:
    """Hex output (``\\xdeadbeef``) to base64."""
    if text.startswith("\\x"):
        return base64.b64encode(bytes.fromhex(text[2:])).decode("ascii")
    return base64.b64encode(_unescape_bytea(text)).decode("ascii")


def _unescape_bytea(text: str) -> bytes:
    out = bytearray()
    i = 0
    while i < len(text):
        char = text[i]
        if char == "\\" and text[i + 1] == "\\":
            out.append(0x5C)
            i += 2
        elif char == "\\":
            out.append(int(text[i + 1 : i + 4], 8))
            i += 4
        else:
            out += char.encode()
            i += 1
    return bytes(out)


def to_timestamp(text: str) -> str:
    """``2026-11-21 13:45:00.123456`` -> ``2026-11-21T13:45:00.123456``; infinity and BC stay text."""
    if text[0] not in "0123456789" or text.endswith(" BC"):
        return text
    return text.replace(" ", "T", 1)


_OFFSET = re.compile(r"([+-])(\d{2})(?::?(\d{2}))?(?::?(\d{2}))?$")


def to_timestamptz(text: str) -> str:
    """Any ISO offset (``+00``, ``+05:30``) -> the same instant in UTC with a ``Z`` suffix."""
    if text[0] not in "0123456789" or text.endswith(" BC"):
        return text
    if text.endswith("+00"):
        return text[:-3].replace(" ", "T", 1) + "Z"
    match = _OFFSET.search(text)
    if match is None:
        return text
    sign, hours, minutes, seconds = match.groups()
    offset = f"{sign}{hours}:{minutes or '00'}:{seconds or '00'}"
    base = text[: match.start()]
    try:
        moment = datetime.fromisoformat(base.replace(" ", "T", 1) + offset)
    except ValueError:
        return text
    utc = moment.astimezone(UTC).replace(tzinfo=None)
    fraction = base.partition(".")[2]
    shown = utc.isoformat(timespec="microseconds" if fraction else "seconds")
    if fraction:
        shown = shown[: len(shown) - 6 + len(fraction)]
    return shown + "Z"


def to_timetz(text: str) -> str:
    """``13:45:00+02`` -> ``13:45:00+02:00`` (offset always as ±HH:MM[:SS])."""
    match = _OFFSET.search(text)
    if match is None:
        return text
    sign, hours, minutes, seconds = match.groups()
    offset = f"{sign}{hours}:{minutes or '00'}" + (f":{seconds}" if seconds else "")
    return text[: match.start()] + offset


SCALARS: dict[str, Converter] = {
    "bool": to_bool,
    "int2": to_int,
    "int4": to_int,
    "int8": to_int,
    "oid": to_int,
    "float4": to_float,
    "float8": to_float,
    "bytea": to_bytea,
    "timestamp": to_timestamp,
    "timestamptz": to_timestamptz,
    "timetz": to_timetz,
}


def parse_array(text: str, element: Converter) -> Any:
    """A PostgreSQL array literal (``{a,"b,c",NULL,{1,2}}``, optional ``[l:u]=`` bounds) -> nested lists."""
    if text.startswith("["):
        text = text[text.index("=") + 1 :]
    value, end = _parse_array_at(text, 0, element)
    if end != len(text):
        raise ValueError(f"trailing characters after array literal: {text[end:]!r}")
    return value


def _parse_array_at(text: str, pos: int, element: Converter) -> tuple[list[Any], int]:
    if text[pos] != "{":
        raise ValueError(f"array literal expected at {pos}: {text!r}")
    pos += 1
    items: list[Any] = []
    if text[pos] == "}":
        return items, pos + 1
    while True:
        char = text[pos]
        if char == "{":
            nested, pos = _parse_array_at(text, pos, element)
            items.append(nested)
        elif char == '"':
            pos += 1
            chunk: list[str] = []
            while text[pos] != '"':
                if text[pos] == "\\":
                    pos += 1
                chunk.append(text[pos])
                pos += 1
            pos += 1
            items.append(element("".join(chunk)))
        else:
            end = pos
            while text[end] not in ",}":
                end += 1
            raw = text[pos:end]
            items.append(None if raw == "NULL" else element(raw))
            pos = end
        if text[pos] == ",":
            pos += 1
            continue
        if text[pos] == "}":
            return items, pos + 1
        raise ValueError(f"unexpected {text[pos]!r} at {pos} in array literal")


def converter_for(type_oid: int, type_names: dict[int, str] | None = None) -> Converter:
    """The converter of one column type; ``type_names`` resolves OIDs of non-built-in types by name.

    A domain is converted as its base type and an enum keeps its label (pgoutput names a domain's base
    type in its Type message); an unknown type keeps its text form.
    """
    name = TYPE_NAMES.get(type_oid) or (type_names or {}).get(type_oid, "")
    if name.startswith("_"):
        element_oid = OIDS_BY_NAME.get(name[1:], 0)
        element = converter_for(element_oid, type_names) if element_oid else to_text
        return lambda text: parse_array(text, element)
    return SCALARS.get(name, to_text)


def type_name(type_oid: int, type_names: dict[int, str] | None = None) -> str:
    """pg_type.typname of a column type (``numeric``, ``_text``), or ``"oid:<n>"`` when unknown."""
    return TYPE_NAMES.get(type_oid) or (type_names or {}).get(type_oid) or f"oid:{type_oid}"
