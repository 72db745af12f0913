"""The writer's fdatasync pool: calls run on other threads, completion and errors reach the caller."""

from __future__ import annotations

import threading
from functools import partial

import pytest

from log_store.sync_pool import SyncPool


def test_calls_run_concurrently_on_pool_threads() -> None:
    pool = SyncPool(workers=3)
    barrier = threading.Barrier(3, timeout=30)  # only passes when three calls run at the same time
    names: list[str] = []

    def call() -> None:
        names.append(threading.current_thread().name)
        barrier.wait()

    try:
        for pending in [pool.start(call) for _ in range(3)]:
            pending.wait()
        assert len(set(names)) == 3 and threading.current_thread().name not in names
        for pending in [pool.start(call) for _ in range(3)]:  # idle threads are reused
            pending.wait()
        assert len(set(names)) == 3
    finally:
        pool.close()


def test_wait_reraises_the_calls_error_and_the_pool_stays_usable() -> None:
    pool = SyncPool(workers=1)

    def broken() -> None:
        raise OSError(5, "Input/output error")

    try:
        with pytest.raises(OSError, match="Input/output"):
            pool.start(broken).wait()
        done: list[int] = []
        pool.start(lambda: done.append(1)).wait()
        assert done == [1]
    finally:
        pool.close()


def test_more_calls_than_workers_queue_up_and_all_finish() -> None:
    pool = SyncPool(workers=2)
    done: list[int] = []
    lock = threading.Lock()

    def call(i: int) -> None:
        with lock:
            done.append(i)

    try:
        for pending in [pool.start(partial(call, i)) for i in range(20)]:
            pending.wait()
        assert sorted(done) == list(range(20))
        assert len(pool._threads) <= 2
    finally:
        pool.close()
    pool.close()  # idempotent
