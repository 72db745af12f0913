"""An append-only buffer of byte strings that moves to a temporary file past a memory limit.

What a spill file holds is encrypted (AES-256 in counter mode) with a key made for that file and kept
only in memory: a transaction's changes are pgoutput's raw messages, which hold the clear values of
masked columns (masks apply when the events are built, after the commit), and no byte of those may
reach a disk. The file is deleted when closed, and its key dies with the process.
"""

from __future__ import annotations

import os
import struct
import tempfile
from collections.abc import Iterator
from typing import IO

from cryptography.hazmat.primitives.ciphers import Cipher, CipherContext, algorithms, modes

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
        self._cipher: Cipher[modes.CTR] | None = None
        self._encryptor: CipherContext | None = None
        self.count = 0

    def append(self, item: bytes) -> None:
        self.count += 1
        if self._file is not None:
            self._write(_LEN.pack(len(item)) + item)
            return
        self._items.append(item)
        self._memory += len(item)
        if self._memory > self._limit:
            self._spill()

    def extend(self, items: list[bytes]) -> None:
        """Append every item of ``items`` in order (as :meth:`append` one by one would)."""
        if self._file is not None:
            self.count += len(items)
            self._write(b"".join(_LEN.pack(len(item)) + item for item in items))
            return
        self.count += len(items)
        self._items += items
        self._memory += sum(map(len, items))
        if self._memory > self._limit:
            self._spill()

    def _spill(self) -> None:
        self._file = tempfile.TemporaryFile(prefix="cdc-spill-")  # noqa: SIM115 - closed by close()
        self._cipher = Cipher(algorithms.AES(os.urandom(32)), modes.CTR(os.urandom(16)))
        self._encryptor = self._cipher.encryptor()
        self._write(b"".join(_LEN.pack(len(held)) + held for held in self._items))
        self._items = []
        self._memory = 0

    def _write(self, data: bytes) -> None:
        assert self._file is not None and self._encryptor is not None
        self._file.write(self._encryptor.update(data))

    @property
    def spilled(self) -> bool:
        return self._file is not None

    def __iter__(self) -> Iterator[bytes]:
        """Every item in append order; iterating again starts from the first item."""
        if self._file is None:
            yield from self._items
            return
        assert self._cipher is not None
        self._file.flush()
        self._file.seek(0)
        decrypt = self._cipher.decryptor().update  # counter mode: a new decryptor reads from the start
        read = self._file.read
        while header := read(4):
            yield decrypt(read(_LEN.unpack(decrypt(header))[0]))
        self._file.seek(0, 2)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        self._items = []
