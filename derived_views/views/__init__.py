"""The views and their runs: the warehouse, search indexes and cache entities, their checked plans and
incremental maintenance, sync steps, continuous mode and rebuild, the Spark session a command runs on,
what every view is as of, listing and verification against the source.

The top layer: it uses every layer below. Applications reach it through :mod:`derived_views` itself.
"""
