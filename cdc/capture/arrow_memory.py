"""Arrow's allocator on ordinary pages: set before pyarrow is first loaded.

pyarrow allocates its buffers through the mimalloc it bundles, which by default asks the kernel for
transparent huge pages on its arenas (``madvise(MADV_HUGEPAGE)``). Capture's Arrow buffers live for
one snapshot chunk, and the kernel zeroes a fresh huge page whole (2 MB) the first time it is touched.
On a 1M-row snapshot that zeroing took about 0.2 s of kernel CPU, a fifth of the capture's CPU
(``perf``: ``clear_page`` under ``do_huge_pmd_anonymous_page``, all of it from Arrow allocations). With
ordinary pages the kernel zeroes only what is touched.

mimalloc reads its options once, when ``libarrow`` is loaded, so this must run before anything loads
pyarrow: ``cdc capture`` (and ``cdc demo``, which captures) calls it in :func:`cdc.cli.main` before the
commands' modules are imported; a process that runs capture itself calls it before its first import of
pyarrow. A value already in the environment is kept, and once pyarrow is loaded this changes nothing.
"""

from __future__ import annotations

import os

#: mimalloc's option for transparent huge pages on its arenas (1 by default)
THP_OPTION = "MIMALLOC_ALLOW_THP"


def use_ordinary_pages() -> None:
    """Ask mimalloc for ordinary pages unless the environment already chose."""
    os.environ.setdefault(THP_OPTION, "0")
