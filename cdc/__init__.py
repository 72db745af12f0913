"""Capture: PostgreSQL's logical replication into the log (see the README and ``cdc.coordinator``)."""

from cdc.capture.arrow_memory import use_ordinary_pages

use_ordinary_pages()
