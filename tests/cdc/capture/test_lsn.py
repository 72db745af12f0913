"""cdc.capture.lsn: the text forms and order of WAL positions."""

from __future__ import annotations

import pytest

from cdc.capture.lsn import Lsn


def test_lsn_text_forms_and_order() -> None:
    lsn = Lsn.parse("16/B374D848")
    assert int(lsn) == (0x16 << 32) | 0xB374D848
    assert str(lsn) == "16/B374D848"
    assert lsn.hex16() == "00000016B374D848"
    assert Lsn.from_hex16(lsn.hex16()) == lsn
    values = [Lsn(5), Lsn(1 << 40), Lsn(0x10), Lsn(0)]
    assert sorted(v.hex16() for v in values) == [v.hex16() for v in sorted(values)]
    with pytest.raises(ValueError):
        Lsn.parse("nope")
    with pytest.raises(ValueError):
        Lsn(-1)
