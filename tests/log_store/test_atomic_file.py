"""Durable file primitives: ``writev_all`` writes every buffer, in order, whatever the kernel takes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from log_store import atomic_file
from log_store.atomic_file import start_writeback, writev_all


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


def test_start_writeback_is_a_hint_that_never_raises(tmp_path: Path) -> None:
    path = tmp_path / "f"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, b"x" * 10_000)
        start_writeback(fd)
        os.fdatasync(fd)
    finally:
        os.close(fd)
    start_writeback(fd)  # a closed descriptor: the error is left to the fdatasync that would follow
    assert path.read_bytes() == b"x" * 10_000
