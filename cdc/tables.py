"""What capture knows about one source table: its columns, key, converters, topic and schema record."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import orjson

from cdc.row_codec import RowCodec
from cdc.values import Converter, converter_for, type_name


@dataclass(frozen=True, slots=True)
class ColumnShape:
    """One column: name, type (OID, typmod, base type name), whether it is in the record key."""

    name: str
    type_oid: int
    typmod: int
    type_name: str
    key: bool
    nullable: bool


@dataclass(frozen=True)
class TableShape:
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
    ) -> TableShape:
        """Shape from (name, type OID, typmod) triples, the key column names and NOT NULL columns."""
        keys = set(key_names)
        shaped = tuple(
            ColumnShape(name, oid, typmod, type_name(oid, type_names), name in keys, name not in not_null)
            for name, oid, typmod in columns
        )
        converters = tuple(converter_for(oid, type_names) for _, oid, _ in columns)
        return cls(relid, schema, table, topic, shaped, converters)

    @cached_property
    def codec(self) -> RowCodec:
        """The table's compiled row encoders (:mod:`cdc.row_codec`), built on first use."""
        return RowCodec(self.names, [c.type_name for c in self.columns], self.converters, self.key_indexes)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(column.name for column in self.columns)

    @property
    def key_indexes(self) -> tuple[int, ...]:
        return tuple(i for i, column in enumerate(self.columns) if column.key)

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.table}"

    def schema_value(self, lsn: int) -> bytes:
        """The record for the ``<prefix>.__schemas`` topic (docs/event-format.md, "Schema topic")."""
        return orjson.dumps(
            {
                "schema": self.schema,
                "table": self.table,
                "topic": self.topic,
                "columns": [
                    {
                        "name": c.name, "type": c.type_name, "oid": c.type_oid, "typmod": c.typmod,
                        "key": c.key, "nullable": c.nullable,
                    }
                    for c in self.columns
                ],
                "lsn": lsn,
            }
        )

    def fingerprint(self) -> bytes:
        """What makes two schema records equal apart from their LSN (topic and columns)."""
        return fingerprint_of(orjson.loads(self.schema_value(0)))

    def schema_key(self) -> bytes:
        return orjson.dumps(self.qualified)

    def same_schema(self, other: TableShape | None) -> bool:
        """True when ``other`` would write the same schema record (ignoring its LSN)."""
        return other is not None and other.columns == self.columns and other.topic == self.topic


def fingerprint_of(schema_record: dict[str, object]) -> bytes:
    """Fingerprint of a decoded schema-topic value (see :meth:`TableShape.fingerprint`)."""
    return orjson.dumps({"topic": schema_record.get("topic"), "columns": schema_record.get("columns")})
