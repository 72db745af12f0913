"""Capture's run: the loop of ``cdc capture`` that ties :mod:`cdc.capture` to the settings, the source's
checks and the metrics (:mod:`cdc.run.coordinator`), the embedded log's compaction beside it, and what
the user is told when the disk or the log fails (the storage error, the steps to rebuild the log).

May import every room below it (``cdc.errors``, ``cdc.capture``, ``cdc.config``, ``cdc.setup``,
``cdc.observe``); never the command line.
"""
