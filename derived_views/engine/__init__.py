"""Spark and Delta, the machinery under every view: sessions (local, cluster or Spark Connect), the jars
they need, the driver JVM's tuning and output, Delta operations written as SQL, and the progress each
Delta commit carries.

The bottom layer of :mod:`derived_views`: it imports nothing of the package but
:mod:`derived_views.errors`, and knows nothing of the log, change events or views.
"""
