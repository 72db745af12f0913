"""Every commit of a view table carries its own table's progress, also when tables commit side by side."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from derived_views.write.context import ViewContext

pytestmark = pytest.mark.spark


def _merge_one_row(spark: object, path: str) -> None:
    from delta.tables import DeltaTable

    source = spark.createDataFrame([(1, "b")], "id long, v string")  # type: ignore[attr-defined]
    (
        DeltaTable.forPath(spark, path)
        .alias("t")
        .merge(source.alias("s"), "t.id = s.id")
        .whenMatchedUpdateAll()
        .whenNotMatchedInsertAll()
        .execute()
    )


def test_a_merge_beside_another_sessions_open_commit_carries_its_own_progress(ctx: ViewContext, tmp_path: Path) -> None:
    """While the side session is inside its commit block (its progress set), a MERGE of the main
    session neither waits for it nor picks its progress up, and each table's commit holds its own."""
    from derived_views.engine.commit_progress import committing, read_progress
    from derived_views.engine.progress import Progress

    side = ctx.beside()
    assert side is ctx.beside() and side.spark is not ctx.spark
    paths = {name: str(tmp_path / name) for name in ("main", "side")}
    for path in paths.values():
        ctx.spark.createDataFrame([(1, "a")], "id long, v string").write.format("delta").save(path)
    mine = Progress({"t": {"0": 5}}, "00000000000000AA", 1)
    theirs = Progress({"t": {"0": 9}}, "00000000000000BB", 2)
    inside = threading.Event()
    release = threading.Event()

    def side_commit() -> None:
        with committing(side.spark, theirs):
            inside.set()
            release.wait(120)
            _merge_one_row(side.spark, paths["side"])

    def main_commit() -> None:
        with committing(ctx.spark, mine):
            _merge_one_row(ctx.spark, paths["main"])

    worker = threading.Thread(target=side_commit)
    worker.start()
    main = threading.Thread(target=main_commit)
    try:
        assert inside.wait(120)
        main.start()
        main.join(90)  # the side session's block is open: this commit must not wait for it
        assert not main.is_alive(), "a commit in one session waited for another session's commit block"
    finally:
        release.set()
        worker.join(120)
        main.join(120)
    assert not worker.is_alive()
    assert read_progress(ctx.spark, paths["main"]) == mine
    assert read_progress(ctx.spark, paths["side"]) == theirs


def test_a_replaced_composite_table_is_evolved_from_its_new_columns(ctx: ViewContext, tmp_path: Path) -> None:
    """A search index or cache entity rebuilt with other columns (a changed definition) is replaced in
    one commit; the next step brings the table to its columns from what the table now holds, not from
    what the context knew before the rebuild."""
    from delta.tables import DeltaTable

    from derived_views.engine.commit_progress import read_progress
    from derived_views.engine.progress import Progress
    from derived_views.views.composite_sync import overwrite

    path = str(tmp_path / "documents")
    ctx.spark.createDataFrame([(1, "a")], "id long, v string").write.format("delta").save(path)
    ctx.types.ensure(ctx.spark, path, "id bigint, v string")  # the context now knows two columns
    rebuilt = ctx.spark.createDataFrame([(1, "a", 7)], "id long, v string, added int")
    overwrite(ctx, rebuilt, path, Progress({"t": {"0": 3}}, "00000000000000AA", 1))
    recorded = read_progress(ctx.spark, path)
    assert recorded is not None and recorded.offsets == {"t": {"0": 3}}
    ctx.types.ensure(ctx.spark, path, "id bigint, v string, added int")  # already there: nothing to add
    assert [f.name for f in DeltaTable.forPath(ctx.spark, path).toDF().schema.fields] == ["id", "v", "added"]
