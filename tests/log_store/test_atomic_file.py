"""Durable file primitives: ``writev_all`` writes every buffer, in order, whatever the kernel takes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from log_store import atomic_file
from log_store.atomic_file import writev_all


def _buffers() -> list[bytes]:
    return [bytes([i % 251]) * (i % 7 + 1) for i in range(2500)]  # more than IOV_MAX buffers


def test_writev_all_writes_more_buffers_than_iov_max(tmp_path: Path) -> None:
    buffers = _buffers()
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        writev_all(fd, buffers, sum(map(len, buffers)))
    finally:
        os.close(fd)
    assert (tmp_path / "f").read_bytes() == b"".join(buffers)


def test_writev_all_finishes_short_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.writev

    def short(fd: int, buffers: list[bytes]) -> int:
        data = b"".join(buffers)
        return real(fd, [data[: max(1, len(data) // 3)]])

    monkeypatch.setattr(atomic_file.os, "writev", short)
    buffers = _buffers()
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        writev_all(fd, buffers, sum(map(len, buffers)))
    finally:
        os.close(fd)
    assert (tmp_path / "f").read_bytes() == b"".join(buffers)
