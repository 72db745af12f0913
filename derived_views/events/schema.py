"""Source table schemas from the ``<prefix>.__schemas`` topic and their faithful Spark types.

Each schema record lists a table's columns (``name``, ``type`` as ``pg_type.typname``, ``typmod``,
``key``, ``nullable``). :func:`spark_type` maps one column to a Spark SQL type so that the JSON values
the capture side writes (see ``docs/event-format.md``) parse without loss:

========================================  ===========================================================
source type                               Spark type
========================================  ===========================================================
int2 / int4 / int8, oid                   smallint / int / bigint, bigint
float4 / float8                           float / double (``"NaN"``, ``"Infinity"`` parse as such)
numeric(p, s), p <= 38                    decimal(p, s) (``NaN`` makes it string: see below; a
                                          negative scale or one above p: the decimal holding it)
numeric without typmod, or p > 38         string (the exact decimal text; no Spark type holds it)
bool                                      boolean
text, varchar, bpchar, name, citext       string
uuid, json, jsonb, enum, time, interval   string (uuid text, the JSON document, the label, text form)
bytea                                     binary (the log carries base64)
date                                      date
timestamp / timestamptz                   timestamp_ntz / timestamp (UTC instant)
``_elem`` (arrays)                        array<element type>
anything else                             string (the server's text form)
========================================  ===========================================================

A column that changed type, that holds a multi-dimensional array, or that holds a value its Spark type
cannot (``infinity``, a BC date or a year past 9999 in a date or timestamp, ``NaN`` in a decimal), is
stored in a type that holds every value it has had: its values' text (:mod:`derived_views.events.column_types`,
:meth:`TableSchema.view_columns`).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from derived_views.events.column_names import quote, source_columns, stored_columns
from derived_views.events.column_types import widest
from log_store.topic_names import log_name

#: Identifiers SQL reads as written without quotes (keywords aside, which quoting never harms).
_BARE = re.compile(r"[a-z_][a-z0-9_$]*")

_SIMPLE: dict[str, str] = {
    "int2": "smallint",
    "int4": "int",
    "int8": "bigint",
    "oid": "bigint",
    "float4": "float",
    "float8": "double",
    "bool": "boolean",
    "bytea": "binary",
    "date": "date",
    "timestamp": "timestamp_ntz",
    "timestamptz": "timestamp",
}

#: Spark's decimal holds at most this many digits.
MAX_DECIMAL_PRECISION = 38


def numeric_precision_scale(typmod: int) -> tuple[int, int] | None:
    """``(precision, scale)`` of a ``numeric`` typmod, or ``None`` for an unconstrained numeric.

    The scale is the low 11 bits, signed: since PostgreSQL 15 it may be negative (``numeric(5, -2)``
    rounds to hundreds) or larger than the precision (``numeric(3, 5)`` holds ``0.00999``)."""
    if typmod < 4:
        return None
    packed = typmod - 4
    return (packed >> 16) & 0xFFFF, ((packed & 0x7FF) ^ 0x400) - 0x400


def _decimal_type(precision: int, scale: int) -> str:
    """The Spark decimal holding every value of ``numeric(precision, scale)``, or ``string`` when none
    does: a negative scale adds integer digits (``numeric(5, -2)``: ``decimal(7,0)``), a scale above
    the precision adds leading fraction zeros (``numeric(3, 5)``: ``decimal(5,5)``); Spark's scale lies
    within ``0..precision`` and its precision within ``1..38``."""
    if scale < 0:
        precision, scale = precision - scale, 0
    precision = max(precision, scale)
    return f"decimal({precision},{scale})" if precision <= MAX_DECIMAL_PRECISION else "string"


def spark_type(type_name: str, typmod: int = -1) -> str:
    """Spark SQL type (DDL form) that holds every value of the source type exactly."""
    if type_name.startswith("_"):
        return f"array<{spark_type(type_name[1:], typmod)}>"
    if type_name == "numeric":
        precision_scale = numeric_precision_scale(typmod)
        return "string" if precision_scale is None else _decimal_type(*precision_scale)
    return _SIMPLE.get(type_name, "string")


@dataclass(frozen=True)
class ColumnFill:
    """The value (its JSON text, as events encode the column) that every row whose last event is before
    ``(lsn, sequence)`` holds in an added column: ``filled`` in the schema record
    (:mod:`derived_views.write.stored_defaults`)."""

    value: bytes
    lsn: int
    sequence: int


@dataclass(frozen=True)
class Column:
    """One source column as the schema topic describes it."""

    name: str
    type_name: str
    typmod: int = -1
    key: bool = False
    nullable: bool = True
    attnum: int = 0
    """The source's attribute number (0: not recorded): kept by a rename, new after a drop and re-add."""
    filled: ColumnFill | None = field(default=None, compare=False)
    """The value the rows older than the column hold (added with a constant default), if the record says."""

    @property
    def spark_type(self) -> str:
        """The column's Spark SQL type."""
        return spark_type(self.type_name, self.typmod)

    def same_column(self, other: Column) -> bool:
        """Whether ``other`` (of another schema version) is this source column, under any name."""
        if self.attnum and other.attnum:
            return self.attnum == other.attnum
        return self.name == other.name


@dataclass(frozen=True)
class SchemaVersion:
    """The columns a table's events were written with from ``(lsn, sequence)`` on (until the next version)."""

    lsn: int
    columns: tuple[Column, ...]
    sequence: int = 0


@dataclass(frozen=True)
class TableSchema:
    """A source table's latest column list, from its schema record, with the earlier versions it names.

    ``versions`` are the column types in force before ``lsn`` (oldest first), as the record carries
    them when a column changed type or was dropped (docs/event-format.md, "Schema topic").
    """

    schema: str
    table: str
    topic: str
    columns: tuple[Column, ...]
    lsn: int = 0
    versions: tuple[SchemaVersion, ...] = ()
    sequence: int = 0

    def _versions(self) -> tuple[SchemaVersion, ...]:
        """Every version, oldest first, the current columns last."""
        return (*self.versions, SchemaVersion(self.lsn, self.columns, self.sequence))

    def _history(self, column: Column) -> list[tuple[int, Column | None]]:
        """``(from LSN, the column as that version had it, or None)`` for every version, oldest first."""
        return [(version.lsn, next((c for c in version.columns if column.same_column(c)), None)) for version in self._versions()]

    def view_columns(self, existing: Mapping[str, str] | None = None, text: Collection[str] = ()) -> list[tuple[str, str]]:
        """``(name, Spark type)`` of every current column as a view stores it.

        The type holds every value the column has had (:func:`~derived_views.events.column_types.widest` over
        its type in each version and, for a table that exists, its type there: ``existing``, also under
        a name the column had before a rename; ``existing`` is keyed by the table's stored names,
        :mod:`derived_views.events.column_names`); a name in ``text`` is stored as its JSON text (``string``).
        Names are the source's.
        """
        renamed = {new: old for old, new in self.renames(existing or {}).items()}
        held = source_columns([renamed.get(c.name, c.name) for c in self.columns], existing or {})
        out = []
        for column in self.columns:
            types = [c.spark_type for _, c in self._history(column) if c is not None]
            previous = held.get(renamed.get(column.name, column.name))
            if existing is not None and previous is not None:
                types.append(existing[previous])
            out.append((column.name, "string" if column.name in text else widest(types)))
        return out

    def parse_plan(self, columns: list[tuple[str, str]]) -> list[tuple[tuple[int, int], list[tuple[str, str]]]]:
        """How events are parsed into ``columns`` (view types): ``((from LSN, from sequence), (JSON name,
        type) per column)`` in position order.

        An event is parsed with the names and types of the version in force at its position (the last
        entry at or before its ``(lsn, sequence)``; the first entry also covers anything older), then cast to
        ``columns``: a renamed column is read under the name its events carried, a column that did not
        exist yet (or was another column of the same name, dropped since) reads as null. A ``string``
        view column is parsed as a string in every version, which keeps each value's JSON text.
        Versions that parse alike are one entry, so a table whose columns never changed has one.
        """
        by_name = {c.name: c for c in self.columns}
        histories = {name: self._history(by_name[name]) for name, _ in columns if name in by_name}
        plan: list[tuple[tuple[int, int], list[tuple[str, str]]]] = []
        for number, version in enumerate(self._versions()):
            parse = []
            for index, (name, view) in enumerate(columns):
                was = histories[name][number][1] if name in histories else None
                json_name = was.name if was is not None else f"__cdc absent {index}__"
                parse.append((json_name, view if view == "string" or was is None else was.spark_type))
            if not plan or plan[-1][1] != parse:
                plan.append(((version.lsn, version.sequence), parse))
        return plan

    def renames(self, existing: Collection[str]) -> dict[str, str]:
        """``{name before: current name}`` (source names) for columns renamed in the source since
        ``existing`` (a table's stored column names) was written: the table's column is renamed with them."""
        current = source_columns(self.names, existing)
        others = set(existing) - set(current.values())
        out = {}
        for column in self.columns:
            if column.name in current:
                continue
            for _, was in reversed(self._history(column)):
                if was is not None and was.name != column.name and source_columns([was.name], others) and was.name not in out:
                    out[was.name] = column.name
                    break
        return out

    def stored_columns(self, existing: Collection[str] = ()) -> dict[str, str]:
        """``{source name: stored name}`` of every current column in a table that holds ``existing``
        (its stored names; none for a new table): :func:`derived_views.events.column_names.stored_columns`."""
        return stored_columns(self.names, existing, self.qualified)

    def stored_renames(self, existing: Collection[str]) -> dict[str, str]:
        """``{column: new column}`` (stored names) that bring a table holding ``existing`` to the source's
        renames (:meth:`renames`): each renamed column's new stored name is chosen among the columns the
        table keeps."""
        renames = self.renames(existing)
        current = source_columns(self.names, existing)
        olds = source_columns(list(renames), set(existing) - set(current.values()))
        kept = [column for column in existing if column not in olds.values()]
        new = stored_columns(self.names, kept, self.qualified)
        return {olds[old]: new[name] for old, name in renames.items()}

    @property
    def dotted_name(self) -> str:
        """``schema.table`` as the names are spelled, unquoted: how the views file names the table."""
        return f"{self.schema}.{self.table}"

    @property
    def qualified(self) -> str:
        """``schema.table`` as SQL writes it (a name quoted when it needs quotes), for messages and queries."""
        return f"{sql_identifier(self.schema)}.{sql_identifier(self.table)}"

    @property
    def log_name(self) -> str:
        """The table's name in the log and in view paths, one per table (:func:`log_store.topic_names.log_name`)."""
        return log_name(self.schema, self.table)

    @property
    def key_columns(self) -> tuple[Column, ...]:
        """Primary-key (or replica-identity) columns; empty for a keyless table."""
        return tuple(column for column in self.columns if column.key)

    @property
    def names(self) -> list[str]:
        """Column names in source order."""
        return [column.name for column in self.columns]

    def ddl(self, columns: tuple[Column, ...] | None = None) -> str:
        """Spark DDL struct body ``a bigint, b string`` for ``columns`` (default: all)."""
        return ", ".join(f"{quote(c.name)} {c.spark_type}" for c in (columns or self.columns))

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> TableSchema:
        """Parse one schema-topic value (a decoded JSON object)."""
        columns = tuple(
            Column(
                name=str(column["name"]),
                type_name=str(column["type"]),
                typmod=int(column.get("typmod", -1)),
                key=bool(column.get("key", False)),
                nullable=bool(column.get("nullable", True)),
                attnum=int(column.get("attnum", 0)),
                filled=_fill(column.get("filled")),
            )
            for column in record["columns"]
        )
        versions = tuple(
            SchemaVersion(
                int(version.get("lsn", 0)),
                tuple(
                    Column(
                        name=str(c["name"]),
                        type_name=str(c["type"]),
                        typmod=int(c.get("typmod", -1)),
                        attnum=int(c.get("attnum", 0)),
                    )
                    for c in version["columns"]
                ),
                int(version.get("sequence", 0)),
            )
            for version in record.get("versions", [])
        )
        return cls(
            schema=str(record["schema"]),
            table=str(record["table"]),
            topic=str(record["topic"]),
            columns=columns,
            lsn=int(record.get("lsn", 0)),
            versions=versions,
            sequence=int(record.get("sequence", 0)),
        )


def _fill(filled: Any) -> ColumnFill | None:
    """A column's ``filled`` entry of a schema record (``None`` when it has none)."""
    if not isinstance(filled, dict):
        return None
    return ColumnFill(orjson.dumps(filled.get("value")), int(filled["lsn"]), int(filled.get("sequence", 0)))


def sql_string(text: str) -> str:
    """``text`` as a Spark SQL string literal (backslashes and quotes escaped)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def sql_identifier(name: str) -> str:
    """``name`` as an SQL identifier: as it is when lower-case letters, digits, ``_`` and ``$``, else quoted."""
    return name if _BARE.fullmatch(name) else '"' + name.replace('"', '""') + '"'


def schemas_topic(prefix: str) -> str:
    """Name of the schema topic for a topic prefix."""
    return f"{prefix}.__schemas"
