"""Search indexes (``[search.<index>]`` of the views file): one document per root row, and its terms.

Paths below ``CDC_DATA_DIR``, for the view ``search.<index>``:

- ``search/<index>/_state/<table>``: the index's SCD1 copy of a table it reads that the warehouse does
  not keep; it reads the others from the warehouse's current tables (:mod:`derived_views.views.composite_sync`).
- ``search/<index>/documents``: one row per root row that passes the filter: the root's kept columns,
  each join's columns under their names, ``_cdc_key`` (the root's key as canonical JSON) and
  ``_cdc_lsn`` (the newest source event the document was computed from).
- ``search/<index>/terms``: one row per (document, term): ``doc`` (the document's ``_cdc_key``),
  ``term``, ``tf`` (occurrences) and ``doc_len`` (tokens in the document). Tokens come from the
  index's ``text`` columns (:func:`derived_views.views.bm25.tokenize`; an array contributes its elements).
- ``search/<index>/_dead_letter``: poison events.

A sync step re-computes the affected documents (:func:`derived_views.views.composite_sync.affected_roots`:
a renamed category re-indexes its products and nothing else) and MERGEs them on ``_cdc_key``; the terms
of the same documents are then recomputed from ``documents`` and MERGEd on ``(doc, term)``, a term the
document no longer has being deleted by the same commit. Each table tracks its own progress (with the
definition's fingerprint), so each is exact as of the watermark of its newest commit; terms are
computed from ``documents`` after it reached the same watermark. ``cdc search`` ranks with BM25
(:mod:`derived_views.views.bm25`) over the terms, reading with ``deltalake`` (no JVM).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from dataclasses import replace as with_fields
from typing import TYPE_CHECKING, Any

from derived_views.engine.delta_reads import read_query, sql_text
from derived_views.engine.delta_sql import merge_into
from derived_views.engine.evaluation import sized_for
from derived_views.engine.progress import Progress
from derived_views.errors import MissingTableError
from derived_views.events.column_names import from_stored, quote, source_columns
from derived_views.events.metadata_columns import KEY, LSN
from derived_views.events.schema import TableSchema
from derived_views.source.as_of import LogAsOf, pending_events
from derived_views.views.bm25 import SPARK_SPLIT, Posting, rank, tokenize
from derived_views.views.composite import Composite
from derived_views.views.composite_sync import (
    affected_roots,
    check_definition,
    composed,
    merge_roots,
    merge_with_progress,
    overwrite,
    path,
    reshaped,
    source_schemas,
    sync_states,
    tables_read,
)
from derived_views.write.context import ViewContext
from derived_views.write.steps import TableResult, is_current, mark_as_of, starting_point

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

NAME = "search"
#: The index's tables below its directory, and what each holds.
TABLES = {"documents": "a document per root row", "terms": "term frequencies per document"}
TERMS_DDL = "doc string, term string, tf int, doc_len int"


def documents(ctx: ViewContext, plan: Composite, roots: DataFrame | None) -> DataFrame:
    """The documents of ``roots`` (``None``: every root) computed from the state copies, filtered."""
    from pyspark.sql import functions as F

    rows = composed(ctx, plan, roots).select(*[quote(c) for c in plan.output_columns], KEY, LSN)
    return rows.filter(F.expr(plan.filter)) if plan.filter else rows


def _term_rows(plan: Composite, docs: DataFrame) -> DataFrame:
    from pyspark.sql import functions as F
    from pyspark.sql.types import ArrayType

    types = {f.name: f.dataType for f in docs.schema.fields}
    parts = [
        F.array_join(F.col(quote(c)), " ") if isinstance(types[c], ArrayType) else F.col(quote(c)).cast("string")
        for c in plan.text
    ]
    text = F.concat_ws(" ", *parts)
    words = F.filter(F.split(F.lower(text), SPARK_SPLIT), lambda t: t != "")
    tokens = docs.select(F.col(KEY).alias("doc"), words.alias("tokens"))
    exploded = tokens.select("doc", F.size("tokens").alias("doc_len"), F.explode("tokens").alias("term"))
    return exploded.groupBy("doc", "term").agg(
        F.count(F.lit(1)).cast("int").alias("tf"), F.first("doc_len").cast("int").alias("doc_len")
    )


def _merge_terms(ctx: ViewContext, table: str, roots: DataFrame, terms: DataFrame, progress: Progress) -> None:
    """Replace the terms of the documents in ``roots`` by ``terms`` in one commit: a term a document no
    longer has is deleted by the same MERGE (its row in the source carries ``_cdc_drop``)."""
    from pyspark.sql import functions as F

    ctx.types.ensure(ctx.spark, table, TERMS_DDL)
    if roots.isEmpty():
        mark_as_of(ctx, table, progress)
        return
    docs = roots.select(F.col(KEY).alias("doc"))
    old = ctx.spark.read.format("delta").load(table).join(docs, "doc", "left_semi").select("doc", "term")
    stale = old.join(terms.select("doc", "term"), ["doc", "term"], "left_anti").select(
        "doc",
        "term",
        F.lit(None).cast("int").alias("tf"),
        F.lit(None).cast("int").alias("doc_len"),
        F.lit(True).alias("_cdc_drop"),
    )
    source = terms.select("doc", "term", "tf", "doc_len", F.lit(False).alias("_cdc_drop")).unionByName(stale)
    builder = (
        merge_into(ctx.spark, table, source, "t.doc = s.doc AND t.term = s.term")
        .when_matched_delete(condition="s._cdc_drop")
        .when_matched_update({"tf": "s.tf", "doc_len": "s.doc_len"})
        .when_not_matched_insert(
            {"doc": "s.doc", "term": "s.term", "tf": "s.tf", "doc_len": "s.doc_len"}, condition="NOT s._cdc_drop"
        )
    )
    merge_with_progress(ctx, table, builder.execute, progress)


@dataclass
class _Step:
    """What one sync step of an index shares between its two output tables."""

    ctx: ViewContext
    as_of: LogAsOf
    plan: Composite
    schemas: dict[str, TableSchema]
    topics: list[str]
    roots: dict[str, DataFrame | None] = field(default_factory=dict)
    """Affected roots already computed, by the progress they were computed from."""

    def affected(self, progress: Progress, output: str) -> DataFrame | None:
        key = json.dumps(progress.offsets, sort_keys=True)
        if key not in self.roots:
            self.roots[key] = affected_roots(self.ctx, self.as_of, self.plan, self.schemas, progress, output)
        return self.roots[key]

    def pending(self, table: str, replace: bool) -> tuple[Progress | None, Progress] | None:
        """``(progress, new progress)`` of the table at ``table``; ``None`` when it is current."""
        progress, replace = starting_point(self.ctx, table, replace)
        if progress is not None and is_current(progress, self.as_of, self.topics, self.ctx, table):
            return None
        return progress, with_fields(self.as_of.progress(self.topics, progress), definition=self.plan.stamp)


#: How a step writes one output table: ``(step, table path, affected roots or None for all, new progress)``.
_Write = Callable[["_Step", str, "DataFrame | None", Progress], None]


def _apply_output(step: _Step, name: str, replace: bool, write: _Write) -> TableResult | None:
    """Bring the index's table ``name`` to the step's watermark with ``write``: over the affected roots'
    rows, or whole (roots ``None``) when the table is new, rebuilt or its definition changed."""
    table = path(step.ctx, step.plan, name)
    pending = step.pending(table, replace)
    if pending is None:
        return None
    progress, new_progress = pending
    with sized_for(
        step.ctx.spark, pending_events(step.as_of.watermark, step.topics, progress), tables_read(step.ctx, step.plan, TABLES)
    ):
        roots = None if progress is None or reshaped(step.plan, progress) else step.affected(progress, table)
        write(step, table, roots, new_progress)
    step.ctx.set_progress(table, new_progress)
    return TableResult(table, 0 if roots is None else roots.count(), 0)


def _write_documents(step: _Step, table: str, roots: DataFrame | None, new_progress: Progress) -> None:
    if roots is None:
        overwrite(step.ctx, documents(step.ctx, step.plan, None), table, new_progress)
    else:
        merge_roots(step.ctx, table, roots, documents(step.ctx, step.plan, roots), new_progress)


def _write_terms(step: _Step, table: str, roots: DataFrame | None, new_progress: Progress) -> None:
    docs = from_stored(step.ctx.spark.read.format("delta").load(path(step.ctx, step.plan, "documents")), step.plan.output_columns)
    if roots is None:
        overwrite(step.ctx, _term_rows(step.plan, docs), table, new_progress)
    else:
        _merge_terms(step.ctx, table, roots, _term_rows(step.plan, docs.join(roots, KEY, "left_semi")), new_progress)


#: The index's output tables in the order a step writes them (terms are derived from the documents).
_OUTPUTS = (("documents", _write_documents), ("terms", _write_terms))


def sync(ctx: ViewContext, as_of: LogAsOf, plan: Composite, *, replace: bool = False) -> list[TableResult]:
    """Bring the index's state copies, then its documents, then its terms to the range's watermark
    (rebuild them from the log when ``replace``)."""
    schemas = source_schemas(ctx, as_of, plan)
    if not replace:
        for name in TABLES:
            table = path(ctx, plan, name)
            check_definition(plan, table, ctx.progress(table))
    step = _Step(ctx, as_of, plan, schemas, sorted({schema.topic for schema in schemas.values()}))
    results = sync_states(ctx, as_of, plan, schemas, replace=replace)
    for name, write in _OUTPUTS:
        result = _apply_output(step, name, replace, write)
        if result is not None:
            results.append(result)
    for roots in step.roots.values():
        if roots is not None:
            roots.unpersist()
    return results


@dataclass(frozen=True)
class Hit:
    """One search result: the document's key columns, its score and its stored fields."""

    key: dict[str, Any]
    score: float
    fields: dict[str, Any]


def query(views_dir: str, index: str, text: str, limit: int = 10, stored: Sequence[str] = ()) -> list[Hit]:
    """The best ``limit`` documents of ``index`` for ``text`` by BM25 over its terms table, with their
    ``stored`` columns. Read with ``deltalake``, without Spark: a query answers in a fraction of a second."""
    from deltalake import DeltaTable

    base = f"{views_dir.rstrip('/')}/{NAME}/{index}"
    terms_path = f"{base}/terms"
    if not DeltaTable.is_deltatable(terms_path):
        raise MissingTableError(terms_path, f"{NAME}.{index}")
    words = sorted(set(tokenize(text)))
    if not words:
        return []
    stats = read_query(
        terms_path, "SELECT count(*) AS n, avg(doc_len) AS avg_len FROM (SELECT doc, max(doc_len) AS doc_len FROM t GROUP BY doc)"
    ).to_pylist()[0]
    n_docs, avg_len = int(stats["n"] or 0), float(stats["avg_len"] or 0.0)
    found = read_query(
        terms_path, "SELECT doc, term, tf, doc_len FROM t WHERE term IN (" + ", ".join(sql_text(word) for word in words) + ")"
    ).to_pylist()
    best = rank([Posting(r["doc"], r["term"], r["tf"], r["doc_len"]) for r in found], n_docs, avg_len, limit)
    if not best:
        return []
    held = source_columns(stored, [f.name for f in DeltaTable(f"{base}/documents").schema().fields])
    columns = ", ".join(['"' + held.get(c, c).replace('"', '""') + '"' for c in stored] + [KEY])
    docs = {
        r[KEY]: r
        for r in read_query(
            f"{base}/documents",
            f"SELECT {columns} FROM t WHERE {KEY} IN (" + ", ".join(sql_text(doc) for doc, _ in best) + ")",
        ).to_pylist()
    }
    return [Hit(json.loads(doc), score, {c: docs[doc][held.get(c, c)] for c in stored}) for doc, score in best if doc in docs]
