"""Writing view tables: one sync step's context, the MERGE rules every table shares, one row per key
(SCD1) or per version (SCD2), table evolution, dead letters, failed-table records, and one table's step.

Above :mod:`derived_views.source`, below :mod:`derived_views.views` (and :mod:`derived_views.runs`).
"""
