"""The view kinds' names and the tables each search index and cache entity has, without Spark.

:mod:`derived_views.views.warehouse`, :mod:`~derived_views.views.search` and :mod:`~derived_views.views.cache`
take their ``NAME`` and ``TABLES`` from here, so that listing the views' tables
(:mod:`derived_views.runs.listing`: ``cdc views``, ``cdc lag`` and its exporter) imports none of them.
"""

from __future__ import annotations

WAREHOUSE = "warehouse"
SEARCH = "search"
CACHE = "cache"

#: a search index's tables below ``search/<index>/``, with what each holds
SEARCH_TABLES = {"documents": "a document per root row", "terms": "term frequencies per document"}
#: a cache entity's tables below ``cache/<entity>/``, with what each holds
CACHE_TABLES = {"entries": "an entry per root row"}
