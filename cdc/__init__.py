"""Capture: PostgreSQL's logical replication into the log, and the application around it.

Rooms, lowest first (each package's docstring says what it may import):

* ``cdc.errors``: the root errors every package raises (the only module of ``cdc`` that
  ``cdc.capture`` imports);
* ``cdc.capture``: reading the source's changes and tables into the log, independent of the rest;
* ``cdc.config``: the settings, and what they are turned into (the log, the data directory, the views'
  arguments);
* ``cdc.setup``: what ``cdc setup`` checks and creates on the source;
* ``cdc.observe``: lag, metrics and structured logs;
* ``cdc.run``: capture's run (the loop of ``cdc capture``), the log's compaction beside it and what a
  failed disk or log tells the user;
* ``cdc.commands`` and ``cdc.cli``: the ``cdc`` command line (``cdc.spark_job``: the same for spark-submit).

Importing ``cdc`` does nothing else: ``cdc capture`` sets up Arrow's allocator itself
(:mod:`cdc.capture.arrow_memory`).
"""
