"""Delta tables read without Spark (``deltalake``), for the commands that only read a view.

Queries run in deltalake's own engine (:class:`deltalake.QueryBuilder`, Rust) and come back as Arrow
tables. Arrow's C++ dataset scanner is not used: its read-ahead threads can still be alive when the
interpreter exits, and the process then aborts ("terminate called without an active exception") after
its output was printed.
"""

from __future__ import annotations

from typing import Any

from derived_views.errors import ViewError


def sql_text(value: str) -> str:
    """``value`` as an SQL string literal."""
    return "'" + value.replace("'", "''") + "'"


def read_query(path: str, sql: str, version: int | None = None) -> Any:
    """The rows of ``sql`` over the Delta table at ``path`` (named ``t`` in it; at ``version``, default its
    newest), as a ``pyarrow.Table``."""
    return stream_query(path, sql, open_table(path, version)).read_all()


def stream_query(path: str, sql: str, table: Any = None) -> Any:
    """The rows of ``sql`` over the Delta table at ``path`` (named ``t`` in it; ``table``: that table as
    :func:`open_table` opened it), as a ``pyarrow.RecordBatchReader``: batch by batch, as the engine
    produces them."""
    import pyarrow as pa
    from deltalake import QueryBuilder

    table = open_table(path) if table is None else table
    return pa.RecordBatchReader.from_stream(QueryBuilder().register("t", table).execute(sql))


def open_table(path: str, version: int | None = None) -> Any:
    """The Delta table at ``path`` (at ``version``, default its newest) as a ``deltalake.DeltaTable``; one
    clear error for a table that uses a feature ``deltalake`` cannot read."""
    from deltalake import DeltaTable
    from deltalake.exceptions import DeltaProtocolError

    try:
        return DeltaTable(path, version=version)
    except DeltaProtocolError as exc:
        view = path.rstrip("/").rsplit("/", 2)[-2]
        raise ViewError(
            f"the Delta table {path} uses a feature deltalake cannot read ({str(exc).splitlines()[0]}); it was "
            f"created by an earlier version: stop the view's syncs, remove its directory and run `cdc rebuild {view}`"
        ) from None
