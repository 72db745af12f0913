"""Spark and Delta, the machinery under every view: sessions (local, cluster or Spark Connect), the jars
they need, the driver JVM's tuning and output, Delta operations written as SQL, a view table's position
in the log as a plain value (:mod:`~derived_views.engine.progress`) and the Delta commits that carry it.

The bottom layer of :mod:`derived_views`: it imports nothing of the package but
:mod:`derived_views.errors`, and knows nothing of reading the log, change events or views (a position in
the log is plain offsets and an LSN to it).
"""
