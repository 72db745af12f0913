"""The view tables' columns as this context knows them, and how a table follows a change of its columns.

A step asks before every MERGE whether the target table has the columns of its batch; reading a Delta
table's schema replays its log, so the answer is kept per table (:class:`TableTypes`, one per
:class:`~derived_views.write.context.ViewContext`, shared with its sibling sessions). What this context did not
write itself it reads again after :meth:`TableTypes.forget`, which the context calls whenever another
process may have written (a new run of a step, a rebuild).

A table is brought to a batch's columns in commits of their own that carry no progress, before the
batch's MERGE: missing columns are added, and a column whose type differs is converted to the
:func:`~derived_views.events.column_types.supertype` of both (never narrowed).

**Table features of types.** A Delta table holds a ``timestamp_ntz`` column (PostgreSQL's ``timestamp``)
only with the ``timestampNtz`` table feature. Delta enables it by itself when it creates a table with
such a column, never when an existing table gains one (``ADD COLUMNS``, or a rebuild's overwrite with
``overwriteSchema``): that fails with ``DELTA_FEATURES_REQUIRE_MANUAL_ENABLEMENT``, at every step and
every rebuild. So before a table gains a column of a type in :data:`TYPE_FEATURES`, the feature is
enabled in a commit of its own that carries no progress (:func:`enable_features`); a sync killed
between the two finds the feature there and adds the column on its next run. Enabling it raises the
table's protocol to reader 3 / writer 7 with that one feature, which ``deltalake`` reads. Of Delta's other
features tied to a type, none is needed: no view column is a ``variant``, and a column whose type widens
is rewritten (:func:`_retype`), not widened in place (``typeWidening``, which not every reader has).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, cast

from derived_views.engine.commit_progress import committing
from derived_views.engine.delta_sql import create_if_missing, is_delta_table, partition_columns, table_ref
from derived_views.events.column_names import quote
from derived_views.events.column_types import convert, supertype

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, DataFrameWriter, SparkSession


class TableTypes:
    """Column name -> Spark type (DDL form) of each view table at its path, as last read or written."""

    def __init__(self) -> None:
        self._known: dict[str, dict[str, str]] = {}

    def of(self, spark: SparkSession, path: str) -> dict[str, str] | None:
        """Column name -> Spark type (DDL form) of the Delta table at ``path``; ``None`` when there is none."""
        known = self._known.get(path)
        if known is not None:
            return known
        if not is_delta_table(spark, path):
            return None
        types = {f.name: f.dataType.simpleString() for f in spark.read.format("delta").load(path).schema.fields}
        self._known[path] = types
        return types

    def ensure(self, spark: SparkSession, path: str, ddl: str, partitioned_by: Sequence[str] = ()) -> None:
        """Create the Delta table at ``path`` with ``ddl`` (partitioned by ``partitioned_by``), or bring it
        to ``ddl``: columns it lacks are added, and a column whose type differs is converted to the
        :func:`~derived_views.events.column_types.supertype` of both (:func:`_retype`); a column is never
        narrowed. An existing table keeps its partitioning."""
        from pyspark.sql.types import StructType

        wanted = cast(StructType, StructType.fromDDL(ddl))
        wanted_types = {f.name: f.dataType.simpleString() for f in wanted.fields}
        existing = self.of(spark, path)
        if existing is not None and all(existing.get(n) == t for n, t in wanted_types.items()):
            return
        if existing is None:
            with committing(spark, None):
                create_if_missing(spark, path, ddl, partitioned_by)
            self._known[path] = wanted_types
            return
        changed = {n: supertype(existing[n], t) for n, t in wanted_types.items() if n in existing and existing[n] != t}
        changed = {n: t for n, t in changed.items() if t != existing[n]}
        missing = [f for f in wanted.fields if f.name not in existing]
        self.forget(path)  # read again after a failure part way: a conversion must start from the table's types
        enable_features(spark, path, [*changed.values(), *(f.dataType.simpleString() for f in missing)], existing.values())
        if changed:
            _retype(spark, path, existing, changed)
        if missing:
            added = ", ".join(f"{quote(f.name)} {f.dataType.simpleString()}" for f in missing)
            with committing(spark, None):
                spark.sql(f"ALTER TABLE {table_ref(path)} ADD COLUMNS ({added})")
        self._known[path] = {**existing, **changed, **{f.name: f.dataType.simpleString() for f in missing}}

    def prepare_overwrite(self, spark: SparkSession, path: str, types: Iterable[str]) -> None:
        """Enable the table features that columns of ``types`` need in the table at ``path`` before it is
        overwritten with them (:func:`enable_features`); nothing when there is no table there yet."""
        existing = self.of(spark, path)
        if existing is not None:
            enable_features(spark, path, types, existing.values())

    def rename(self, spark: SparkSession, path: str, renames: dict[str, str]) -> None:
        """Rename columns of the table at ``path`` (``{old: new}``) in one commit that carries no progress,
        by rewriting it: a rename in place needs Delta's column mapping, which not every reader supports."""
        from pyspark.sql import functions as F

        frame = spark.read.format("delta").load(path)
        renamed = frame.select(*[F.col(quote(name)).alias(renames.get(name, name)) for name in frame.columns])
        partitions = [renames.get(name, name) for name in partition_columns(spark, path)]
        with committing(spark, None):
            overwriting_writer(renamed, partitions).save(path)
        self.forget(path)

    def forget(self, path: str | None = None) -> None:
        """Drop what is known of ``path``'s columns (of every table without ``path``): another process,
        or a rewrite of the table, may have changed them."""
        if path is None:
            self._known.clear()
        else:
            self._known.pop(path, None)


def _retype(spark: SparkSession, path: str, existing: dict[str, str], changed: dict[str, str]) -> None:
    """Rewrite the table at ``path`` with the ``changed`` columns converted to their new (wider) types,
    in one Delta commit that carries no progress (the table stays as of the watermark it recorded).

    Readers see the old table until the commit; a sync killed before it converts again on its next run.
    The conversion is exact (:func:`~derived_views.events.column_types.convert`): integer, float and decimal
    widenings are casts, and a column that becomes ``string`` holds each value's JSON text.
    """
    from pyspark.sql import functions as F

    frame = spark.read.format("delta").load(path)
    converted = frame.select(
        *[
            convert(F.col(quote(name)), existing[name], changed[name]).alias(name) if name in changed else F.col(quote(name))
            for name in frame.columns
        ]
    )
    partitions = partition_columns(spark, path)
    with committing(spark, None):
        overwriting_writer(converted, partitions).save(path)


def overwriting_writer(frame: DataFrame, partitioned_by: Sequence[str]) -> DataFrameWriter:
    """A writer that replaces a whole Delta table, its columns too (``overwriteSchema``), by ``frame``,
    partitioned by ``partitioned_by``: such a rewrite drops any partitioning it is not given."""
    writer = frame.write.format("delta").mode("overwrite").option("overwriteSchema", "true")
    return writer.partitionBy(*partitioned_by) if partitioned_by else writer


#: The Delta table feature a column of each Spark type needs (the type anywhere in it: an array's
#: element, a struct's field), which Delta enables by itself only in a table it creates (see the
#: module docstring).
TYPE_FEATURES = {"timestamp_ntz": "timestampNtz"}


def features_of(types: Iterable[str]) -> set[str]:
    """The table features (:data:`TYPE_FEATURES`) that columns of ``types`` (DDL form) need."""
    return {feature for spark_type in types for name, feature in TYPE_FEATURES.items() if re.search(rf"\b{name}\b", spark_type)}


def enable_features(spark: SparkSession, path: str, types: Iterable[str], existing: Iterable[str]) -> None:
    """Enable in the table at ``path``, whose columns have the ``existing`` types, the table features that
    columns of ``types`` need and none of its columns needed, in one commit that carries no progress."""
    features = features_of(types) - features_of(existing)
    if not features:
        return
    properties = ", ".join(f"'delta.feature.{feature}' = 'supported'" for feature in sorted(features))
    with committing(spark, None):
        spark.sql(f"ALTER TABLE {table_ref(path)} SET TBLPROPERTIES ({properties})")
