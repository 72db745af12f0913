"""Derived views kept exact from the change log: the warehouse, search indexes and cache entities.

Modules:

- :mod:`~derived_views.log_source`: the ``cdclog`` Spark data source (batch and streaming), the only
  module that knows where the log lives; :func:`register` makes it known to a user's own session, and
  :mod:`~derived_views.change_events` parses its envelopes into columns (option ``rows=events``).
- :mod:`~derived_views.reduction`: change events decoded, and reduced per key for a batch (pure Python).
- :mod:`~derived_views.schema`: source column lists and their faithful Spark types.
- :mod:`~derived_views.pending`: a table's pending events, reduced and typed (by Arrow where
  :mod:`~derived_views.typed_rows` can), with their facts.
- :mod:`~derived_views.apply` (the rules and table plumbing every table shares), :mod:`~derived_views.scd1`
  (one row per key), :mod:`~derived_views.scd2` (one row per version), :mod:`~derived_views.dead_letter`,
  :mod:`~derived_views.steps` (one table's batch, read, typed and applied).
- :mod:`~derived_views.progress`: applied offsets and as-of watermark stored in each Delta commit.
- :mod:`~derived_views.definitions`: the views file; :mod:`~derived_views.composite`: search indexes and
  cache entities as checked plans; :mod:`~derived_views.composite_sync`: their incremental maintenance.
- :mod:`~derived_views.warehouse`, :mod:`~derived_views.search`, :mod:`~derived_views.cache`: the views.
- :mod:`~derived_views.runner`: sync steps, continuous mode, rebuild; :mod:`~derived_views.verify`.

Every view table is a pure function of the log: ``cdc rebuild VIEW`` recreates it by replay.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def register(spark: SparkSession) -> None:
    """Make the change log's Spark data source, ``spark.read.format("cdclog")`` and
    ``spark.readStream.format("cdclog")``, available in ``spark`` (a classic or a Spark Connect session;
    idempotent). See ``docs/spark-source.md``.

    Imported here lazily, so that importing the package does not import Spark.
    """
    from derived_views.log_source import register as register_source

    register_source(spark)
