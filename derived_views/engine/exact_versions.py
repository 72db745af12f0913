"""Which Delta version of a view table is exact as of a given position, read from the table's own log.

A *position* P stands for the source's state holding every transaction whose commit LSN is <= P (the
log's watermark positions, :mod:`derived_views.engine.progress`). Every commit that applies log events
to a view table records its :class:`~derived_views.engine.progress.Progress`: the position it is as of,
the commit LSN of the newest event its data holds (:attr:`~derived_views.engine.progress.Progress.since`)
and the position the table's previous data was last recorded exact as of
(:attr:`~derived_views.engine.progress.Progress.prior`). So the data a commit leaves equals the source
as of every position from its ``since`` to its own position, and, unchanged, up to the ``prior`` of the
next commit with progress: steps that found no event for the table moved its position on in its
position file (:mod:`derived_views.engine.positions`), and the newest data is exact up to where that
file says. A :class:`Span` is one version's data with that closed range of positions.

A position between two spans of a table (after the last step that left its data unchanged, before the
step that changed it) is one no version is known to be exact as of: a step applies every transaction
up to its watermark at once. Readers ask for positions the views were synced at, or ``latest``.

Commits without progress of the kinds in :data:`SAME_DATA` (a compaction, a vacuum's markers, table
properties) leave rows and schema as they were: a span's version moves on to the newest of them, whose
files a vacuum keeps longest. Any other commit without progress (a column added or renamed before a
batch) stops that: the span keeps the version before it.

**Readable versions.** A version's files are needed until a later commit removes them from the table.
``VACUUM ... RETAIN n HOURS`` deletes a file only once the commit that removed it is more than ``n``
hours old, and the Delta log keeps the commits (and, in checkpoints, the record of removed files) for
``delta.logRetentionDuration`` and ``delta.deletedFileRetentionDuration``, which maintenance raises to
the vacuum's retention when they are shorter (:mod:`derived_views.engine.maintenance`). So a span's
version is readable while the commit after it is younger than the retention, and the newest version
always: :meth:`Span.readable`.

Everything here but :class:`TableLog` is pure logic over commits read already.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from derived_views.engine.positions import with_position
from derived_views.engine.progress import Progress

#: Operations of commits without progress that change neither the rows nor the schema of a table.
SAME_DATA = frozenset({"OPTIMIZE", "VACUUM START", "VACUUM END", "SET TBLPROPERTIES", "UNSET TBLPROPERTIES"})


@dataclass(frozen=True)
class Commit:
    """One commit of a table's Delta log: its version, time, operation and progress (``None``: none)."""

    version: int
    timestamp_ms: int
    operation: str
    progress: Progress | None = None

    @classmethod
    def of(cls, info: Mapping[str, Any]) -> Commit:
        """A commit from its commit info as ``deltalake``'s ``DeltaTable.history`` returns it."""
        progress = Progress.from_json(info.get("userMetadata"))
        return cls(
            int(info["version"]),
            int(info.get("timestamp") or 0),
            str(info.get("operation") or ""),
            progress if progress is not None and progress.position else None,
        )


@dataclass(frozen=True)
class Span:
    """The data of a table at ``version`` equals its source tables as of every position from ``first``
    to ``last`` (both included); ``replaced_ms``: when the commit after ``version`` was made (``None``:
    ``version`` is the table's newest)."""

    version: int
    first: int
    last: int
    replaced_ms: int | None = None

    def covers(self, position: int) -> bool:
        """Whether the span's data is exact as of ``position``."""
        return self.first <= position <= self.last

    def readable(self, window_start_ms: int) -> bool:
        """Whether the version is kept readable by a retention reaching back to ``window_start_ms``: it is
        the newest, or the commit that replaced it is no older than that."""
        return self.replaced_ms is None or self.replaced_ms >= window_start_ms


@dataclass
class _Open:
    version: int
    first: int
    last: int
    frozen: bool = False


def spans(commits: Iterable[Commit], reached: int | None = None) -> list[Span]:
    """The spans of a table, oldest first, from ``commits``: a run of its newest commits without a gap
    (any order). ``reached``: the position the table's newest commit with progress is recorded exact as
    of now (moved on by its position file), which extends the newest span. A span whose data holds an
    event after its own position (``first`` > ``last``) is exact as of no position and left out."""
    ordered = sorted(commits, key=lambda commit: commit.version)
    closed: list[_Open] = []
    current: _Open | None = None
    for commit in ordered:
        progress = commit.progress
        if progress is not None:
            if current is not None:
                if progress.prior and int(progress.prior, 16) > current.last:
                    current.last = int(progress.prior, 16)
                closed.append(current)
            current = _Open(commit.version, progress.since_lsn, progress.lsn)
        elif current is not None and not current.frozen and commit.operation in SAME_DATA:
            current.version = commit.version
        elif current is not None:
            current.frozen = True
    if current is not None:
        if reached is not None and reached > current.last:
            current.last = reached
        closed.append(current)
    times = {commit.version: commit.timestamp_ms for commit in ordered}
    return [Span(span.version, span.first, span.last, times.get(span.version + 1)) for span in closed if span.first <= span.last]


def at(table_spans: Sequence[Span], position: int) -> Span | None:
    """The span of the newest version exact as of ``position`` (``None``: no version is)."""
    covering = [span for span in table_spans if span.covers(position)]
    return max(covering, key=lambda span: span.version) if covering else None


def newest_at_or_below(table_spans: Sequence[Span], position: int) -> int | None:
    """The newest position no later than ``position`` that a version is exact as of (``None``: none)."""
    found = [min(span.last, position) for span in table_spans if span.first <= position]
    return max(found) if found else None


def oldest_at_or_above(table_spans: Sequence[Span], position: int) -> int | None:
    """The oldest position no earlier than ``position`` that a version is exact as of (``None``: none)."""
    found = [max(span.first, position) for span in table_spans if span.last >= position]
    return min(found) if found else None


def common_at_or_below(spans_of: Callable[[str, int], Sequence[Span]], names: Iterable[str], position: int) -> int | None:
    """The newest position no later than ``position`` that every table ``names`` has a version exact as
    of (``None``: there is none). ``spans_of(name, p)`` gives a table's spans, at least those reaching
    down to ``p``."""
    names = list(names)
    while True:
        lowest = position
        for name in names:
            found = newest_at_or_below(spans_of(name, position), position)
            if found is None:
                return None
            lowest = min(lowest, found)
        if lowest == position:
            return position
        position = lowest


def common_at_or_above(spans_by_name: Mapping[str, Sequence[Span]], position: int) -> int | None:
    """The oldest position no earlier than ``position`` that every table has a version exact as of,
    among the spans ``spans_by_name`` gives (``None``: there is none)."""
    while True:
        highest = position
        for table_spans in spans_by_name.values():
            found = oldest_at_or_above(table_spans, position)
            if found is None:
                return None
            highest = max(highest, found)
        if highest == position:
            return position
        position = highest


@dataclass
class TableLog:
    """A view table's spans, read from its Delta log with ``deltalake`` (no Spark) newest first, as far
    back as a question needs and never past the versions a retention reaching back to
    ``window_start_ms`` keeps readable."""

    path: str
    window_start_ms: int
    _read: int = 0
    _complete: bool = False
    _spans: list[Span] = field(default_factory=list)
    _table: Any = None

    def exists(self) -> bool:
        """Whether the table exists."""
        from deltalake import DeltaTable

        return bool(DeltaTable.is_deltatable(self.path))

    def readable_down_to(self, position: int) -> list[Span]:
        """The readable spans (oldest first), read back until one starts at or before ``position`` or
        no older version is readable."""
        while not self._complete and (not self._spans or self._spans[0].first > position):
            self._read_more()
        return [span for span in self._spans if span.readable(self.window_start_ms)]

    def reached(self) -> int | None:
        """The position the table is exact as of now (``None``: it has no commit with progress)."""
        newest = self.readable_down_to(1 << 64)
        return newest[-1].last if newest else None

    def _read_more(self) -> None:
        from deltalake import DeltaTable

        limit = max(64, self._read * 8)
        if self._table is None:
            self._table = DeltaTable(self.path)  # opened once: its history is then read as far as needed
        history = self._table.history(limit)
        commits = [Commit.of(info) for info in history]
        self._read = limit
        newest = max((c for c in commits if c.progress is not None), key=lambda c: c.version, default=None)
        recorded = with_position(self.path, newest.progress) if newest is not None and newest.progress else None
        self._spans = spans(commits, recorded.lsn if recorded is not None else None)
        oldest = min((c.timestamp_ms for c in commits), default=0)
        self._complete = len(history) < limit or oldest < self.window_start_ms
