"""What a MERGE of a few documents' terms rewrites in a search index's terms table, by the table's layout.

Usage: python -m bench.views_terms_layout [documents] [terms_per_document]
(default 100,000 documents of 20 terms: 2,000,000 rows)

A terms table (``doc``, ``term``, ``tf``, ``doc_len``, as :mod:`derived_views.views.search` writes it) is
built once per layout, then :data:`MERGES` times the terms of :data:`MERGE_DOCS` random documents are
replaced (a few terms' ``tf`` changed, one term removed, one added; the per-term layouts MERGE with the
clauses ``search._merge_terms`` used for them), each layout in turn with the same documents. Layouts:

- the anchor: as ``cdc sync`` wrote the table before one row per document (a plain overwrite of the
  terms computed by a ``groupBy(doc, term)``, so its files hash-partitioned by ``(doc, term)``: every file holds terms of
  every document), MERGEd on ``(doc, term)``;
- partitioned by ``bucket = pmod(xxhash64(doc), N)``, MERGEd with ``t.bucket = s.bucket`` and the
  affected buckets as literals in the ON condition (so Delta prunes the other partitions);
- one row per document, its terms an ``array<struct<term, tf>>`` (MERGEd on ``doc``);
- both: one row per document, partitioned by bucket.

Printed per layout: the table's files, Delta's metrics (mean per MERGE, after one more that warms up),
the MERGE's wall time (median, the stale-term lookup included) and a BM25-style term lookup read with
``deltalake`` (what ``cdc search`` does). Prints figures only; it asserts nothing.
"""

from __future__ import annotations

import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from bench.views_common import load_average
from derived_views.engine.delta_reads import read_query

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

MERGE_DOCS = 20
MERGES = 3
METRICS = ("numTargetRowsCopied", "numTargetFilesRemoved", "numTargetFilesAdded")
#: Distinct words the synthetic documents draw their terms from.
VOCABULARY = 5000


@dataclass(frozen=True)
class Layout:
    label: str
    name: str
    buckets: int | None
    nested: bool


LAYOUTS = (
    Layout("as cdc sync laid it out (anchor)", "anchor", None, False),
    Layout("partitioned by 16 buckets of doc", "b16", 16, False),
    Layout("partitioned by 64 buckets of doc", "b64", 64, False),
    Layout("one row per doc, terms array", "nested", None, True),
    Layout("one row per doc, 16 buckets", "nested_b16", 16, True),
)


def _terms(ids: DataFrame, per_doc: int, salt: int = 0) -> DataFrame:
    """``per_doc`` distinct terms per document of ``ids`` (column ``n``), as the index's rows (``salt``
    shifts the tf)."""
    from pyspark.sql import functions as F

    rows = ids.select(
        F.to_json(F.struct(F.col("n").alias("id"))).alias("doc"),
        F.explode(F.sequence(F.lit(0), F.lit(per_doc - 1))).alias("i"),
        "n",
    )
    return rows.select(
        "doc",
        F.concat(F.lit("w"), ((F.col("n") * 7919 + F.col("i") * 104729) % VOCABULARY).cast("string")).alias("term"),
        (1 + (F.col("n") + F.col("i") + salt) % 3).cast("int").alias("tf"),
        F.lit(per_doc * 2).cast("int").alias("doc_len"),
    ).dropDuplicates(["doc", "term"])


def _bucket(buckets: int) -> str:
    return f"pmod(xxhash64(doc), {buckets})"


def _shaped(frame: DataFrame, layout: Layout) -> DataFrame:
    from pyspark.sql import functions as F

    if layout.nested:
        frame = frame.groupBy("doc").agg(
            F.sort_array(F.collect_list(F.struct("term", "tf"))).alias("terms"), F.first("doc_len").alias("doc_len")
        )
    if layout.buckets:
        frame = frame.withColumn("bucket", F.expr(_bucket(layout.buckets)).cast("int"))
    return frame


def _build(spark: SparkSession, terms: DataFrame, layout: Layout, path: str) -> None:
    frame = _shaped(terms, layout)
    if layout.buckets:
        frame.repartition("bucket").write.format("delta").partitionBy("bucket").save(path)
    else:
        frame.write.format("delta").save(path)


def _changed(spark: SparkSession, keys: list[int], per_doc: int, round_number: int) -> DataFrame:
    """The new terms of documents ``keys``: tf shifted, the first term gone, a new one."""
    from pyspark.sql import functions as F

    for_docs = _terms(spark.createDataFrame([(k,) for k in keys], "n long"), per_doc, salt=round_number + 1)
    first = F.concat(F.lit("w"), ((F.get_json_object("doc", "$.id").cast("long") * 7919) % VOCABULARY).cast("string"))
    kept = for_docs.filter(F.col("term") != first)
    added = (
        kept.select("doc")
        .distinct()
        .select("doc", F.lit(f"fresh{round_number}").alias("term"), F.lit(1).alias("tf"), F.lit(per_doc * 2).alias("doc_len"))
    )
    return kept.unionByName(added)


def _merge(spark: SparkSession, path: str, layout: Layout, changed: DataFrame) -> None:
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    source = _shaped(changed, layout)
    on = "t.doc = s.doc"
    if layout.buckets:
        held = sorted({r[0] for r in source.select("bucket").distinct().collect()})
        on = f"t.bucket IN ({', '.join(map(str, held))}) AND t.bucket = s.bucket AND {on}"
    target = DeltaTable.forPath(spark, path)
    if layout.nested:
        target.alias("t").merge(source.alias("s"), on).whenMatchedUpdateAll().whenNotMatchedInsertAll().execute()
        return
    old = spark.read.format("delta").load(path)
    if layout.buckets:
        old = old.filter(F.col("bucket").isin(held))
    old = old.join(source.select("doc").distinct(), "doc", "left_semi").select(
        "doc", "term", *(["bucket"] if layout.buckets else [])
    )
    stale = old.join(source.select("doc", "term"), ["doc", "term"], "left_anti").select(
        "*", F.lit(None).cast("int").alias("tf"), F.lit(None).cast("int").alias("doc_len"), F.lit(True).alias("_drop")
    )
    merged = source.withColumn("_drop", F.lit(False)).unionByName(stale)
    values = {c: f"s.{c}" for c in source.columns}
    (
        target.alias("t")
        .merge(merged.alias("s"), f"{on} AND t.term = s.term")
        .whenMatchedDelete("s._drop")
        .whenMatchedUpdate(set={"tf": "s.tf", "doc_len": "s.doc_len"})
        .whenNotMatchedInsert(condition="NOT s._drop", values=values)
        .execute()
    )


def _last_merge(spark: SparkSession, path: str) -> dict[str, int]:
    metrics = spark.sql(f"DESCRIBE HISTORY delta.`{path}` LIMIT 1").collect()[0]["operationMetrics"] or {}
    return {name: int(value) for name, value in metrics.items() if value.isdigit()}


def _lookup(path: str, layout: Layout) -> float:
    """Seconds of a two-term lookup read with ``deltalake`` (as ``cdc search`` reads the terms)."""
    started = time.perf_counter()
    if layout.nested:
        sql = "SELECT doc, doc_len, unnest(terms) AS e FROM t"
        rows = read_query(path, f"SELECT doc FROM ({sql}) WHERE e['term'] IN ('w17', 'w42')")
    else:
        rows = read_query(path, "SELECT doc, term, tf, doc_len FROM t WHERE term IN ('w17', 'w42')")
    assert rows.num_rows > 0
    return time.perf_counter() - started


def main(docs: int, per_doc: int) -> None:
    from bench.views_common import bench_spark

    spark = bench_spark()
    print(load_average())
    with tempfile.TemporaryDirectory(prefix="cdc-terms-layout-") as workdir:
        base = _terms(spark.range(docs).withColumnRenamed("id", "n"), per_doc).localCheckpoint()
        rows = base.count()
        paths = {layout.name: str(Path(workdir, layout.name)) for layout in LAYOUTS}
        builds = {}
        for layout in LAYOUTS:
            started = time.perf_counter()
            _build(spark, base, layout, paths[layout.name])
            builds[layout.name] = time.perf_counter() - started
        chooser = random.Random(5)
        metrics: dict[str, list[dict[str, int]]] = {layout.name: [] for layout in LAYOUTS}
        walls: dict[str, list[float]] = {layout.name: [] for layout in LAYOUTS}
        for round_number in range(MERGES + 1):
            keys = chooser.sample(range(docs), MERGE_DOCS)
            changed = _changed(spark, keys, per_doc, round_number).localCheckpoint()
            for layout in LAYOUTS:
                started = time.perf_counter()
                _merge(spark, paths[layout.name], layout, changed)
                if round_number:
                    walls[layout.name].append(time.perf_counter() - started)
                    metrics[layout.name].append(_last_merge(spark, paths[layout.name]))
        print(f"terms layout: {MERGES} MERGEs of {MERGE_DOCS} random documents' terms into {rows:,} rows")
        print("  (mean per MERGE, after one more)")
        print(f"  {'layout':<36}{'build s':>8}{'files':>7}{'rows copied':>13}{'files -/+':>12}{'MERGE s':>9}{'lookup s':>9}")
        for layout in LAYOUTS:
            from deltalake import DeltaTable

            mean = {name: statistics.mean(m.get(name, 0) for m in metrics[layout.name]) for name in METRICS}
            files = len(DeltaTable(paths[layout.name]).file_uris())
            print(
                f"  {layout.label:<36}{builds[layout.name]:8.1f}{files:7d}{mean['numTargetRowsCopied']:13,.0f}"
                f"{mean['numTargetFilesRemoved']:7.1f}/{mean['numTargetFilesAdded']:<4.1f}"
                f"{statistics.median(walls[layout.name]):9.2f}{_lookup(paths[layout.name], layout):9.2f}"
            )
    print(load_average())
    spark.stop()


if __name__ == "__main__":
    arguments = [int(a) for a in sys.argv[1:]]
    main(*(arguments + [100_000, 20][len(arguments) :]))
