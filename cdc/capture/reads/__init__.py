"""Reads: tables read in chunks beside the stream, and what decides when each chunk is read.

- :mod:`cdc.capture.reads.online_read`: one table's read, chunk by chunk, each chunk its own group.
- :mod:`cdc.capture.reads.held_changes`: the file that holds a read table's own changes until its read ends.
- :mod:`cdc.capture.reads.partial_reads`: reading again only the rows a condition selects (``cdc snapshot --where``).
- :mod:`cdc.capture.reads.read_conditions`: what such a condition may say, checked before it is run.
- :mod:`cdc.capture.reads.snapshot_requests`: ``cdc snapshot`` requests, carried through the WAL.
- :mod:`cdc.capture.reads.read_throttle`: the ceiling on rows per second (``CDC_SNAPSHOT_ROWS_PER_SECOND``).

The streaming loop (:class:`cdc.coordinator.Capture`) reads one chunk between two of its passes; a
read never makes it wait.
"""
