"""Arrow's allocator on ordinary pages in a benchmark's process, as ``cdc capture`` sets it up
(:mod:`cdc.capture.arrow_memory`): :mod:`bench.capture_common` imports this before anything loads
pyarrow, so that capture run in a benchmark's process measures what the command does."""

from cdc.capture.arrow_memory import use_ordinary_pages

use_ordinary_pages()
