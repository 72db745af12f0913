"""Recorded pgoutput bytes and hand-built messages and shapes, shared by the unit tests of capture."""

from __future__ import annotations

import json
from pathlib import Path

from cdc.capture.tables import TableShape

RECORDED = Path(__file__).parent / "data" / "pgoutput_v2.jsonl"


def recorded() -> list[tuple[int, bytes]]:
    """Every pgoutput message a real server sent in the recorded session, with its LSN."""
    rows = [json.loads(line) for line in RECORDED.read_text().splitlines() if line]
    return [(row["lsn"], bytes.fromhex(row["hex"])) for row in rows]


def hand_message(kind: bytes, *parts: bytes) -> bytes:
    """A pgoutput message built by hand: its kind byte, then its fields."""
    return kind + b"".join(parts)


def sample_shape() -> TableShape:
    """``public.t (id bigint key, big text, n int)``: a table whose ``big`` column can be TOASTed."""
    return TableShape.build(1, "public", "t", "cdc.public.t", [("id", 20, -1), ("big", 25, -1), ("n", 23, -1)], ["id"])
