"""The products of the reference schema kept from the change log by a Spark Declarative Pipeline.

- ``product_changes`` (a streaming table): every change event of ``public.products``, read from the
  ``cdclog`` source with its envelopes parsed (option ``rows=events``) and typed with ``from_json``. Each
  run appends what the log committed since the last one, up to the latest commit watermark, so the table
  never holds part of a source transaction; the stream's checkpoint lives under the spec's ``storage``.
- ``products`` (a materialized view): one row per key, as the source holds it at the last watermark
  read, computed from ``product_changes`` on every run:

  1. a partial row (an update that left TOAST values out, listed in ``unchanged``) takes each missing
     column from the key's previous event that held it, so no value becomes a null the source did not hold;
  2. each key's latest event by ``(lsn, sequence)`` wins; a delete (``op = 'd'``, tombstones included)
     removes the key;
  3. a truncate (``op = 't'``) removes every key whose latest event comes before it.

  An event whose envelope cannot be read stays in ``product_changes`` with its ``error`` and is left out.

``create_auto_cdc_flow`` would keep ``products`` incrementally, but Spark 4.2 runs it only into a table
whose connector supports row-level operations, which Delta 4.4's does not, and it neither folds partial
rows nor applies truncates: see ``docs/spark-source.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark import pipelines as dp
from pyspark.sql import SparkSession, Window
from pyspark.sql import functions as F

import derived_views
from derived_views.runs.pipeline_runs import accept_metrics_in_runs

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

spark = SparkSession.active()  # the session spark-pipelines runs this file in
derived_views.register(spark)
# pyspark 4.2's CLI would end a completed run that read a Python data source with an error
accept_metrics_in_runs()

LOG = spark.conf.get("cdc.log")
TOPIC = spark.conf.get("cdc.topic", "cdc.public.products")

#: The key and the columns of public.products as the warehouse types them (docs/event-format.md).
KEY = "id bigint"
COLUMNS = [
    ("id", "bigint"),
    ("category_id", "int"),
    ("name", "string"),
    ("description", "string"),
    ("price", "decimal(12,2)"),
    ("attributes", "string"),
    ("tags", "array<string>"),
    ("updated_at", "timestamp"),
]
NAMES = [name for name, _ in COLUMNS]


@dp.table(comment="Every change event of public.products, in log order.")
def product_changes() -> DataFrame:
    events = spark.readStream.format("cdclog").option("path", LOG).option("topics", TOPIC).option("rows", "events").load()
    row = F.from_json("after", ", ".join(f"{name} {spark_type}" for name, spark_type in COLUMNS))
    return events.select(
        F.from_json("key", KEY)["id"].alias("key_id"),
        "op",
        "lsn",
        "sequence",
        "commit_ts_ms",
        *(row[name].alias(name) for name in NAMES if name != "id"),
        F.coalesce("unchanged", F.array().cast("array<string>")).alias("unchanged"),
        "error",
        "partition",
        "offset",
    )


@dp.materialized_view(comment="public.products as of the last watermark read.")
def products() -> DataFrame:
    changes = spark.read.table("product_changes").where("error IS NULL")
    position = F.struct("lsn", "sequence")
    history = Window.partitionBy("key_id").orderBy("lsn", "sequence").rowsBetween(Window.unboundedPreceding, 0)
    # 1. a column an event left out takes its value from the key's latest earlier event that held it
    folded = changes.where("op <> 't'").select(
        "key_id",
        "op",
        "lsn",
        "sequence",
        *(
            F.last(F.when(~F.array_contains("unchanged", name), F.struct(F.col(name).alias("v"))), ignorenulls=True)
            .over(history)["v"]
            .alias(name)
            for name in NAMES
            if name != "id"
        ),
    )
    # 2. the latest event of each key
    latest = Window.partitionBy("key_id").orderBy(F.col("lsn").desc(), F.col("sequence").desc())
    current = folded.withColumn("rank", F.row_number().over(latest)).where("rank = 1 AND op <> 'd'")
    # 3. keys whose latest event precedes the last truncate are gone
    truncated = changes.where("op = 't'").agg(F.max(position).alias("at"))
    current = current.crossJoin(truncated).where(F.col("at").isNull() | (position > F.col("at")))
    return current.select(F.col("key_id").alias("id"), *(name for name in NAMES if name != "id"))
