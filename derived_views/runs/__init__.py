"""How the views are run: sync steps, continuous mode and rebuild (:mod:`~derived_views.runs.runner`),
the Spark session a command runs on, upkeep between steps, Spark Declarative Pipelines runs, what every
view table is as of (status, listing, reads as of one LSN), verification against the source, and purge.

The top layer: it drives the view kinds of :mod:`derived_views.views` and uses every layer below.
Applications reach it through :mod:`derived_views` itself.
"""
