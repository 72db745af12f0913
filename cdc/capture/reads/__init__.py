"""Reads: tables read in chunks beside the stream, and what decides when each chunk is read.

- :mod:`cdc.capture.reads.online_read`: one table's read, chunk by chunk, each chunk its own group.
- :mod:`cdc.capture.reads.held_changes`: the file that holds a read table's own changes until its read ends.
- :mod:`cdc.capture.reads.partial_reads`: reading again only the rows a condition selects (``cdc snapshot --where``).
- :mod:`cdc.capture.reads.read_conditions`: what such a condition may say, checked before it is run.
- :mod:`cdc.capture.reads.snapshot_requests`: ``cdc snapshot`` requests, carried through the WAL.
- :mod:`cdc.capture.reads.read_throttle`: the ceiling on rows per second (``CDC_SNAPSHOT_ROWS_PER_SECOND``).
- :mod:`cdc.capture.reads.scheduler_core`: the scheduler's decisions without I/O (room, turns, renewals,
  giving way to locks, a read's end, how a read stops), time an input.
- :mod:`cdc.capture.reads.scheduler`: the shell that carries those decisions out, and the reads' lifecycle,
  over its layers: the reads' state (:mod:`cdc.capture.reads.reads_under_way`), how a read stops
  (:mod:`cdc.capture.reads.read_stops`), reads across sessions and runs (:mod:`cdc.capture.reads.read_resumes`),
  how a read begins (:mod:`cdc.capture.reads.read_starts`), reads asked for
  (:mod:`cdc.capture.reads.read_requests`); what reads are given and report is
  :mod:`cdc.capture.reads.read_settings`.

The streaming loop (:class:`cdc.run.coordinator.Capture`) has the scheduler read one chunk between two of its
passes; a read never makes it wait.
"""
