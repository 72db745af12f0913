"""Delta tables read without Spark (``deltalake``), for the commands that only read a view.

Arrow's dataset scanner keeps read-ahead threads alive after a scan; if they are still alive when the
interpreter exits, Arrow's C++ runtime is torn down under them and the process aborts ("terminate called
without an active exception") after its output was printed. :func:`delta_dataset` therefore drops the
dataset and collects it before the caller goes on, so those threads end while Arrow is still whole.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def delta_dataset(path: str) -> Iterator[Any]:
    """The Delta table at ``path`` as a ``pyarrow.dataset.Dataset``, released when the block ends."""
    from deltalake import DeltaTable

    dataset = DeltaTable(path).to_pyarrow_dataset()
    try:
        yield dataset
    finally:
        del dataset
        gc.collect()
