"""Capture: PostgreSQL's logical replication into the log, exactly once.

The replication protocol (:mod:`cdc.capture.transport`), pgoutput decoding (:mod:`cdc.capture.pgoutput`),
whole transactions (:mod:`cdc.capture.streaming`, replayed into records by :mod:`cdc.capture.change_replayer`),
change events (:mod:`cdc.capture.events`), snapshots (:mod:`cdc.capture.snapshot_writer`,
:mod:`cdc.capture.initial_snapshot`, :mod:`cdc.capture.table_snapshots`) the streaming decisions
(:mod:`cdc.capture.stream_core`) and the tables read beside the stream (:mod:`cdc.capture.reads`). It imports
nothing of the application around it (``cdc/``: the CLI, settings, the run that ties capture to them,
:mod:`cdc.run.coordinator`);
the log reaches it as a :class:`~log_store.log.Log`.
"""
