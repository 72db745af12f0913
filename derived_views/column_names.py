"""How a source column's name is stored in a Delta table, and back.

Delta tables without column mapping refuse column names holding any of `` ,;{}()`` newline, tab or
``=``. Column mapping would keep such names, but ``deltalake`` (delta-rs) reads the columns of a
column-mapped table as nulls, and every view table must open in ``DeltaTable(path).to_pandas()``. So a
name holding one of those characters is stored *percent-encoded*: each of them, and ``%``, becomes
``%XX`` (its UTF-8 byte in hex, as in a URL): ``order date`` is stored as ``order%20date`` and
``a=b (%)`` as ``a%3Db%20%28%25%29`` (``urllib.parse.unquote`` of such a name gives the source name
back). Every other
name (upper case, dots, quotes, unicode) is stored as it is, so tables written before keep their layout.

Spark frames carry source names; names are turned into stored ones where rows are written to a Delta
table, and back where a table is read (:func:`stored`, :func:`from_stored`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from derived_views.errors import ColumnNameClashError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

#: Characters Delta refuses in a column name (without column mapping).
REFUSED = " ,;{}()\n\t="
_ENCODED = {ch: f"%{ord(ch):02X}" for ch in REFUSED + "%"}


def stored_name(name: str) -> str:
    """The column name a Delta table holds ``name`` under (``name`` itself unless Delta refuses it)."""
    if not any(ch in REFUSED for ch in name):
        return name
    return "".join(_ENCODED.get(ch, ch) for ch in name)


def stored_names(names: Iterable[str], table: str = "") -> dict[str, str]:
    """``{source name: stored name}`` of the names that are stored under another name.

    Raises :class:`~derived_views.errors.ColumnNameClashError` when two names would be stored alike
    (a name such as ``a%20b`` beside ``a b``: no table can hold both)."""
    names = list(names)
    renamed = {name: stored_name(name) for name in names if stored_name(name) != name}
    taken = {name: name for name in names if name not in renamed}
    for name, stored in renamed.items():
        if stored in taken:
            raise ColumnNameClashError(table, taken[stored], name, stored)
        taken[stored] = name
    return renamed


def stored(frame: DataFrame, table: str = "") -> DataFrame:
    """``frame`` with its columns renamed as a Delta table stores them (``frame`` itself when no name changes)."""
    from pyspark.sql import functions as F

    from derived_views.schema import quote

    renamed = stored_names(frame.columns, table)
    if not renamed:
        return frame
    return frame.select(*[F.col(quote(c)).alias(renamed.get(c, c)) for c in frame.columns])


def from_stored(frame: DataFrame, names: Iterable[str]) -> DataFrame:
    """``frame`` (read from a Delta table) with the columns stored for ``names`` (source names) renamed
    back to them (``frame`` itself when none is stored under another name)."""
    from pyspark.sql import functions as F

    from derived_views.schema import quote

    back = {stored_name(name): name for name in names if stored_name(name) != name}
    if not back.keys() & set(frame.columns):
        return frame
    return frame.select(*[F.col(quote(c)).alias(back.get(c, c)) for c in frame.columns])
