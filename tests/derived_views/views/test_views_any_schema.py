"""Search indexes and cache entities for a schema that is not the reference one, end to end.

PostgreSQL -> capture -> log -> Spark -> Delta, on a blog (authors in teams, posts, tags through a link
table, comments) whose names need quoting, some holding characters Delta refuses in a column name (a
space, ``,;{}()=``, a tab, a newline: stored percent-encoded): after every kind of change, each document and each entry
equals the definition computed from the source in one snapshot (``verify``), and a change re-computes
only the roots it affects.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.derived_views.pipeline import capture, context, execute, read_every_view_table, rows, settings_for, sync

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from derived_views.write.context import ViewContext

pytestmark = [pytest.mark.pg, pytest.mark.spark, pytest.mark.slow]

#: ~2.2 kB of md5 text: incompressible, and stored out of line (STORAGE EXTERNAL), so an update that
#: leaves it alone sends it as unchanged
LONG_TITLE = "(SELECT string_agg(md5(g::text), '') FROM generate_series(1, 70) g)"

SCHEMA = [
    'CREATE SCHEMA "Blog Data"',
    'CREATE TABLE "Blog Data".teams (id int PRIMARY KEY, "Team Name (=)" text)',
    'CREATE TABLE "Blog Data"."Authors" ("AuthorId" int PRIMARY KEY, "Name" text, team_id int, "e-mail; work" varchar(80))',
    'CREATE TABLE "Blog Data"."Posts" (id bigint PRIMARY KEY, "author.ref" int, "Post Title" text, body text, '
    'tags text[], published boolean NOT NULL DEFAULT true, "Ünïcode" numeric(8, 2))',
    'ALTER TABLE "Blog Data"."Posts" ALTER COLUMN "Post Title" SET STORAGE EXTERNAL',
    'CREATE TABLE "Blog Data".tags (id int PRIMARY KEY, label text)',
    'CREATE TABLE "Blog Data"."Post-Tags" (post_id bigint, "tag id" int, "sort, order" int, PRIMARY KEY (post_id, "tag id"))',
    'CREATE TABLE "Blog Data".comments (id bigint PRIMARY KEY, post_id bigint, "Body\ttext" text, "posted\nat" timestamptz)',
    "CREATE PUBLICATION cdc_publication FOR ALL TABLES",
    "INSERT INTO \"Blog Data\".teams VALUES (1, 'Core'), (2, 'Docs')",
    "INSERT INTO \"Blog Data\".\"Authors\" VALUES (1, 'Ada', 1, 'ada@x'), (2, 'Brian', 2, 'b@x'), (3, 'Cleo', 1, NULL)",
    "INSERT INTO \"Blog Data\".\"Posts\" SELECT g, 1 + g % 3, 'Post ' || g, 'about lamps and ' || (g * 7), "
    "ARRAY['t' || (g % 4)], g % 5 <> 0, g / 4.0 FROM generate_series(1, 30) g",
    "INSERT INTO \"Blog Data\".tags VALUES (1, 'spark'), (2, 'delta')",
    'INSERT INTO "Blog Data"."Post-Tags" SELECT g, 1 + g % 2, g FROM generate_series(1, 10) g',
    "INSERT INTO \"Blog Data\".comments SELECT g, 1 + g % 6, 'nice ' || g, "
    "'2026-11-24 10:00+00'::timestamptz + g * interval '1 minute' "
    "FROM generate_series(1, 20) g",
    f'UPDATE "Blog Data"."Posts" SET "Post Title" = {LONG_TITLE} WHERE id = 7',
]

VIEWS = """
[search.posts]
root = "Blog Data.Posts"
text = ["Post Title", "body", "tags", "author", "Team-Name"]
stored = ["Post Title", "author"]
filter = "published AND `Ünïcode` >= 0 AND `Post Title` IS NOT NULL"

[search.posts.joins.writer]
table = "Blog Data.Authors"
on = "author.ref"
columns = { author = "Name", "author-mail" = "e-mail; work" }

[search.posts.joins.team]
table = "Blog Data.teams"
from = "writer"
on = "team_id"
columns = { "Team-Name" = "Team Name (=)" }

[cache.post]
root = "Blog Data.Posts"
columns = ["id", "Post Title", "Ünïcode"]

[cache.post.lookups.writer]
table = "Blog Data.Authors"
on = "author.ref"
columns = { author = "Name" }

[cache.post.children.comments]
table = "Blog Data.comments"
on = "post_id"
order_by = "posted\\nat"

[cache.post.children.tags]
table = "Blog Data.Post-Tags"
on = "post_id"
order_by = "sort, order"
columns = ["tag id", "sort, order"]
"""

VIEW_NAMES = ["search.posts", "cache.post"]


def _last_merge(ctx: ViewContext, path: str) -> dict[str, Any]:
    last = ctx.spark.sql(f"DESCRIBE HISTORY delta.`{path}`").orderBy("version", ascending=False).first()
    assert last is not None
    return {"operation": last["operation"], **{k: int(v) for k, v in last["operationMetrics"].items() if v.isdigit()}}


def _merges(ctx: ViewContext, path: str) -> int:
    return ctx.spark.sql(f"DESCRIBE HISTORY delta.`{path}`").filter("operation = 'MERGE'").count()


def _rewritten(ctx: ViewContext, path: str) -> int:
    metrics = _last_merge(ctx, path)
    assert metrics["operation"] == "MERGE", metrics
    return sum(metrics.get(k, 0) for k in ("numTargetRowsUpdated", "numTargetRowsInserted", "numTargetRowsDeleted"))


def _step(settings: Any, ctx: ViewContext, url: str, *, warehouse: bool = False) -> None:
    """Capture, sync both views (and the warehouse), and verify each against the source in one snapshot."""
    from derived_views.runs import runner
    from derived_views.runs.verify import verify

    capture(settings)
    views = ["warehouse", *VIEW_NAMES] if warehouse else VIEW_NAMES
    sync(ctx, views)
    watermark = runner.latest(ctx)
    assert watermark is not None
    for view in views:
        report = verify(ctx, view, url, watermark)
        assert report.ok and report.compared > 0, (view, report.differences[:10])


def test_a_blog_search_index_and_cache_entity_stay_exact_through_every_change(
    spark: SparkSession, pg_url: str, tmp_path: Path
) -> None:
    from derived_views.runs import runner
    from derived_views.runs.status import table_progress
    from derived_views.views import cache, search

    execute(pg_url, *SCHEMA)
    views_file = tmp_path / "views.toml"
    views_file.write_text(VIEWS)
    settings = settings_for(pg_url, tmp_path, views_file=str(views_file))
    ctx = context(spark, settings)
    _step(settings, ctx, pg_url, warehouse=True)
    docs = ctx.path("search", "posts", "documents")
    entries = ctx.path("cache", "post", "entries")
    assert len(rows(spark, docs)) == 24  # the filter leaves out every fifth post (unpublished)
    hits = search.query(ctx.views_dir, "posts", "ada lamps", limit=3, stored=["Post Title", "author"])
    assert hits and hits[0].fields["author"] == "Ada"
    post = cache.get(ctx.views_dir, "post", "1")
    assert post is not None and post["author"] == "Brian" and [c["id"] for c in post["comments"]] == [6, 12, 18]
    assert post["tags"] == [{"tag id": 2, "sort, order": 1}] and post["Ünïcode"] == 0.25

    # a joined row referenced by many roots: exactly its posts are re-computed
    execute(pg_url, 'UPDATE "Blog Data"."Authors" SET "Name" = \'Ada Lovelace\' WHERE "AuthorId" = 2')
    _step(settings, ctx, pg_url)
    brian = [r for r in rows(spark, docs) if r["author"] == "Ada Lovelace"]
    assert len(brian) == 8 and _rewritten(ctx, docs) == 8 and _rewritten(ctx, entries) == 10

    # a row two joins away (authors -> teams): the posts of every author of that team; the cache entity
    # does not read teams, and no post references the new author: no entry is rewritten, yet the
    # entries record the new watermark (a MERGE that changes nothing would commit nothing)
    merges = _merges(ctx, entries)
    execute(
        pg_url,
        'UPDATE "Blog Data".teams SET "Team Name (=)" = \'Platform\' WHERE id = 1',
        'INSERT INTO "Blog Data"."Authors" VALUES (5, \'Dora\', 2, NULL)',
    )
    _step(settings, ctx, pg_url)
    assert _rewritten(ctx, docs) == 16  # the published posts of authors 1 and 3 (20 posts, 4 unpublished)
    assert _merges(ctx, entries) == merges
    recorded = table_progress(Path(entries))
    assert recorded is not None and recorded.position == runner.latest(ctx).position  # type: ignore[union-attr]

    # the filter flips for one post through its own row; a post is inserted, another deleted; a child
    # moves from one post to another; a child is deleted; a link row is inserted
    execute(
        pg_url,
        'UPDATE "Blog Data"."Posts" SET published = true WHERE id = 5',
        "INSERT INTO \"Blog Data\".\"Posts\" VALUES (31, 3, 'Fresh', 'new lamps', '{}', true, 1.5)",
        'DELETE FROM "Blog Data"."Posts" WHERE id = 2',
        'UPDATE "Blog Data".comments SET post_id = 3 WHERE id = 6',
        'DELETE FROM "Blog Data".comments WHERE id = 7',
        'INSERT INTO "Blog Data"."Post-Tags" VALUES (3, 1, 0)',
    )
    _step(settings, ctx, pg_url)
    assert _rewritten(ctx, docs) == 3  # posts 5 and 31 in, post 2 out: the index reads no child table
    # the roots whose row or children changed, of 30: post 1 lost comment 6, post 3 gained it and a tag,
    # post 5's row changed, post 31 in, post 2 out
    assert _rewritten(ctx, entries) == 5
    moved_to = cache.get(ctx.views_dir, "post", "3")
    assert moved_to is not None and 6 in [c["id"] for c in moved_to["comments"]]
    assert moved_to["tags"][0] == {"tag id": 1, "sort, order": 0}

    # an update that leaves the out-of-line title alone (sent as unchanged, under its source name): every
    # table keeps the title it has, under its stored name
    execute(pg_url, 'UPDATE "Blog Data"."Posts" SET "Ünïcode" = 9 WHERE id = 7')
    _step(settings, ctx, pg_url, warehouse=True)
    assert _rewritten(ctx, docs) == 1 and _rewritten(ctx, entries) == 1
    assert len((cache.get(ctx.views_dir, "post", "7") or {}).get("Post Title", "")) == 2240

    # a joined row's key changes, a child table is truncated, a post's key changes
    execute(
        pg_url,
        'UPDATE "Blog Data"."Authors" SET "AuthorId" = 4 WHERE "AuthorId" = 3',
        'TRUNCATE "Blog Data".comments',
        'UPDATE "Blog Data"."Posts" SET id = 100 WHERE id = 4',
    )
    _step(settings, ctx, pg_url)
    assert all(not r["comments"] for r in (cache.get(ctx.views_dir, "post", str(i)) for i in (1, 3)) if r)

    # a rebuild by replay gives the same documents and entries, each in one commit
    before = {p: sorted(map(repr, rows(spark, p))) for p in (docs, entries)}
    sync(ctx, VIEW_NAMES, replace=True)
    for p in (docs, entries):
        after = sorted(map(repr, rows(spark, p)))
        assert after == before[p], (p, set(after) ^ set(before[p]))
        assert _last_merge(ctx, p)["operation"] in ("WRITE", "CREATE OR REPLACE TABLE AS SELECT")
    read = read_every_view_table(tmp_path)
    assert read["search/posts/documents"] == len(before[docs]) and read["cache/post/entries"] == len(before[entries])
    _stored_names(settings, ctx)
    _definition_changes(spark, settings, pg_url, views_file)


def _stored_names(settings: Any, ctx: ViewContext) -> None:
    """Columns Delta refuses are stored percent-encoded, readable by ``deltalake``, and `cdc views` says so."""
    from deltalake import DeltaTable

    from derived_views.runs.listing import captured_tables, view_tables
    from derived_views.views import warehouse
    from log_store.topic_names import log_name

    documents = DeltaTable(ctx.path("search", "posts", "documents")).to_pandas()
    assert documents["Post%20Title"].notna().all() and len(documents) == 25
    assert documents.loc[documents["id"] == 7, "Post%20Title"].str.len().tolist() == [2240]
    links = DeltaTable(warehouse.current_path(ctx, log_name("Blog Data", "Post-Tags"))).to_pandas()
    assert len(links) == 11 and links["tag%20id"].notna().all() and links["sort%2C%20order"].notna().all()
    comments = DeltaTable(warehouse.current_path(ctx, log_name("Blog Data", "comments"))).to_pandas()
    assert {"Body%09text", "posted%0Aat"} <= set(comments.columns)
    captured = captured_tables(str(settings.log_dir), settings.topic_prefix)
    listed = {t.holds: t for t in view_tables(Path(ctx.views_dir), captured, ctx.definitions)}
    assert listed["Blog Data.Post-Tags (current)"].stored_columns == {"tag id": "tag%20id", "sort, order": "sort%2C%20order"}
    assert listed["reads Blog Data.teams (current)"].stored_columns == {"Team Name (=)": "Team%20Name%20%28%3D%29"}


def _definition_changes(spark: SparkSession, settings: Any, url: str, views_file: Path) -> None:
    """Between two syncs the filter changes: the index is left as it was and reports that it needs
    `cdc rebuild search.posts` (so does `cdc lag`); the cache entity, unchanged, goes on; a rebuild applies
    the new definition."""
    from cdc.observe.lag import measure
    from derived_views.runs import runner
    from derived_views.runs.verify import verify
    from derived_views.views import cache

    views_file.write_text(VIEWS.replace("`Ünïcode` >= 0", "`Ünïcode` >= 2"))
    execute(url, 'UPDATE "Blog Data"."Posts" SET "Post Title" = \'Renamed\' WHERE id = 1')
    capture(settings)
    ctx = context(spark, settings)  # a new process reads the edited file
    report = runner.step(ctx, VIEW_NAMES)
    assert [failure.view for failure in report.failures] == ["search.posts"]
    assert "run `cdc rebuild search.posts`" in report.failures[0].error
    assert rows(spark, ctx.path("search", "posts", "documents"), "id = 1")[0]["Post%20Title"] == "Post 1"
    assert (cache.get(ctx.views_dir, "post", "1") or {}).get("Post Title") == "Renamed"
    lag = measure(settings)
    assert any("search.posts" in line and "cdc rebuild search.posts" in line for line in lag.violations), lag.violations
    sync(ctx, ["search.posts"], replace=True)
    watermark = runner.latest(ctx)
    assert watermark is not None
    checked = verify(ctx, "search.posts", url, watermark)
    # published posts with Ünïcode >= 2 (id / 4 when inserted): ids 8..30 but 10, 15, 20, 25 and 30; 7 (set to 9)
    assert checked.ok and checked.compared == 19, checked.differences[:5]
    assert not measure(settings).violations
    _source_changes(spark, settings, url, ctx)


def _source_changes(spark: SparkSession, settings: Any, url: str, ctx: ViewContext) -> None:
    """A column added to a table an index keeps whole re-computes its documents once, with the column; a
    column an index names renamed away fails that index alone (the warehouse and the entity go on)."""
    from derived_views.runs import runner
    from derived_views.views import cache

    docs = ctx.path("search", "posts", "documents")
    execute(url, 'ALTER TABLE "Blog Data"."Posts" ADD COLUMN extra int', 'UPDATE "Blog Data"."Posts" SET extra = 1 WHERE id = 9')
    _step(settings, ctx, url)
    assert _last_merge(ctx, docs)["operation"] in ("WRITE", "CREATE OR REPLACE TABLE AS SELECT")
    assert {r["id"]: r["extra"] for r in rows(spark, docs, "id IN (8, 9)")} == {8: None, 9: 1}
    execute(
        url,
        'ALTER TABLE "Blog Data"."Posts" RENAME COLUMN body TO content',
        'UPDATE "Blog Data"."Posts" SET "Post Title" = \'Again\' WHERE id = 9',
    )
    capture(settings)
    report = runner.step(ctx, ["warehouse", *VIEW_NAMES])
    assert [failure.view for failure in report.failures] == ["search.posts"]
    assert "[search.posts] text: 'body' is not a column of the document" in report.failures[0].error
    assert (cache.get(ctx.views_dir, "post", "9") or {}).get("Post Title") == "Again"
