"""How a source column's name is stored in a Delta table, and back.

**Refused characters.** Delta tables without column mapping refuse column names holding any of
`` ,;{}()`` newline, tab or ``=``. Column mapping would keep such names, but ``deltalake`` (delta-rs) reads
the columns of a column-mapped table as nulls, and every view table must open in
``DeltaTable(path).to_pandas()``. So a name holding one of those characters is stored *percent-encoded*:
each of them, and ``%``, becomes ``%XX`` (its UTF-8 bytes in hex, as in a URL): ``order date`` is stored
as ``order%20date`` and ``a=b (%)`` as ``a%3Db%20%28%25%29`` (:func:`stored_name`, the name's *plain*
form; ``urllib.parse.unquote`` of such a name gives the source name back). Every other name (upper case,
dots, quotes, unicode) is stored as it is, so tables written before keep their layout.

**Case-only twins.** PostgreSQL tells ``duration`` from ``"Duration"``; Spark and Delta compare column
names without case (:func:`folded`), so one table cannot hold both. A name has three forms
(:func:`forms`), tried in order: its plain form; the plain form with every upper-case letter
percent-encoded too (``Duration`` -> ``%44uration``); and with every letter that has a case encoded
(``duration`` -> ``%64%75%72%61%74%69%6F%6E``). Every ``%`` of the second and third forms is encoded, so
``unquote`` of either gives the source name back, and the twins' encoded forms differ from each other and
from the plain one without case. Which twin gets which form (:func:`stored_columns`):

1. A name keeps the form the table already holds it under (its plain form first, then the others): a
   column added later, or a rebuild, never renames a stored column of an existing table.
2. Every other name, those with fewer upper-case letters first (then in code-point order), takes its
   first form that no name before it took and no other column of the table holds, without case. In a
   new table ``duration`` is stored as it is beside ``Duration`` stored as ``%44uration``; a
   ``duration`` added to a table that holds ``Duration`` is stored with every letter encoded.

A name none of whose forms is free (``A`` beside ``a`` and a column literally called ``%41``) is refused
(:class:`~derived_views.errors.ColumnNameClashError`). A table's stored names are read back by the
same claim (:func:`source_columns`): the source names and the table's columns decide them, nothing else.

Spark frames carry source names; names are turned into stored ones where rows are written to a Delta
table, and back where a table is read (:func:`stored`, :func:`from_stored`). View sessions resolve
names with case (``spark.sql.caseSensitive``), so twins in one frame never meet.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import TYPE_CHECKING

from derived_views.errors import ColumnNameClashError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

#: Characters Delta refuses in a column name (without column mapping).
REFUSED = " ,;{}()\n\t="
_ENCODED = {ch: f"%{ord(ch):02X}" for ch in REFUSED + "%"}


def quote(name: str) -> str:
    """A column name as a Spark SQL identifier."""
    return "`" + name.replace("`", "``") + "`"


def stored_name(name: str) -> str:
    """The plain form of ``name``: ``name`` itself unless Delta refuses it (then percent-encoded)."""
    if not any(ch in REFUSED for ch in name):
        return name
    return "".join(_ENCODED.get(ch, ch) for ch in name)


def folded(name: str) -> str:
    """``name`` as Spark and Delta compare column names (without case): two columns of a table never fold alike."""
    return name.lower()


def _percent(char: str) -> str:
    return "".join(f"%{byte:02X}" for byte in char.encode())


def _encoded(name: str, every_cased: bool) -> str:
    """``name`` with its refused characters, ``%`` and upper-case letters (``every_cased``: every letter
    that has a case) percent-encoded."""
    return "".join(
        _percent(ch) if ch in REFUSED or ch == "%" or ch.isupper() or (every_cased and ch.lower() != ch.upper()) else ch
        for ch in name
    )


def forms(name: str) -> tuple[str, str, str]:
    """The names a table may store ``name`` under, in the order they are tried: plain, upper-case
    letters encoded, every cased letter encoded."""
    return stored_name(name), _encoded(name, every_cased=False), _encoded(name, every_cased=True)


def _held(names: list[str], columns: Collection[str]) -> dict[str, str]:
    """``{source name: column}`` for the ``names`` that the table with ``columns`` holds: each name takes
    its first form the table holds and no name took before, plain forms before encoded ones."""
    held: dict[str, str] = {}
    claimed: set[str] = set()
    for level in range(3):
        for name in names:
            form = forms(name)[level]
            if name not in held and form in columns and form not in claimed:
                held[name] = form
                claimed.add(form)
    return held


def _upper_letters(name: str) -> int:
    return sum(ch.isupper() for ch in name)


def stored_columns(names: Iterable[str], existing: Collection[str] = (), table: str = "") -> dict[str, str]:
    """``{source name: stored name}`` of every name, for a table that holds the columns ``existing``
    (stored names; none for a new table): a name the table holds keeps its column, every other name
    takes its first form that no name and no other column of the table folds like (see the module).

    Raises :class:`~derived_views.errors.ColumnNameClashError` when none of a name's forms is free."""
    names = list(dict.fromkeys(names))
    out = _held(names, existing)
    taken = {folded(column): column for column in existing}
    taken.update({folded(column): name for name, column in out.items()})
    for name in sorted((n for n in names if n not in out), key=lambda n: (_upper_letters(n), n)):
        form = next((form for form in forms(name) if folded(form) not in taken), None)
        if form is None:
            raise ColumnNameClashError(table, taken[folded(stored_name(name))], name, stored_name(name))
        out[name] = form
        taken[folded(form)] = name
    return {name: out[name] for name in names}


def stored_names(names: Iterable[str], table: str = "", existing: Collection[str] = ()) -> dict[str, str]:
    """``{source name: stored name}`` of the names that are stored under another name
    (:func:`stored_columns`)."""
    return {name: column for name, column in stored_columns(names, existing, table).items() if column != name}


def source_columns(names: Iterable[str], columns: Collection[str]) -> dict[str, str]:
    """``{source name: column}`` for the ``names`` that a table with ``columns`` (its stored names) holds:
    how a reader finds each source column in a view table."""
    return _held(list(dict.fromkeys(names)), set(columns))


def stored(frame: DataFrame, table: str = "", existing: Collection[str] = ()) -> DataFrame:
    """``frame`` with its columns renamed as a Delta table that holds ``existing`` columns stores them
    (``frame`` itself when no name changes)."""
    from pyspark.sql import functions as F

    renamed = stored_names(frame.columns, table, existing)
    if not renamed:
        return frame
    return frame.select(*[F.col(quote(c)).alias(renamed.get(c, c)) for c in frame.columns])


def from_stored(frame: DataFrame, names: Iterable[str]) -> DataFrame:
    """``frame`` (read from a Delta table) with the columns stored for ``names`` (source names) renamed
    back to them (``frame`` itself when none is stored under another name)."""
    from pyspark.sql import functions as F

    back = {column: name for name, column in source_columns(names, frame.columns).items() if column != name}
    if not back:
        return frame
    return frame.select(*[F.col(quote(c)).alias(back.get(c, c)) for c in frame.columns])
