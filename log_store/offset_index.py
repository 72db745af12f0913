"""The sparse offset index of one segment: ``<base_offset:020d>.index`` beside ``<base>.log``.

File layout (big-endian)::

    offset  size  field
         0     4  magic          b"CIDX"
         4     2  version        1
         6     2  entry_size     8
         8     8  segment_nonce  uint64, the nonce in the header of the segment file it indexes
        16     .  entries: relative_offset uint32, position uint32 (8 bytes each)

An entry says "the batch whose base offset is ``base_offset + relative_offset`` starts at byte
``position`` of the segment file". The writer adds an entry each time at least ``index_interval_bytes``
of batches were written since the previous one, so lookups scan at most that much. Both columns are
strictly increasing. Lookup returns the greatest entry whose offset is <= the target.

The index carries no checksum: it is a hint. It belongs to exactly one segment file instance (the nonce
must match; compaction writes a new segment with a new nonce), a trailing partial entry is ignored, and
readers check that a batch with exactly the entry's base offset starts at a looked-up position (so a
damaged entry can only cost speed), falling back to a scan from the segment's start. After an unclean shutdown
the writer rebuilds the index of every partition's last segment; sealed segments' indexes were fsynced
when the segment was sealed. Readers never write an index: a missing or mismatched one is rebuilt in
memory by walking batch headers.
"""

from __future__ import annotations

import struct
import sys
from array import array
from bisect import bisect_right
from pathlib import Path

MAGIC = b"CIDX"
VERSION = 1
FILE_HEADER = struct.Struct(">4sHHQ")
FILE_HEADER_SIZE = FILE_HEADER.size  # 16
ENTRY = struct.Struct(">II")
ENTRY_SIZE = ENTRY.size


def index_path(log_path: Path) -> Path:
    """The index file that goes with a segment file."""
    return log_path.with_suffix(".index")


class OffsetIndex:
    """In-memory sparse index: parallel arrays of relative offsets and byte positions."""

    __slots__ = ("offsets", "positions")

    def __init__(self) -> None:
        self.offsets = array("I")
        self.positions = array("I")

    def __len__(self) -> int:
        return len(self.offsets)

    def append(self, relative_offset: int, position: int) -> bytes:
        """Add an entry (both columns must grow) and return its on-disk bytes."""
        if self.offsets and (relative_offset <= self.offsets[-1] or position <= self.positions[-1]):
            raise ValueError(
                f"index entry ({relative_offset}, {position}) does not follow ({self.offsets[-1]}, {self.positions[-1]})"
            )
        self.offsets.append(relative_offset)
        self.positions.append(position)
        return ENTRY.pack(relative_offset, position)

    def lookup(self, relative_offset: int) -> tuple[int, int] | None:
        """The greatest entry whose offset is <= ``relative_offset``, as (offset, position)."""
        i = bisect_right(self.offsets, relative_offset)
        if i == 0:
            return None
        return self.offsets[i - 1], self.positions[i - 1]

    def last(self) -> tuple[int, int] | None:
        """The last entry, or ``None`` when empty."""
        if not self.offsets:
            return None
        return self.offsets[-1], self.positions[-1]

    def to_bytes(self, nonce: int) -> bytes:
        """The whole index file."""
        pairs = array("I", bytes(len(self.offsets) * ENTRY_SIZE))
        pairs[0::2] = self.offsets
        pairs[1::2] = self.positions
        if pairs.itemsize != 4:  # pragma: no cover - array('I') is 4 bytes on every supported platform
            raise RuntimeError("array('I') is not 32-bit here")
        if sys.byteorder == "little":
            pairs.byteswap()
        return FILE_HEADER.pack(MAGIC, VERSION, ENTRY_SIZE, nonce) + pairs.tobytes()

    @classmethod
    def from_bytes(cls, data: bytes, nonce: int) -> OffsetIndex | None:
        """Parse an index file; ``None`` when it is not an index of the segment with ``nonce``."""
        if len(data) < FILE_HEADER_SIZE:
            return None
        magic, version, entry_size, file_nonce = FILE_HEADER.unpack_from(data, 0)
        if magic != MAGIC or version != VERSION or entry_size != ENTRY_SIZE or file_nonce != nonce:
            return None
        usable = (len(data) - FILE_HEADER_SIZE) // ENTRY_SIZE * ENTRY_SIZE
        pairs = array("I")
        pairs.frombytes(data[FILE_HEADER_SIZE : FILE_HEADER_SIZE + usable])
        if sys.byteorder == "little":
            pairs.byteswap()
        index = cls()
        index.offsets = pairs[0::2]
        index.positions = pairs[1::2]
        return index

    @classmethod
    def load(cls, path: Path, nonce: int) -> OffsetIndex | None:
        """Read the index file at ``path``; ``None`` when missing, foreign or malformed."""
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        return cls.from_bytes(data, nonce)
