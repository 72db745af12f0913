"""Topic names (and directory names) for tables named by any text: legal, injective, stable.

A table is named by two texts, its namespace and its own name (a PostgreSQL schema and table: any
characters but NUL, at most 63 bytes each, never empty). Kafka accepts topic names of at most 249
characters from ``[A-Za-z0-9._-]``, other than ``.`` and ``..``. The mapping below gives every table a
topic name Kafka accepts, a different one for every different table, and the same one on every run
and every machine; it is the one docs/event-format.md ("Topic names") specifies.

**Plain names.** A name made only of ASCII letters, digits, ``_`` and ``-`` (:data:`PLAIN`) is plain.

**Escaping** (:func:`escape`): ASCII letters, digits and ``-`` stay; ``_`` becomes ``__``; every other
character becomes ``_`` followed by two lower-case hex digits per byte of its UTF-8 encoding (``.`` is
``_2e``, a space ``_20``, ``"`` ``_22``, ``é`` ``_c3_a9``). After an ``_`` comes either a second ``_`` or
two hex digits, so the escaped text reads back to exactly one name (:func:`unescape`): escaping is
injective, and its output uses only ``[A-Za-z0-9_-]`` (no dot).

**Log name** (:func:`log_name`), the table's name in the log (schema-topic and ledger keys, view paths):
``<schema>.<table>`` when both names are plain, else ``<escape(schema)>..<escape(table)>``. The first
form holds exactly one dot, the second exactly one ``..`` and no other dot, and each part reads back
unambiguously, so two tables never share a log name; plain tables keep the name they always had.

**Fitting the length** (:func:`fit`): a name of at most :data:`KEPT` (231) characters is kept; a longer
one becomes its first 232 characters, ``-`` and the first 16 hex digits of the SHA-256 of the whole
name: exactly :data:`MAX_LENGTH` (249) characters. A kept name is shorter than any shortened one, so the
two never meet; two shortened names meet only if 64 bits of SHA-256 of two different names do.

**Topic name** (:func:`topic_name`): ``fit(<prefix>.<log name>)``; a prefix has no dot, so the log name
is what follows the first dot. **Directory name** (:func:`dir_name`): ``fit(<log name>)``, a single path
component that never starts with a dot, is never ``.`` or ``..`` and holds no ``/``.
"""

from __future__ import annotations

import hashlib
import re

#: Names that need no escaping: ASCII letters, digits, ``_`` and ``-``.
PLAIN = re.compile(r"[A-Za-z0-9_-]+")
#: Kafka's limit on a topic name's length.
MAX_LENGTH = 249
#: Names up to this length are kept whole; longer ones are shortened with a hash (see :func:`fit`).
KEPT = MAX_LENGTH - 18
_HASH_DIGITS = 16
_KEEP = re.compile(r"[A-Za-z0-9-]")
_ESCAPED = re.compile(r"__|_([0-9a-f]{2})|[A-Za-z0-9-]")


def is_plain(name: str) -> bool:
    """Whether ``name`` is used as it is (ASCII letters, digits, ``_`` and ``-`` only)."""
    return PLAIN.fullmatch(name) is not None


def escape(name: str) -> str:
    """``name`` over ``[A-Za-z0-9_-]``, injectively: ``_`` as ``__``, other characters as ``_xx`` per UTF-8 byte."""
    out = []
    for char in name:
        if _KEEP.fullmatch(char):
            out.append(char)
        elif char == "_":
            out.append("__")
        else:
            out.extend(f"_{byte:02x}" for byte in char.encode("utf-8", "surrogatepass"))
    return "".join(out)


def unescape(text: str) -> str:
    """The name :func:`escape` turned into ``text``; ``ValueError`` when no name escapes to it."""
    raw = bytearray()
    position = 0
    while position < len(text):
        match = _ESCAPED.match(text, position)
        if match is None:
            raise ValueError(f"{text!r} is not an escaped name (at character {position})")
        token = match.group(0)
        raw += b"_" if token == "__" else bytes([int(match.group(1), 16)]) if match.group(1) else token.encode()
        position = match.end()
    try:
        name = raw.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        raise ValueError(f"{text!r} is not an escaped name (its bytes are not UTF-8)") from None
    if escape(name) != text:
        raise ValueError(f"{text!r} is not an escaped name (it escapes a character that needs none)")
    return name


def log_name(schema: str, table: str) -> str:
    """The table's name in the log: ``<schema>.<table>`` when both are plain, else ``<escaped>..<escaped>``."""
    if not schema or not table:
        raise ValueError(f"a table needs a non-empty schema and name, not {schema!r} and {table!r}")
    if is_plain(schema) and is_plain(table):
        return f"{schema}.{table}"
    return f"{escape(schema)}..{escape(table)}"


def parse_log_name(name: str) -> tuple[str, str]:
    """``(schema, table)`` of a log name (the inverse of :func:`log_name`); ``ValueError`` for anything else."""
    if ".." in name:
        schema, _, table = name.partition("..")
        parts = (unescape(schema), unescape(table)) if schema and table and "." not in table else None
    else:
        schema, dot, table = name.partition(".")
        parts = (schema, table) if dot and is_plain(schema) and is_plain(table) else None
    if parts is None or log_name(*parts) != name:
        raise ValueError(f"{name!r} is not the log name of a table")
    return parts


def fit(name: str) -> str:
    """``name`` when at most :data:`KEPT` characters, else its first 232, ``-`` and 16 hex digits of its SHA-256."""
    if len(name) <= KEPT:
        return name
    digest = hashlib.sha256(name.encode("utf-8")).hexdigest()[:_HASH_DIGITS]
    return f"{name[: MAX_LENGTH - _HASH_DIGITS - 1]}-{digest}"


def topic_name(prefix: str, schema: str, table: str) -> str:
    """The table's topic: ``fit(<prefix>.<log name>)`` (``prefix``: ASCII letters, digits, ``_`` and ``-``)."""
    if not is_plain(prefix):
        raise ValueError(f"a topic prefix holds only ASCII letters, digits, _ and -, not {prefix!r}")
    return fit(f"{prefix}.{log_name(schema, table)}")


def dir_name(name: str) -> str:
    """The directory of the table whose log name is ``name``: ``fit(name)``, one legal path component."""
    return fit(name)
