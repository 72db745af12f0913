"""cdc.capture.values: column values by type OID."""

from __future__ import annotations

from cdc.capture.values import converter_for, parse_array, to_float, to_text, to_timestamptz


def test_values_by_type_oid() -> None:
    assert converter_for(20)("9223372036854775807") == 9223372036854775807
    assert converter_for(1700)("12345678901234567890.000000001") == "12345678901234567890.000000001"
    assert converter_for(16)("t") is True and converter_for(16)("f") is False
    assert to_float("NaN") == "NaN" and to_float("-Infinity") == "-Infinity" and to_float("1.5") == 1.5
    assert converter_for(17)("\\xdeadbeef") == "3q2+7w=="
    assert converter_for(1114)("2026-11-21 13:45:00.123456") == "2026-11-21T13:45:00.123456"
    assert to_timestamptz("2026-11-21 13:45:00.123456+02") == "2026-11-21T11:45:00.123456Z"
    assert to_timestamptz("2026-11-21 13:45:00+05:30") == "2026-11-21T08:15:00Z"
    assert to_timestamptz("infinity") == "infinity"
    assert converter_for(1082)("2026-11-21") == "2026-11-21"
    assert converter_for(1266)("13:45:00+02") == "13:45:00+02:00"
    assert converter_for(3802)('{"a": 1}') == '{"a": 1}'
    assert converter_for(1009)('{x,"y,z",NULL,"NULL","a\\"b"}') == ["x", "y,z", None, "NULL", 'a"b']
    assert converter_for(1007)("{{1,2},{3,4}}") == [[1, 2], [3, 4]]
    assert parse_array("[0:1]={1,2}", int) == [1, 2]
    assert converter_for(1186)("1 day 02:00:00") == "1 day 02:00:00"
    assert converter_for(99999, {99999: "int4"})("7") == 7  # a domain over int4
    assert converter_for(99998, {99998: "mood"})("happy") == "happy"  # an enum label
    assert converter_for(424242) is to_text
