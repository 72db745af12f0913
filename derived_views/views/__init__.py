"""The view kinds: the warehouse (a current and a history table per source table), search indexes and
cache entities, their checked plans (composites) and incremental maintenance, BM25 relevance, and the
kinds' names and tables.

What one view does in a sync step, not how steps are driven: runs, status, listing and verification are
in :mod:`derived_views.runs`, above. Above :mod:`derived_views.write`, below :mod:`derived_views.runs`.
"""
