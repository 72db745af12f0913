"""Concurrent ``fdatasync`` calls for the writer: a few persistent threads and a lean hand-off.

:meth:`LogStore.append_group` makes a group's touched segments and its watermark record durable with
concurrent ``fdatasync`` calls (several files' flushes then share the file system's journal commits
and the disk's cache flushes instead of queueing behind each other). The calls release the GIL, so
threads give real concurrency. A general-purpose executor costs tens of microseconds per call in
futures, conditions and thread bookkeeping; this pool hands a call to an idle thread with one C-level
queue ``put`` and reports completion through one lock, which matters when a group takes well under a
millisecond.

Guarantees: :meth:`SyncPool.start` runs the call on another thread and :meth:`Pending.wait` returns
only after it finished, re-raising its exception if it raised. Threads are started lazily (at most
``workers``), are daemons (an unclosed pool never blocks interpreter exit) and end on :meth:`close`.
Not thread-safe on its own: the store calls it under its write lock. Not fork-safe (nor is the store).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from queue import SimpleQueue


class Pending:
    """A call handed to the pool; :meth:`wait` blocks until it finished."""

    __slots__ = ("_done", "error")

    def __init__(self) -> None:
        self._done = threading.Lock()
        self._done.acquire()
        self.error: BaseException | None = None

    def finish(self, error: BaseException | None) -> None:
        """Called once by the worker when the call returned (``error``: what it raised)."""
        self.error = error
        self._done.release()

    def wait(self) -> None:
        """Block until the call finished; re-raise its exception."""
        self._done.acquire()
        self._done.release()
        if self.error is not None:
            raise self.error


class SyncPool:
    """Up to ``workers`` persistent daemon threads running short blocking calls (``fdatasync``)."""

    def __init__(self, workers: int = 4, name: str = "log-fsync") -> None:
        self._workers = workers
        self._name = name
        self._jobs: SimpleQueue[tuple[Callable[[], object], Pending] | None] = SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._idle = 0
        self._idle_lock = threading.Lock()

    def start(self, call: Callable[[], object]) -> Pending:
        """Run ``call`` on a pool thread; the returned :class:`Pending` tells when it finished."""
        pending = Pending()
        with self._idle_lock:
            if self._idle:
                self._idle -= 1
                spawn = False
            else:
                spawn = len(self._threads) < self._workers
        if spawn:
            thread = threading.Thread(target=self._work, name=f"{self._name}-{len(self._threads)}", daemon=True)
            self._threads.append(thread)
            thread.start()
        self._jobs.put((call, pending))
        return pending

    def _work(self) -> None:
        jobs = self._jobs
        while True:
            job = jobs.get()
            if job is None:
                return
            call, pending = job
            try:
                call()
            except BaseException as exc:  # handed to the waiting caller
                pending.finish(exc)
            else:
                pending.finish(None)
            del job, call, pending
            with self._idle_lock:
                self._idle += 1

    def close(self) -> None:
        """Let every thread finish its current call and end (idempotent)."""
        threads, self._threads = self._threads, []
        for _ in threads:
            self._jobs.put(None)
        for thread in threads:
            thread.join()
        self._idle = 0
