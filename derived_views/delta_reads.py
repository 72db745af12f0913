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

from derived_views.errors import ViewError


@contextmanager
def delta_dataset(path: str) -> Iterator[Any]:
    """The Delta table at ``path`` as a ``pyarrow.dataset.Dataset``, released when the block ends."""
    from deltalake import DeltaTable
    from deltalake.exceptions import DeltaProtocolError

    try:
        dataset = DeltaTable(path).to_pyarrow_dataset()
    except DeltaProtocolError as exc:
        view = path.rstrip("/").rsplit("/", 2)[-2]
        raise ViewError(
            f"the Delta table {path} uses a feature deltalake cannot read ({str(exc).splitlines()[0]}); it was "
            f"created by an earlier version: stop the view's syncs, remove its directory and run `cdc rebuild {view}`"
        ) from None
    try:
        yield dataset
    finally:
        del dataset
        gc.collect()
