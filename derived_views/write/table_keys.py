"""Whether a view table holds any of a batch's keys, answered in the driver without a Spark job.

The append check of insert-only batches (rule 7 of :mod:`derived_views.write.apply`) runs once per table and
sync step; as a Spark job it costs seconds of a continuous sync's step. Here the ``deltalake`` library
reads the table's key column at its latest version (deletion vectors applied, so deleted rows are not
seen) and the batch's keys are looked up in it with Arrow. One writer per view (the view lock) means
the version read is the one the append then commits on top of.

When the table cannot be read this way (a storage the library has no credentials for, a table feature
it does not support), :func:`holds_any` answers ``None`` and the caller asks Spark, which is the
reference reader.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

KEY_COLUMN = "_cdc_key"


def holds_any(path: str, keys: Sequence[str], *, current_only: bool = False) -> bool | None:
    """Whether the Delta table at ``path`` has a row whose key is one of ``keys`` (``current_only``: a
    row with ``_cdc_is_current``); ``None`` when the table cannot be read without Spark.

    The key column is streamed batch by batch (memory for one batch, whatever the table's size) and
    the scan stops at the first key found."""
    from deltalake import DeltaTable, QueryBuilder
    from deltalake.exceptions import DeltaError

    if not keys:
        return False
    wanted = pa.array(list(keys), pa.large_string())
    where = " WHERE _cdc_is_current" if current_only else ""
    try:
        result = QueryBuilder().register("t", DeltaTable(path)).execute(f"SELECT {KEY_COLUMN} FROM t{where}")
        for batch in pa.RecordBatchReader.from_stream(result):
            stored = batch.column(0).cast(pa.large_string())
            if pc.any(pc.is_in(stored, value_set=wanted)).as_py():
                return True
    except (DeltaError, OSError, pa.ArrowException):
        return None
    return False
