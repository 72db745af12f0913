"""Where a table is as of after a step that had nothing to write to it: a small file in its directory.

A table's progress moves with its data, in the ``userMetadata`` of the commit that applies its events
(:mod:`derived_views.engine.commit_progress`). A step that finds a table with nothing to apply (its source
tables idle) makes no Delta commit: it records the newer watermark in ``<table>/_cdc_position.json``,
together with the position of the commit it extends (its *base*: the table's data as of that commit is
exact as of the newer watermark too, since no event of its topics lies between). The file holds while
that commit is the table's newest one with progress; once a later commit records progress (a batch, a
rebuild) or the table is restored to another version, the base no longer matches and the file is
ignored, so it can never make a table look further on than its data is.

Delta readers and ``VACUUM`` leave files whose names start with ``_`` alone, so the file is invisible to
every reader of the table. It is written beside and renamed into place, without ``fsync``: one lost in a
crash leaves the table as of its older position, which is still exact, and the next step records it again.
Only a table on local disk keeps the file; on object storage the step records the position in a commit
that changes no data instead (:func:`derived_views.write.steps.mark_as_of`).
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from derived_views.engine.commit_progress import committed_progress, read_progress
from derived_views.engine.delta_sql import is_local
from derived_views.engine.progress import Progress

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: The file's name inside the table's directory.
POSITION_FILE = "_cdc_position.json"


def _file(path: str) -> Path | None:
    return Path(path.removeprefix("file://")) / POSITION_FILE if is_local(path) else None


def record_position(path: str, progress: Progress, base: Progress) -> Progress | None:
    """Record that the table at ``path``, as its newest commit with progress ``base`` left it, is exact as
    of ``progress``; the recorded progress (its :attr:`~Progress.base` set), or ``None`` when the table is
    not on local disk (nothing recorded)."""
    file = _file(path)
    if file is None:
        return None
    recorded = replace(progress, base=base.base or base.position)
    text = json.dumps({"base": recorded.base, "progress": json.loads(recorded.to_json())}, sort_keys=True)
    temporary = file.with_name(f"{POSITION_FILE}.{os.getpid()}.tmp")
    temporary.write_text(text)
    os.replace(temporary, file)
    return recorded


def with_position(path: str, committed: Progress | None) -> Progress | None:
    """The position of the table at ``path`` whose newest commit with progress carries ``committed``
    (``None``: no commit has any): the position file's progress when it extends that commit and is
    further on, else ``committed``."""
    file = _file(path)
    if file is None or not file.is_file():
        return committed
    try:
        data = json.loads(file.read_text())
        recorded = Progress.from_json(json.dumps(data["progress"]))
        base = str(data["base"])
    except (OSError, ValueError, KeyError, TypeError):
        return committed  # a torn or foreign file: the commit's position holds
    if recorded is None or base != (committed.position if committed else "") or recorded.position <= base:
        return committed
    return replace(recorded, base=base)


def table_position(spark: SparkSession, path: str) -> Progress | None:
    """What the table at ``path`` is as of: :func:`~derived_views.engine.commit_progress.read_progress` (``None``: no
    table; an empty :class:`Progress`: no commit with progress), moved on by its position file."""
    progress = read_progress(spark, path)
    if progress is None:
        return None
    return with_position(path, progress if progress.position else None) or progress


def local_position(path: str) -> Progress | None:
    """What the Delta table at ``path`` is as of, read with ``deltalake`` (no Spark): its newest commit's
    progress moved on by its position file; ``None`` when neither records any."""
    return with_position(path, committed_progress(path))
