"""Search indexes (``[search.<index>]`` of the views file): one document per root row, and its terms.

Paths below ``CDC_DATA_DIR``, for the view ``search.<index>``:

- ``search/<index>/_state/<table>``: the index's SCD1 copy of a table it reads that the warehouse does
  not keep; it reads the others from the warehouse's current tables (:mod:`derived_views.views.composite_sync`).
- ``search/<index>/documents``: one row per root row that passes the filter: the root's kept columns,
  each join's columns under their names, ``_cdc_key`` (the root's key as canonical JSON) and
  ``_cdc_lsn`` (the newest source event the document was computed from).
- ``search/<index>/terms``: one row per document: ``doc`` (the document's ``_cdc_key``), ``terms``
  (``array<struct<term, tf>>``, sorted by term: each distinct term and its occurrences) and ``doc_len``
  (tokens in the document). Tokens come from the index's ``text`` columns
  (:func:`derived_views.views.bm25.tokenize`; an array contributes its elements). One row per document,
  not per (document, term), because Delta's MERGE rewrites every file holding a matched row: a step
  changing a few documents copies ~20x fewer rows (:mod:`bench.views_terms_layout`). A table of the
  earlier per-term layout records another stamp (:data:`TERMS_LAYOUT`) and is rewritten whole once.
- ``search/<index>/_dead_letter``: poison events.

A sync step finds the affected documents once (:func:`derived_views.views.composite_sync.affected_roots`:
a renamed category re-indexes its products and nothing else), re-computes them from the state copies and
MERGEs them on ``_cdc_key``; beside it, in a Spark session of its own, the terms of the same documents are
computed from the same rows of the state copies (not read back from ``documents``) and MERGEd on
``doc`` (a document gone or filtered out loses its row in the same commit). Each table tracks
its own progress (with the definition's fingerprint) in its own commits, so each is exact as of the
watermark of its newest commit, whatever the other's: a document is a pure function of the state copies
as of the watermark, and so are its terms. After a crash between the two commits, the table behind
finds its own affected roots from its own progress and catches up; a step applied again changes
nothing. ``cdc search`` ranks with BM25 (:mod:`derived_views.views.bm25`) over the terms, reading with
``deltalake`` (no JVM).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from dataclasses import replace as with_fields
from typing import TYPE_CHECKING, Any

from derived_views.engine.delta_reads import read_query, sql_text
from derived_views.engine.delta_sql import merge_into
from derived_views.engine.evaluation import sized_for
from derived_views.engine.progress import Progress
from derived_views.errors import EarlierLayoutError, MissingTableError
from derived_views.events.column_names import quote, source_columns
from derived_views.events.metadata_columns import KEY, LSN
from derived_views.events.schema import TableSchema
from derived_views.source.as_of import LogAsOf, pending_events
from derived_views.source.table_step import TableStep
from derived_views.views import kinds
from derived_views.views.bm25 import SPARK_SPLIT, Posting, rank, tokenize
from derived_views.views.composite import Composite
from derived_views.views.composite_sync import (
    affected_keys,
    check_definition,
    composed,
    held_since,
    merge_roots,
    merge_with_progress,
    overwrite,
    path,
    roots_frame,
    source_schemas,
    sync_states,
    tables_read,
)
from derived_views.write.context import ViewContext
from derived_views.write.steps import TableResult, is_current, mark_as_of, starting_point

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

NAME = kinds.SEARCH
#: The index's tables below its directory, and what each holds.
TABLES = kinds.SEARCH_TABLES
TERMS_DDL = "doc string, terms array<struct<term:string,tf:int>>, doc_len int"
#: The terms table's layout, recorded after the definition's stamp in its commits: a table written with
#: another layout (the earlier one row per (document, term) recorded none) is rewritten whole once.
TERMS_LAYOUT = "terms-per-doc"


def _stamp(plan: Composite, name: str) -> str:
    """What the commits of the index's table ``name`` record as their definition."""
    return f"{plan.stamp}/{TERMS_LAYOUT}" if name == "terms" else plan.stamp


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
    counted = exploded.groupBy("doc", "term").agg(
        F.count(F.lit(1)).cast("int").alias("tf"), F.first("doc_len").cast("int").alias("doc_len")
    )
    return counted.groupBy("doc").agg(
        F.sort_array(F.collect_list(F.struct("term", "tf"))).alias("terms"), F.first("doc_len").alias("doc_len")
    )


def _merge_terms(ctx: ViewContext, table: str, roots: DataFrame, terms: DataFrame, progress: Progress) -> None:
    """Replace the terms of the documents in ``roots`` by ``terms`` in one commit: a root without terms
    (gone, filtered out or without a token) loses its row."""
    from pyspark.sql import functions as F

    ctx.types.ensure(ctx.spark, table, TERMS_DDL)
    if roots.isEmpty():
        mark_as_of(ctx, table, progress)
        return
    source = roots.select(F.col(KEY).alias("doc")).distinct().join(terms, "doc", "left")
    builder = (
        merge_into(ctx.spark, table, source, "t.doc = s.doc")
        .when_matched_delete(condition="s.terms IS NULL")
        .when_matched_update({"terms": "s.terms", "doc_len": "s.doc_len"})
        .when_not_matched_insert({"doc": "s.doc", "terms": "s.terms", "doc_len": "s.doc_len"}, condition="s.terms IS NOT NULL")
    )
    merge_with_progress(ctx, table, builder.execute, progress)


@dataclass
class _Step:
    """What one sync step of an index shares between its two output tables."""

    as_of: LogAsOf
    plan: Composite
    schemas: dict[str, TableSchema]
    topics: list[str]
    keys: dict[str, Any] = field(default_factory=dict)
    """Affected roots already found (pyarrow tables of ``_cdc_key``), by the progress they were found from."""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def affected(self, ctx: ViewContext, progress: Progress, output: str) -> DataFrame | None:
        """The roots the events after ``progress`` affect, as a frame of ``ctx``'s session (``None``: all);
        found once for both tables when they start from the same progress."""
        key = json.dumps(progress.offsets, sort_keys=True)
        with self.lock:
            if key not in self.keys:
                self.keys[key] = affected_keys(ctx, self.as_of, self.plan, self.schemas, progress, output)
        keys = self.keys[key]
        return None if keys is None else roots_frame(ctx, keys)

    def pending(self, ctx: ViewContext, name: str, replace: bool) -> tuple[Progress | None, Progress] | None:
        """``(progress, new progress)`` of the index's table ``name``; ``None`` when it is current (and of
        the current stamp: a table of an earlier layout is rewritten even without new events)."""
        table, stamp = path(ctx, self.plan, name), _stamp(self.plan, name)
        progress, replace = starting_point(ctx, table, replace)
        if (
            progress is not None
            and progress.definition == stamp
            and is_current(ctx, TableStep(self.as_of, self.topics, table, applied=progress))
        ):
            return None
        new_progress = self.as_of.progress(self.topics, progress, since=held_since(ctx, self.plan))
        return progress, with_fields(new_progress, definition=stamp)


#: How a step writes one output table: ``(context, plan, table path, affected roots or None for all, new progress)``.
_Write = Callable[[ViewContext, Composite, str, "DataFrame | None", Progress], None]


def _apply_output(
    step: _Step, ctx: ViewContext, name: str, pending: tuple[Progress | None, Progress], write: _Write
) -> TableResult:
    """Bring the index's table ``name`` to the step's watermark with ``write`` (in ``ctx``'s session): over
    the affected roots' rows, or whole (roots ``None``) when the table is new, rebuilt or its definition
    changed."""
    table = path(ctx, step.plan, name)
    progress, new_progress = pending
    with sized_for(ctx.spark, pending_events(step.as_of.watermark, step.topics, progress), tables_read(ctx, step.plan, TABLES)):
        whole = progress is None or progress.definition != _stamp(step.plan, name)
        roots = None if whole or progress is None else step.affected(ctx, progress, table)
        write(ctx, step.plan, table, roots, new_progress)
    ctx.set_progress(table, new_progress)
    return TableResult(table, 0 if roots is None else roots.count(), 0)


def _write_documents(ctx: ViewContext, plan: Composite, table: str, roots: DataFrame | None, new_progress: Progress) -> None:
    if roots is None:
        overwrite(ctx, documents(ctx, plan, None), table, new_progress)
    else:
        merge_roots(ctx, table, roots, documents(ctx, plan, roots), new_progress)


def _write_terms(ctx: ViewContext, plan: Composite, table: str, roots: DataFrame | None, new_progress: Progress) -> None:
    """The terms of the documents of ``roots``, computed from the state copies as the documents are (not
    read back from ``documents``, which may be behind or ahead of the terms after a crash)."""
    terms = _term_rows(plan, documents(ctx, plan, roots))
    if roots is None:
        overwrite(ctx, terms, table, new_progress)
    else:
        _merge_terms(ctx, table, roots, terms, new_progress)


#: The index's output tables and how a step writes each (both from the state copies, so side by side).
_OUTPUTS = {"documents": _write_documents, "terms": _write_terms}


def sync(ctx: ViewContext, as_of: LogAsOf, plan: Composite, *, replace: bool = False) -> list[TableResult]:
    """Bring the index's state copies, then its documents and its terms (side by side, each in a
    session of its own) to the range's watermark (rebuild them from the log when ``replace``)."""
    schemas = source_schemas(ctx, as_of, plan)
    if not replace:
        for name in TABLES:
            table = path(ctx, plan, name)
            check_definition(plan, table, ctx.progress(table))
    step = _Step(as_of, plan, schemas, sorted({schema.topic for schema in schemas.values()}))
    results = sync_states(ctx, as_of, plan, schemas, replace=replace)
    lanes = {"documents": ctx.beside(), "terms": ctx}
    pending = {name: step.pending(lanes[name], name, replace) for name in _OUTPUTS}
    work = {name: todo for name, todo in pending.items() if todo is not None}
    if len(work) < 2:
        results.extend(_apply_output(step, lanes[name], name, todo, _OUTPUTS[name]) for name, todo in work.items())
        return results
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="search-documents") as pool:
        beside = pool.submit(_apply_output, step, lanes["documents"], "documents", work["documents"], _OUTPUTS["documents"])
        try:
            terms = _apply_output(step, ctx, "terms", work["terms"], _OUTPUTS["terms"])
        finally:
            documents_result = beside.result()  # raises the documents' error, if any, after the terms ran
    results.extend([documents_result, terms])
    return results


@dataclass(frozen=True)
class Hit:
    """One search result: the document's key columns, its score and its stored fields."""

    key: dict[str, Any]
    score: float
    fields: dict[str, Any]


def tables(views_dir: str, index: str) -> dict[str, str]:
    """The tables ``cdc search`` reads of ``index``, by name (``search/<index>/terms``...): each path."""
    base = f"{views_dir.rstrip('/')}/{NAME}/{index}"
    return {f"{NAME}/{index}/{table}": f"{base}/{table}" for table in TABLES}


def query(
    views_dir: str,
    index: str,
    text: str,
    limit: int = 10,
    stored: Sequence[str] = (),
    versions: Mapping[str, int] | None = None,
) -> list[Hit]:
    """The best ``limit`` documents of ``index`` for ``text`` by BM25 over its terms table, with their
    ``stored`` columns. Read with ``deltalake``, without Spark: a query answers in a fraction of a second.
    ``versions``: the Delta version to read of each table (by path, as :func:`tables` names them; default
    the newest), the versions exact as of one LSN
    (:func:`~derived_views.runs.as_of_reads.select_versions`)."""
    from deltalake import DeltaTable

    base = f"{views_dir.rstrip('/')}/{NAME}/{index}"
    terms_path, documents_path = f"{base}/terms", f"{base}/documents"
    terms_version = (versions or {}).get(terms_path)
    documents_version = (versions or {}).get(documents_path)
    if not DeltaTable.is_deltatable(terms_path):
        raise MissingTableError(terms_path, f"{NAME}.{index}")
    terms_fields = DeltaTable(terms_path, version=terms_version).schema().fields
    if "terms" not in {f.name for f in terms_fields}:  # one row per (document, term)
        raise EarlierLayoutError(terms_path, f"{NAME}.{index}")
    words = sorted(set(tokenize(text)))
    if not words:
        return []
    stats = read_query(terms_path, "SELECT count(*) AS n, avg(doc_len) AS avg_len FROM t", terms_version).to_pylist()[0]
    n_docs, avg_len = int(stats["n"] or 0), float(stats["avg_len"] or 0.0)
    postings = "SELECT doc, doc_len, unnest(terms) AS e FROM t"
    found = read_query(
        terms_path,
        f"SELECT doc, e['term'] AS term, e['tf'] AS tf, doc_len FROM ({postings}) WHERE e['term'] IN ("
        + ", ".join(sql_text(word) for word in words)
        + ")",
        terms_version,
    ).to_pylist()
    best = rank([Posting(r["doc"], r["term"], r["tf"], r["doc_len"]) for r in found], n_docs, avg_len, limit)
    if not best:
        return []
    held = source_columns(stored, [f.name for f in DeltaTable(documents_path, version=documents_version).schema().fields])
    columns = ", ".join(['"' + held.get(c, c).replace('"', '""') + '"' for c in stored] + [KEY])
    docs = {
        r[KEY]: r
        for r in read_query(
            documents_path,
            f"SELECT {columns} FROM t WHERE {KEY} IN (" + ", ".join(sql_text(doc) for doc, _ in best) + ")",
            documents_version,
        ).to_pylist()
    }
    return [Hit(json.loads(doc), score, {c: docs[doc][held.get(c, c)] for c in stored}) for doc, score in best if doc in docs]
