"""An append-only buffer of byte strings that moves to a temporary file past a memory limit."""

from __future__ import annotations

import struct
import tempfile
from collections.abc import Iterator
from typing import IO

_LEN = struct.Struct("!I")


class SpillBuffer:
    """Keeps items in order; holds at most ``memory_limit`` bytes in memory, the rest on disk.

    The file is anonymous (deleted on close or process exit) and is never part of durability: a
    crash loses it and the transaction is simply received again from the slot.
    """

    def __init__(self, memory_limit: int = 8 << 20) -> None:
        self._items: list[bytes] = []
        self._memory = 0
        self._limit = memory_limit
        self._file: IO[bytes] | None = None
        self.count = 0

    def append(self, item: bytes) -> None:
        self.count += 1
        if self._file is not None:
            self._file.write(_LEN.pack(len(item)))
            self._file.write(item)
            return
        self._items.append(item)
        self._memory += len(item)
        if self._memory > self._limit:
            self._spill()

    def extend(self, items: list[bytes]) -> None:
        """Append every item of ``items`` in order (as :meth:`append` one by one would)."""
        if self._file is not None:
            for item in items:
                self.append(item)
            return
        self.count += len(items)
        self._items += items
        self._memory += sum(map(len, items))
        if self._memory > self._limit:
            self._spill()

    def _spill(self) -> None:
        self._file = tempfile.TemporaryFile(prefix="cdc-spill-")  # noqa: SIM115 - closed by close()
        for held in self._items:
            self._file.write(_LEN.pack(len(held)))
            self._file.write(held)
        self._items = []
        self._memory = 0

    @property
    def spilled(self) -> bool:
        return self._file is not None

    def __iter__(self) -> Iterator[bytes]:
        """Every item in append order; iterating again starts from the first item."""
        if self._file is None:
            yield from self._items
            return
        self._file.flush()
        self._file.seek(0)
        read = self._file.read
        while header := read(4):
            yield read(_LEN.unpack(header)[0])
        self._file.seek(0, 2)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        self._items = []
