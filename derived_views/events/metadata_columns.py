"""The metadata columns every typed batch and every view table carries beside its data columns.

:data:`KEY`, :data:`LSN`, :data:`SEQ`, :data:`TS`, :data:`OP` and :data:`UNCHANGED` are the columns the
MERGEs of :mod:`derived_views.write.apply` read and write; :data:`TYPED_METADATA` is the one ordered list
that typing by Spark (:mod:`derived_views.events.spark_typing`) and in the driver
(:mod:`derived_views.events.driver_typed`) both build their rows from.
"""

from __future__ import annotations

KEY, LSN, SEQ, TS, OP, UNCHANGED = "_cdc_key", "_cdc_lsn", "_cdc_seq", "_cdc_commit_ts", "_cdc_op", "_cdc_unchanged"


#: The metadata columns of typed rows, after their data columns, in order, with their Spark types: the
#: one list :func:`typed` and :mod:`derived_views.events.driver_typed` both build their rows from.
TYPED_METADATA: tuple[tuple[str, str], ...] = (
    (KEY, "string"),
    (LSN, "bigint"),
    (SEQ, "bigint"),
    (TS, "timestamp"),
    (OP, "string"),
    (UNCHANGED, "array<string>"),
    ("_cdc_topic", "string"),
    ("_cdc_partition", "int"),
    ("_cdc_offset", "bigint"),
    ("_cdc_raw", "string"),
    ("_cdc_error", "string"),
    ("_cdc_widen", "array<string>"),
)
