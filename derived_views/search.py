"""Search view: one document per product, denormalized with its category's name, and a terms table.

Paths below ``CDC_DATA_DIR``:

- ``search/categories``: the view's SCD1 copy of ``public.categories`` (for the join).
- ``search/documents``: one row per product: the product's columns, ``category_name`` and the SCD1
  metadata columns. Maintained as a table-table join: a product event re-joins that product with the
  current categories; a category event re-indexes exactly the documents whose ``category_id`` is that
  category (renaming a category touches its products and nothing else), except the documents a products
  truncate of the same batch removes.
- ``search/terms``: one row per (document, term): ``id``, ``term``, ``tf`` (occurrences) and
  ``doc_len`` (tokens in the document). Tokens come from name, description, tags and category name
  (:func:`derived_views.bm25.tokenize`).
- ``search/_dead_letter``: poison events.

MERGE clauses. ``documents`` uses :func:`derived_views.apply.merge_current` (delete, update with the LSN
guard, insert, truncate). ``terms``, target ``t`` on ``t.id = s.id AND t.term = s.term``:

- ``WHEN MATCHED THEN UPDATE SET tf, doc_len``
- ``WHEN NOT MATCHED THEN INSERT``
- ``WHEN NOT MATCHED BY SOURCE AND t.id IN (re-indexed documents) THEN DELETE``

Each of the three tables tracks its own progress; the terms of a document are computed from the
``documents`` table after it has been brought to the same watermark, so each table is exact as of the
watermark in its newest commit. ``cdc search`` ranks with BM25 (:mod:`derived_views.bm25`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from derived_views.apply import KEY, LSN, OP, SEQ, TS, UNCHANGED, Range, ensure_table, merge_current
from derived_views.bm25 import SPARK_SPLIT, Posting, rank, tokenize
from derived_views.context import ViewContext
from derived_views.delta_reads import read_query, sql_text
from derived_views.errors import MissingTableError
from derived_views.progress import Progress, committing
from derived_views.schema import TableSchema, quote
from derived_views.steps import TableResult, apply_state, is_current, load_pending, starting_point
from log_store.topic_names import log_name

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

NAME = "search"
#: The source tables, by log name (found by their schema and table names, not by a topic name built here).
PRODUCTS = log_name("public", "products")
CATEGORIES = log_name("public", "categories")
#: The view's tables below its directory, and what each holds.
TABLES = {"categories": "copy of public.categories", "documents": "a document per public.products row",
          "terms": "term frequencies per document"}
_TEXT_COLUMNS = ("name", "description", "tags")
TERMS_DDL = "id bigint, term string, tf int, doc_len int"


def path(ctx: ViewContext, table: str) -> str:
    """Path of one of the view's tables (``categories``, ``documents``, ``terms``, ``_dead_letter``)."""
    return ctx.path(NAME, table)


def _categories(ctx: ViewContext) -> DataFrame:
    from pyspark.sql import functions as F

    return ctx.spark.read.format("delta").load(path(ctx, "categories")).select(
        F.col("id").alias("_cat_id"), F.col("name").alias("category_name"), F.col(LSN).alias("_cat_lsn"),
        F.col(SEQ).alias("_cat_seq"),
    )


def _changed_categories(
    ctx: ViewContext, rng: Range, progress: Progress | None, cat_schema: TableSchema
) -> tuple[list[int], bool]:
    """Category ids with events after ``progress`` and whether a truncate was among them."""
    from pyspark.sql import functions as F

    batch = load_pending(ctx, rng, cat_schema, progress, "latest",
                         dead_letter_path=path(ctx, "_dead_letter"), target=path(ctx, "categories"))
    ids = [row["id"] for row in batch.frame.filter(F.col(OP) != "t").select("id").distinct().collect()
           if row["id"] is not None]
    truncated = bool(batch.facts.truncates)
    batch.release()
    return ids, truncated


def _documents(ctx: ViewContext, rng: Range, replace: bool) -> TableResult | None:
    """Bring ``documents`` to the watermark."""
    from pyspark.sql import functions as F

    products = ctx.schema(rng.watermark, PRODUCTS)
    categories = ctx.schema(rng.watermark, CATEGORIES)
    docs_path = path(ctx, "documents")
    progress, replace = starting_point(ctx, docs_path, replace)
    topics = [products.topic, categories.topic]
    if progress is not None and is_current(progress, rng, topics, ctx, docs_path):
        return None
    batch = load_pending(ctx, rng, products, progress, "latest",
                         dead_letter_path=path(ctx, "_dead_letter"), target=docs_path)
    cats = _categories(ctx)
    rows = batch.frame.join(cats, F.col("category_id") == F.col("_cat_id"), "left").drop("_cat_id", "_cat_lsn",
                                                                                          "_cat_seq")
    columns = batch.columns + [("category_name", "string")]
    new_progress = rng.progress(topics, progress)
    if replace:
        merge_current(ctx.spark, docs_path, rows, columns, new_progress, batch.facts.truncates, replace=True)
        ctx.set_progress(docs_path, new_progress)
        batch.release()
        return TableResult(docs_path, batch.facts.rows, batch.facts.poison)
    changed, cat_truncated = _changed_categories(ctx, rng, progress, categories)
    ensure_table(ctx.spark, docs_path, ", ".join(f"{quote(n)} {t}" for n, t in columns) + ", " +
                 f"{KEY} string, {LSN} bigint, {SEQ} bigint, {TS} timestamp, {OP} string")
    source = rows
    if changed or cat_truncated:
        in_batch = batch.frame.select(F.col(KEY).alias("_in_batch"))
        existing = ctx.spark.read.format("delta").load(docs_path)
        if not cat_truncated:
            existing = existing.filter(F.col("category_id").isin(changed))
        if batch.facts.truncates:
            # a document older than a products truncate of this batch is deleted by it: re-indexing it
            # with the category's newer position would bring it back
            existing = existing.filter(F.col(LSN) >= max(batch.facts.truncates))
        refresh = (
            existing.drop("category_name")
            .join(in_batch, F.col(KEY) == F.col("_in_batch"), "left_anti")
            .join(cats, F.col("category_id") == F.col("_cat_id"), "left")
            .select(
                *[quote(n) for n, _ in batch.columns], "category_name", KEY,
                F.greatest(F.col(LSN), F.coalesce(F.col("_cat_lsn"), F.col(LSN)) + F.lit(0)).alias(LSN),
                F.when(F.coalesce(F.col("_cat_lsn"), F.lit(0)) > F.col(LSN), F.col("_cat_seq"))
                .otherwise(F.col(SEQ) + F.lit(1)).alias(SEQ),
                TS, F.lit("u").alias(OP), F.array().cast("array<string>").alias(UNCHANGED),
                F.lit(None).cast("string").alias("_cdc_error"),
            )
        )
        source = rows.select(*refresh.columns).unionByName(refresh)
    merge_current(ctx.spark, docs_path, source, columns, new_progress, batch.facts.truncates)
    ctx.set_progress(docs_path, new_progress)
    batch.release()
    return TableResult(docs_path, batch.facts.rows, batch.facts.poison)


def _reindexed(ctx: ViewContext, rng: Range, progress: Progress | None) -> list[int] | None:
    """Product ids whose document changed after ``progress`` (``None``: all, after a truncate)."""
    from pyspark.sql import functions as F

    products = ctx.schema(rng.watermark, PRODUCTS)
    batch = load_pending(ctx, rng, products, progress, "latest",
                         dead_letter_path=path(ctx, "_dead_letter"), target=path(ctx, "terms"))
    ids = [r["id"] for r in batch.frame.filter(F.col(OP) != "t").select("id").collect() if r["id"] is not None]
    truncated = bool(batch.facts.truncates)
    batch.release()
    changed, cat_truncated = _changed_categories(ctx, rng, progress, ctx.schema(rng.watermark, CATEGORIES))
    if truncated or cat_truncated:
        return None
    if changed:
        ids += [r["id"] for r in ctx.spark.read.format("delta").load(path(ctx, "documents"))
                .filter(F.col("category_id").isin(changed)).select("id").collect()]
    return ids


def _term_rows(docs: DataFrame) -> DataFrame:
    from pyspark.sql import functions as F

    text = F.concat_ws(" ", F.col("name"), F.col("description"), F.array_join(F.col("tags"), " "),
                       F.col("category_name"))
    tokens = docs.select("id", F.filter(F.split(F.lower(text), SPARK_SPLIT), lambda t: t != "").alias("tokens"))
    exploded = tokens.select("id", F.size("tokens").alias("doc_len"), F.explode("tokens").alias("term"))
    return exploded.groupBy("id", "term").agg(F.count(F.lit(1)).cast("int").alias("tf"), F.first("doc_len").alias("doc_len"))


def _terms(ctx: ViewContext, rng: Range, replace: bool) -> TableResult | None:
    """Recompute the terms of the documents changed after the table's progress, in one commit.

    The changed documents come from the terms table's own pending events (not from what ``documents``
    just did), so a crash between the two commits is repaired by the next sync.
    """
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    terms_path = path(ctx, "terms")
    products = ctx.schema(rng.watermark, PRODUCTS)
    categories = ctx.schema(rng.watermark, CATEGORIES)
    topics = [products.topic, categories.topic]
    previous, replace = starting_point(ctx, terms_path, replace)
    if previous is not None and is_current(previous, rng, topics, ctx, terms_path):
        return None
    new_progress = rng.progress(topics, previous)
    reindexed = None if replace else _reindexed(ctx, rng, previous)
    docs = ctx.spark.read.format("delta").load(path(ctx, "documents"))
    if replace or reindexed is None:
        rows = _term_rows(docs).select("id", "term", "tf", "doc_len")
        rows.write.format("delta").mode("overwrite").option("overwriteSchema", "true").option(
            "userMetadata", new_progress.to_json()).save(terms_path)
    else:
        ensure_table(ctx.spark, terms_path, TERMS_DDL)
        ids = sorted(set(reindexed))
        rows = _term_rows(docs.filter(F.col("id").isin(ids))) if ids else _term_rows(docs.limit(0))
        builder = (
            DeltaTable.forPath(ctx.spark, terms_path).alias("t")
            .merge(rows.alias("s"), "t.id = s.id AND t.term = s.term")
            .whenMatchedUpdate(set={"tf": "s.tf", "doc_len": "s.doc_len"})
            .whenNotMatchedInsertAll()
        )
        if ids:
            builder = builder.whenNotMatchedBySourceDelete(condition=F.col("t.id").isin(ids))
        with committing(ctx.spark, new_progress):
            builder.execute()
    ctx.set_progress(terms_path, new_progress)
    return TableResult(terms_path, len(reindexed or []), 0)


def sync(ctx: ViewContext, rng: Range, *, replace: bool = False) -> list[TableResult]:
    """Bring categories, documents and terms to the range's watermark (rebuild them when ``replace``)."""
    categories = ctx.schema(rng.watermark, CATEGORIES)
    ctx.schema(rng.watermark, PRODUCTS)
    results = []
    # documents first: it reads the categories' events itself and needs the state table as of the
    # watermark, so categories are applied before it; documents before terms (terms read documents).
    cats_result = apply_state(ctx, rng, categories, path(ctx, "categories"), path(ctx, "_dead_letter"),
                              replace=replace)
    docs_result = _documents(ctx, rng, replace)
    terms_result = _terms(ctx, rng, replace)
    results.extend(r for r in (cats_result, docs_result, terms_result) if r is not None)
    return results


@dataclass(frozen=True)
class Hit:
    """One search result."""

    id: int
    score: float
    name: str | None
    category_name: str | None
    price: object


def query(views_dir: str, text: str, limit: int = 10) -> list[Hit]:
    """The best ``limit`` products for ``text`` by BM25 over the terms table of the views at ``views_dir``.

    Read with ``deltalake``, without Spark: a query answers in a fraction of a second."""
    from deltalake import DeltaTable

    terms_path = f"{views_dir.rstrip('/')}/{NAME}/terms"
    if not DeltaTable.is_deltatable(terms_path):
        raise MissingTableError(terms_path, NAME)
    words = sorted(set(tokenize(text)))
    if not words:
        return []
    stats = read_query(terms_path, "SELECT count(*) AS n, avg(doc_len) AS avg_len FROM "
                              "(SELECT id, max(doc_len) AS doc_len FROM t GROUP BY id)").to_pylist()[0]
    n_docs, avg_len = int(stats["n"] or 0), float(stats["avg_len"] or 0.0)
    found = read_query(terms_path, "SELECT id, term, tf, doc_len FROM t WHERE term IN ("
                  + ", ".join(sql_text(word) for word in words) + ")").to_pylist()
    best = rank([Posting(r["id"], r["term"], r["tf"], r["doc_len"]) for r in found], n_docs, avg_len, limit)
    if not best:
        return []
    docs = {r["id"]: r for r in read_query(
        f"{views_dir.rstrip('/')}/{NAME}/documents",
        "SELECT id, name, category_name, price FROM t WHERE id IN (" + ", ".join(str(int(i)) for i, _ in best) + ")",
    ).to_pylist()}
    return [
        Hit(doc_id, score, docs[doc_id]["name"], docs[doc_id]["category_name"], docs[doc_id]["price"])
        for doc_id, score in best
        if doc_id in docs
    ]
