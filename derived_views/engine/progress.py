"""A view table's position in the log, as a plain value: :class:`Progress`, what the table has applied.

A :class:`Progress` holds the next log offset of every topic-partition the table consumes and the commit
watermark those offsets belong to (its LSN as ``"%016X"`` and its time); it is the view's as-of
watermark (promise 5). Its JSON text (:meth:`Progress.to_json`) is what the table's Delta commits carry
as their ``userMetadata`` (:mod:`derived_views.engine.commit_progress`), and what a position file beside
an idle table holds (:mod:`derived_views.engine.positions`).

A commit's progress also bounds the positions its data is exact as of, for reads of older versions
(:mod:`derived_views.engine.exact_versions`): :attr:`Progress.since`, the commit LSN of the newest event the
data holds (the data equals the source as of every position from there to :attr:`Progress.position`),
and :attr:`Progress.prior`, the position the table's previous data was last recorded exact as of (its
position file's, when a step left it idle before this commit).

Why here, in the bottom layer, and not with the reading of the log (:mod:`derived_views.source`): the
engine itself reads and writes progress (the Delta commits that carry it, position files, the versions a
table is exact as of, earlier versions dropped), and a layer imports only its own and lower ones. So the
pure value lives in this module, which imports nothing but the standard library and knows no Spark, no
Delta and no log reader; what Delta does with it is in :mod:`derived_views.engine.commit_progress`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

_MARK = "cdc-progress"


@dataclass(frozen=True)
class Progress:
    """Applied position of one table: next offsets per topic-partition plus the watermark they end at."""

    offsets: dict[str, dict[str, int]] = field(default_factory=dict)
    position: str = ""
    watermark_ts_ms: int = 0
    definition: str = ""
    """Fingerprint of the views-file definition the table was computed with (search indexes and cache
    entities, :attr:`derived_views.views.composite.Composite.fingerprint`; empty for other tables)."""
    base: str = ""
    """Position of the commit this progress extends when it was recorded without a commit of its own, in
    the table's position file (:mod:`derived_views.engine.positions`); empty when a commit carries it."""
    since: str = ""
    """Commit LSN (``"%016X"``) of the newest event the table's data holds: no event of its topics lies
    after it up to :attr:`position`, so the data is exact as of every position in between. Empty when
    the step did not learn it (a rebuild in one pass, a commit of an earlier version): :attr:`position`
    alone is known."""
    prior: str = ""
    """The position the table's previous data (as its preceding commit with progress left it) was last
    recorded exact as of when this commit replaced it: that data holds for every position from its own
    commit's up to this one. Empty for a table's first commit and for a rebuild."""

    @property
    def lsn(self) -> int:
        """As-of commit LSN (0 before the first sync)."""
        return int(self.position, 16) if self.position else 0

    @property
    def since_lsn(self) -> int:
        """The commit LSN of the newest event the data holds (:attr:`since`; the as-of LSN when unknown)."""
        return int(self.since, 16) if self.since else self.lsn

    def next_offset(self, topic: str, partition: str) -> int:
        """First offset of ``topic``/``partition`` not yet applied."""
        return int(self.offsets.get(topic, {}).get(partition, 0))

    def to_json(self) -> str:
        """The ``userMetadata`` text."""
        data: dict[str, Any] = {
            _MARK: 1,
            "position": self.position,
            "watermark_ts_ms": self.watermark_ts_ms,
            "offsets": self.offsets,
        }
        if self.definition:
            data["definition"] = self.definition
        if self.since:
            data["since"] = self.since
        if self.prior:
            data["prior"] = self.prior
        return json.dumps(
            data,
            sort_keys=True,
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str | None) -> Progress | None:
        """Parse ``userMetadata``; ``None`` when the commit carries no progress."""
        if not text:
            return None
        try:
            data: dict[str, Any] = json.loads(text)
        except json.JSONDecodeError:
            return None
        if not isinstance(data, dict) or _MARK not in data:
            return None
        return cls(
            offsets={t: {p: int(o) for p, o in parts.items()} for t, parts in data["offsets"].items()},
            position=str(data.get("position", "")),
            watermark_ts_ms=int(data.get("watermark_ts_ms", 0)),
            definition=str(data.get("definition", "")),
            since=str(data.get("since", "")),
            prior=str(data.get("prior", "")),
        )


def min_offsets(progresses: list[Progress], topics: list[str]) -> dict[str, dict[str, int]]:
    """Per topic-partition, the smallest next offset over ``progresses`` (where a shared read must start)."""
    out: dict[str, dict[str, int]] = {topic: {} for topic in topics}
    for topic in topics:
        partitions = {p for progress in progresses for p in progress.offsets.get(topic, {})}
        for partition in partitions:
            out[topic][partition] = min(progress.next_offset(topic, partition) for progress in progresses)
    return out
