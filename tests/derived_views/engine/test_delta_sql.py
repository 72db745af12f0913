"""The SQL the views' Delta writes are sent as (pure: no Spark)."""

from __future__ import annotations

from derived_views.engine.delta_sql import merge_into, table_ref


def test_a_path_is_quoted_as_a_delta_table_name() -> None:
    assert table_ref("/data/warehouse/current/public.a`b") == "delta.`/data/warehouse/current/public.a``b`"


def test_clauses_keep_their_order_and_conditions() -> None:
    merge = (
        merge_into(None, "/t", None, "t.k = s.k")  # type: ignore[arg-type]
        .when_matched_delete(condition="s.op = 'd'")
        .when_matched_update({"`a b`": "s.`a b`", "v": "s.v"}, condition="s.lsn > t.lsn")
        .when_not_matched_insert({"`a b`": "s.`a b`", "k": "s.k"}, condition="s.op <> 'd'")
        .when_not_matched_by_source_delete(condition="t.lsn < 7")
    )
    assert merge.statement("src") == (
        "MERGE INTO delta.`/t` AS t USING src AS s ON t.k = s.k "
        "WHEN MATCHED AND (s.op = 'd') THEN DELETE "
        "WHEN MATCHED AND (s.lsn > t.lsn) THEN UPDATE SET `a b` = s.`a b`, v = s.v "
        "WHEN NOT MATCHED AND (s.op <> 'd') THEN INSERT (`a b`, k) VALUES (s.`a b`, s.k) "
        "WHEN NOT MATCHED BY SOURCE AND (t.lsn < 7) THEN DELETE"
    )


def test_unconditional_clauses() -> None:
    merge = (
        merge_into(None, "/t", None, "t.k = s.k")  # type: ignore[arg-type]
        .when_matched_update({"v": "s.v"})
        .when_not_matched_insert_all()
        .when_not_matched_by_source_update({"v": "NULL"}, condition="t.current")
    )
    assert merge.statement("src") == (
        "MERGE INTO delta.`/t` AS t USING src AS s ON t.k = s.k WHEN MATCHED THEN UPDATE SET v = s.v "
        "WHEN NOT MATCHED THEN INSERT * WHEN NOT MATCHED BY SOURCE AND (t.current) THEN UPDATE SET v = NULL"
    )
