"""What capture knows about one source table: its columns, key, converters, topic and schema record."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property

import orjson

from cdc.capture.row_codec import RowCodec
from cdc.capture.values import Converter, converter_for, type_name
from log_store.topic_names import log_name


class NamedTable:
    """A source table's two names (``schema`` and ``table`` of the class it is mixed into) as capture writes them."""

    __slots__ = ()
    schema: str
    table: str

    @property
    def qualified(self) -> str:
        """``schema.table`` as written in messages (ambiguous when a name holds a dot: never a key)."""
        return f"{self.schema}.{self.table}"

    @property
    def log_name(self) -> str:
        """The table's key in the schema topic and the ledger, one per table (:func:`log_store.topic_names.log_name`)."""
        return log_name(self.schema, self.table)


@dataclass(frozen=True, slots=True)
class ColumnShape:
    """One column: name, type (OID, typmod, base type name), whether it is in the record key, and its
    attribute number (0 when unknown), which tells a renamed column from a dropped and re-added one."""

    name: str
    type_oid: int
    typmod: int
    type_name: str
    key: bool
    nullable: bool
    attnum: int = 0
    #: The column's mask (:attr:`event_format.masks.Mask.spec`; empty: written clear). A masked column
    #: is read by its own type but written, and described in schema records, as text.
    mask: str = ""

    @property
    def logged_type(self) -> tuple[str, int, int]:
        """``(type name, type OID, typmod)`` as schema records describe the column's written values."""
        return ("text", 25, -1) if self.mask else (self.type_name, self.type_oid, self.typmod)


@dataclass(frozen=True)
class TableShape(NamedTable):
    """A table's current shape. Replaced (never mutated) when a Relation message changes it.

    ``key`` columns are the primary key, else the replica identity index; none means records have a
    null key (inserts only, updates and deletes need a replica identity on the source).
    """

    relid: int
    schema: str
    table: str
    topic: str
    columns: tuple[ColumnShape, ...]
    converters: tuple[Converter, ...] = field(repr=False, compare=False, default=())
    #: The converters of the columns' own types when a mask replaced some (empty: ``converters``).
    clear_converters: tuple[Converter, ...] = field(repr=False, compare=False, default=())

    @classmethod
    def build(
        cls,
        relid: int,
        schema: str,
        table: str,
        topic: str,
        columns: list[tuple[str, int, int]],
        key_names: list[str],
        *,
        not_null: frozenset[str] = frozenset(),
        type_names: dict[int, str] | None = None,
        attnums: tuple[tuple[str, int], ...] = (),
        masks: Mapping[str, tuple[str, Callable[[str], str]]] | None = None,
    ) -> TableShape:
        """Shape from (name, type OID, typmod) triples, the key column names, NOT NULL columns and
        attribute numbers; ``masks``: per masked column its mask's spec and function
        (:mod:`event_format.masks`), which replaces the column's converter."""
        keys = set(key_names)
        numbers = dict(attnums)
        shaped = tuple(
            ColumnShape(name, oid, typmod, type_name(oid, type_names), name in keys, name not in not_null, numbers.get(name, 0))
            for name, oid, typmod in columns
        )
        converters = tuple(converter_for(oid, type_names) for _, oid, _ in columns)
        return cls(relid, schema, table, topic, shaped, converters).with_masks(masks or {})

    def with_masks(self, masks: Mapping[str, tuple[str, Callable[[str], str]]]) -> TableShape:
        """The shape with ``masks`` (column -> spec and function) in place of the masks it has; itself
        when they are the same. A key column is never masked (setup refuses it; here it stays clear)."""
        specs = {name: spec for name, (spec, _) in masks.items()}
        if all(column.mask == specs.get(column.name, "") or column.key for column in self.columns):
            return self
        clear = self.clear_converters or self.converters
        columns = tuple(replace(c, mask="" if c.key else specs.get(c.name, "")) for c in self.columns)
        converters = tuple(masks[c.name][1] if c.mask else own for c, own in zip(columns, clear, strict=True))
        return TableShape(self.relid, self.schema, self.table, self.topic, columns, converters, clear)

    @cached_property
    def codec(self) -> RowCodec:
        """The table's compiled row encoders (:mod:`cdc.capture.row_codec`), built on first use."""
        return RowCodec(self.names, [c.type_name for c in self.columns], self.converters, self.key_indexes)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(column.name for column in self.columns)

    @property
    def key_indexes(self) -> tuple[int, ...]:
        return tuple(i for i, column in enumerate(self.columns) if column.key)

    def schema_value(
        self, lsn: int, previous: bytes | None = None, sequence: int = 0, filled: Mapping[str, object] | None = None
    ) -> bytes:
        """The record for the ``<prefix>.__schemas`` topic (docs/event-format.md, "Schema topic").

        The record holds from ``(lsn, sequence)``: the first event written with it (a shape that changes
        inside a transaction holds from that transaction's next event). ``previous`` is the table's
        record this one follows, if any: its ``versions`` are carried on, and it becomes a version itself
        when one of its columns is gone, renamed or holds another type now, or when it already follows
        versions (else the events between it and this record would read as the version before it).
        The latest record alone (all compaction keeps) thus tells a consumer the columns every earlier
        event of the table was written with.

        ``filled``: column name -> the value the rows predating that column hold, for columns added with a
        stored default (:mod:`cdc.capture.added_column_fills`); each gets ``"filled": {"value", "lsn",
        "sequence"}`` as of this record's position. A column keeps the ``filled`` its entry had in
        ``previous`` (same attribute number), so the latest record carries every such fact.
        """
        earlier = orjson.loads(previous) if previous is not None else {}
        kept = {
            int(c["attnum"]): (c["filled"], c.get("mask", ""))
            for c in earlier.get("columns", [])
            if "filled" in c and c.get("attnum")
        }
        record: dict[str, object] = {
            "schema": self.schema,
            "table": self.table,
            "topic": self.topic,
            "columns": [
                {
                    "name": c.name,
                    "type": c.logged_type[0],
                    "oid": c.logged_type[1],
                    "typmod": c.logged_type[2],
                    "key": c.key,
                    "nullable": c.nullable,
                    "attnum": c.attnum,
                    **({"mask": c.mask.partition(":")[0]} if c.mask else {}),
                    **_filled(c, filled, kept, lsn, sequence),
                }
                for c in self.columns
            ],
            "lsn": lsn,
            "sequence": sequence,
        }
        versions = earlier_versions(earlier, self.columns) if previous is not None else []
        if versions:
            record["versions"] = versions
        return orjson.dumps(record)

    def fingerprint(self) -> bytes:
        """What makes two schema records equal apart from their LSN (topic and columns)."""
        return fingerprint_of(orjson.loads(self.schema_value(0)))

    def schema_key(self) -> bytes:
        return orjson.dumps(self.log_name)


def _filled(
    column: ColumnShape, filled: Mapping[str, object] | None, kept: dict[int, tuple[object, str]], lsn: int, sequence: int
) -> dict[str, object]:
    """The ``filled`` entry of ``column`` in a schema record: a new one from ``filled``, else the one kept
    under the same mask (a value written clear or under another mask is not written again: the changed
    mask reads the table again, whose rows then hold every value)."""
    if filled is not None and column.name in filled:
        return {"filled": {"value": filled[column.name], "lsn": lsn, "sequence": sequence}}
    if column.attnum and column.attnum in kept and kept[column.attnum][1] == column.mask.partition(":")[0]:
        return {"filled": kept[column.attnum][0]}
    return {}


def _types(columns: list[dict[str, object]]) -> list[dict[str, object]]:
    return [{"name": c["name"], "type": c["type"], "typmod": c.get("typmod", -1), "attnum": c.get("attnum", 0)} for c in columns]


def earlier_versions(previous: dict[str, object], columns: tuple[ColumnShape, ...]) -> list[dict[str, object]]:
    """The ``versions`` of a table's next schema record, given its ``previous`` record.

    A version is ``{"lsn": L, "sequence": S, "columns": [{"name", "type", "typmod", "attnum"}, ...]}``:
    the columns of the events from ``(L, S)`` on, until the next version (or the record itself). The
    first version is made when a column changed type, was renamed or was dropped (added columns change
    no earlier event's types); from then on every record becomes one, so the versions leave no gap.
    """
    carried = list(previous.get("versions", []))  # type: ignore[call-overload]
    now = {(c.name, c.logged_type[0], c.logged_type[2], c.attnum) for c in columns}
    before = _types(previous.get("columns", []))  # type: ignore[arg-type]
    if carried or any((c["name"], c["type"], c["typmod"], c["attnum"]) not in now for c in before):
        carried.append({"lsn": previous.get("lsn", 0), "sequence": previous.get("sequence", 0), "columns": before})
    return carried


def fingerprint_of(schema_record: dict[str, object]) -> bytes:
    """Fingerprint of a decoded schema-topic value (see :meth:`TableShape.fingerprint`): its columns
    without the values older rows hold (``filled``), which describe the rows, not the columns."""
    columns = [
        {k: v for k, v in c.items() if k != "filled"} if isinstance(c, dict) else c
        for c in schema_record.get("columns") or []  # type: ignore[attr-defined]
    ]
    return orjson.dumps({"topic": schema_record.get("topic"), "columns": columns})
