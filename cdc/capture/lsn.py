"""An ordered PostgreSQL WAL position (LSN) with its text forms."""

from __future__ import annotations

import re

_TEXT = re.compile(r"^([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})$")


class Lsn(int):
    """A 64-bit WAL position; ordered and hashable like the integer it is.

    ``str(lsn)`` is PostgreSQL's ``XXXXXXXX/XXXXXXXX`` form; :meth:`hex16` is the zero-padded upper-case
    form the log uses as its watermark position, chosen so that string order equals LSN order.
    """

    __slots__ = ()

    MAX = (1 << 64) - 1

    def __new__(cls, value: int = 0) -> Lsn:
        if not 0 <= value <= cls.MAX:
            raise ValueError(f"LSN {value} is outside 0..2**64-1")
        return super().__new__(cls, value)

    @classmethod
    def parse(cls, text: str) -> Lsn:
        """Read PostgreSQL's ``hi/lo`` text form (as in ``pg_current_wal_lsn()``)."""
        match = _TEXT.match(text.strip())
        if match is None:
            raise ValueError(f"{text!r} is not an LSN such as 0/16B3748")
        return cls((int(match.group(1), 16) << 32) | int(match.group(2), 16))

    @classmethod
    def from_hex16(cls, text: str) -> Lsn:
        """Read the 16-hex-digit form written by :meth:`hex16`."""
        if len(text) != 16:
            raise ValueError(f"{text!r} is not a 16-digit hexadecimal LSN")
        return cls(int(text, 16))

    def hex16(self) -> str:
        """Zero-padded upper-case hex (``"%016X"``): string order equals LSN order."""
        return f"{int(self):016X}"

    def __str__(self) -> str:
        return f"{int(self) >> 32:X}/{int(self) & 0xFFFFFFFF:X}"

    def __repr__(self) -> str:
        return f"Lsn('{self}')"
