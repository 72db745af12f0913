"""An append-only buffer of byte strings, each with its WAL position, that moves to a temporary file
past a memory limit.

What a spill file holds is encrypted (AES-256 in counter mode) with a key made for that file and kept
only in memory: a transaction's changes are pgoutput's raw messages, which hold the clear values of
masked columns (masks apply when the events are built, after the commit), and no byte of those may
reach a disk. The file is deleted when closed, and its key dies with the process.
"""

from __future__ import annotations

import os
import struct
import tempfile
from array import array
from collections.abc import Iterator, Sequence
from typing import IO

from cryptography.hazmat.primitives.ciphers import Cipher, CipherContext, algorithms, modes

#: an item on disk: its length, its LSN, then its bytes
_HEADER = struct.Struct("!IQ")


class SpillBuffer:
    """Keeps items in order, each with the LSN it came at (so that an error about an item can name
    where it is in the WAL); holds at most ``memory_limit`` bytes in memory (8 of them per item for
    its LSN), the rest on disk.

    The file is anonymous (deleted on close or process exit) and is never part of durability: a
    crash loses it and the transaction is simply received again from the slot.
    """

    def __init__(self, memory_limit: int = 8 << 20) -> None:
        self._items: list[bytes] = []
        self._lsns = array("Q")
        self._memory = 0
        self._limit = memory_limit
        self._file: IO[bytes] | None = None
        self._cipher: Cipher[modes.CTR] | None = None
        self._encryptor: CipherContext | None = None
        self.count = 0

    def append(self, item: bytes, lsn: int = 0) -> None:
        """Append ``item``, which came at ``lsn`` (0: unknown)."""
        self.count += 1
        if self._file is not None:
            self._write(_HEADER.pack(len(item), lsn) + item)
            return
        self._items.append(item)
        self._lsns.append(lsn)
        self._memory += len(item) + 8
        if self._memory > self._limit:
            self._spill()

    def extend(self, items: list[bytes], lsns: Sequence[int]) -> None:
        """Append every item of ``items`` in order, each at the LSN of ``lsns`` at its index (as
        :meth:`append` one by one would)."""
        if len(lsns) != len(items):
            raise ValueError(f"{len(items)} items but {len(lsns)} LSNs")
        self.count += len(items)
        if self._file is not None:
            self._write(b"".join(_HEADER.pack(len(item), lsn) + item for item, lsn in zip(items, lsns, strict=True)))
            return
        self._items += items
        self._lsns.extend(lsns)
        self._memory += sum(map(len, items)) + 8 * len(items)
        if self._memory > self._limit:
            self._spill()

    def _spill(self) -> None:
        self._file = tempfile.TemporaryFile(prefix="cdc-spill-")  # noqa: SIM115 - closed by close()
        self._cipher = Cipher(algorithms.AES(os.urandom(32)), modes.CTR(os.urandom(16)))
        self._encryptor = self._cipher.encryptor()
        self._write(b"".join(_HEADER.pack(len(held), lsn) + held for held, lsn in zip(self._items, self._lsns, strict=True)))
        self._items = []
        self._lsns = array("Q")
        self._memory = 0

    def _write(self, data: bytes) -> None:
        assert self._file is not None and self._encryptor is not None
        self._file.write(self._encryptor.update(data))

    @property
    def spilled(self) -> bool:
        return self._file is not None

    def __iter__(self) -> Iterator[bytes]:
        """Every item in append order; iterating again starts from the first item."""
        for _, item in self.positioned():
            yield item

    def positioned(self) -> Iterator[tuple[int, bytes]]:
        """Every item in append order with the LSN it came at; iterating again starts from the first."""
        if self._file is None:
            yield from zip(self._lsns, self._items, strict=True)
            return
        assert self._cipher is not None
        self._file.flush()
        self._file.seek(0)
        decrypt = self._cipher.decryptor().update  # counter mode: a new decryptor reads from the start
        read = self._file.read
        while header := read(_HEADER.size):
            length, lsn = _HEADER.unpack(decrypt(header))
            yield lsn, decrypt(read(length))
        self._file.seek(0, 2)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        self._items = []
        self._lsns = array("Q")
