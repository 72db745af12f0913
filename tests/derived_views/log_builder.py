"""Build a change log by hand, record by record exactly as ``docs/event-format.md`` specifies.

Tests of the views use it before (and beside) the real capture: each :meth:`LogBuilder.transaction`
becomes one append group whose watermark position is the transaction's commit LSN.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from event_format import fold_after
from log_store import LogConfig, LogStore, ProducerRecord
from log_store.partitioner import partition_for_key

BASE_TS_MS = 1_763_700_000_000


def numeric_typmod(precision: int, scale: int) -> int:
    """PostgreSQL's typmod of ``numeric(precision, scale)``."""
    return ((precision << 16) | (scale & 0x7FF)) + 4  # the scale as 11 bits, signed (PostgreSQL 15)


def col(name: str, type_name: str, *, key: bool = False, typmod: int = -1) -> dict[str, Any]:
    """One column entry of a schema record."""
    return {"name": name, "type": type_name, "oid": 0, "typmod": typmod, "key": key, "nullable": not key}


REFERENCE: dict[str, list[dict[str, Any]]] = {
    "public.customers": [
        col("id", "int8", key=True),
        col("email", "text"),
        col("name", "text"),
        col("created_at", "timestamptz"),
    ],
    "public.categories": [col("id", "int4", key=True), col("name", "text")],
    "public.products": [
        col("id", "int8", key=True),
        col("category_id", "int4"),
        col("name", "text"),
        col("description", "text"),
        col("price", "numeric", typmod=numeric_typmod(12, 2)),
        col("attributes", "jsonb"),
        col("tags", "_text"),
        col("updated_at", "timestamptz"),
    ],
    "public.orders": [
        col("id", "uuid", key=True),
        col("customer_id", "int8"),
        col("status", "order_status"),
        col("placed_at", "timestamptz"),
        col("total", "numeric", typmod=numeric_typmod(14, 2)),
    ],
    "public.order_items": [
        col("order_id", "uuid", key=True),
        col("line_no", "int4", key=True),
        col("product_id", "int8"),
        col("quantity", "int4"),
        col("unit_price", "numeric", typmod=numeric_typmod(12, 2)),
    ],
}


def canonical(value: Any) -> bytes:
    """Canonical JSON: sorted keys, compact separators, UTF-8."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


@dataclass
class Transaction:
    """The records of one source transaction, in order."""

    builder: LogBuilder
    lsn: int
    records: list[ProducerRecord] = field(default_factory=list)
    sequence: int = 0

    def _envelope(self, table: str, op: str, before: Any, after: Any) -> bytes:
        schema, name = table.split(".")
        envelope = {
            "before": before,
            "after": after,
            "op": op,
            "source": {
                "connector": "postgresql",
                "name": self.builder.prefix,
                "db": "shop",
                "schema": schema,
                "table": name,
                "lsn": self.lsn,
                "txId": self.lsn // 16,
                "ts_ms": BASE_TS_MS + self.lsn,
                "snapshot": "true" if op == "r" else "false",
                "sequence": self.sequence,
            },
            "ts_ms": BASE_TS_MS + self.lsn + 5,
        }
        self.sequence += 1
        return canonical(envelope)

    def _key(self, table: str, row: Mapping[str, Any]) -> bytes:
        keys = [c["name"] for c in self.builder.columns[table] if c["key"]]
        return canonical({k: row[k] for k in keys})

    def _add(self, table: str, key: bytes | None, value: bytes | None, headers: tuple[tuple[str, bytes], ...] = ()) -> None:
        self.records.append(ProducerRecord(self.builder.topic(table), key, value, BASE_TS_MS + self.lsn, headers))

    def insert(self, table: str, row: Mapping[str, Any], *, op: str = "c") -> None:
        """An insert (``c``), or a snapshot read with ``op="r"``."""
        self._add(table, self._key(table, row), self._envelope(table, op, None, dict(row)))

    def update(self, table: str, row: Mapping[str, Any], *, unchanged: tuple[str, ...] = ()) -> None:
        """An update; ``unchanged`` columns are left out of ``after`` and named in the header."""
        after = {k: v for k, v in row.items() if k not in unchanged}
        headers = (("unchanged", canonical(list(unchanged))),) if unchanged else ()
        self._add(table, self._key(table, row), self._envelope(table, "u", None, after), headers)

    def delete(self, table: str, key_row: Mapping[str, Any]) -> None:
        """A delete (before holds the key columns) followed by its tombstone (with the delete's position)."""
        key = self._key(table, key_row)
        before = json.loads(key)
        position = (("lsn", b"%d" % self.lsn), ("sequence", b"%d" % self.sequence))
        self._add(table, key, self._envelope(table, "d", before, None))
        self._add(table, key, None, position)

    def truncate(self, table: str) -> None:
        """A truncate marker written to every partition of the table's topic.

        The log places records by key, so each marker gets the key ``{"__truncate__":n}`` with the
        smallest ``n`` that lands on its partition (as the capture side does).
        """
        value = self._envelope(table, "t", None, None)
        for partition in range(self.builder.partitions):
            n = 0
            while self.builder.partition_of(b'{"__truncate__":%d}' % n) != partition:
                n += 1
            self._add(table, b'{"__truncate__":%d}' % n, value)

    def raw(self, table: str, key: bytes | None, value: bytes | None) -> None:
        """A record with arbitrary bytes (for poison events)."""
        self._add(table, key, value)


class LogBuilder:
    """Writes schema records and transactions into a log at ``root``."""

    def __init__(
        self, root: Path, prefix: str = "cdc", partitions: int = 2, tables: Mapping[str, list[dict[str, Any]]] = REFERENCE
    ) -> None:
        self.root = root
        self.prefix = prefix
        self.partitions = partitions
        self.columns = {name: list(cols) for name, cols in tables.items()}
        self.lsn = 0x1000
        self.log = LogStore.open(root, LogConfig(fold=fold_after), writer=True)
        self.log.ensure_topic(f"{prefix}.__schemas", 1)
        for name in self.columns:
            self.log.ensure_topic(self.topic(name), partitions)
        self._pending_schemas = list(self.columns)

    def topic(self, table: str) -> str:
        return f"{self.prefix}.{table}"

    def partition_of(self, key: bytes) -> int:
        return partition_for_key(key, self.partitions)

    def alter(self, table: str, columns: list[dict[str, Any]]) -> None:
        """Change a table's column list; the schema record goes before the next transaction's events."""
        self.columns[table] = list(columns)
        self._pending_schemas.append(table)

    def _schema_records(self) -> list[ProducerRecord]:
        out = []
        for table in dict.fromkeys(self._pending_schemas):
            schema, name = table.split(".")
            value = {"schema": schema, "table": name, "topic": self.topic(table), "columns": self.columns[table], "lsn": self.lsn}
            out.append(ProducerRecord(f"{self.prefix}.__schemas", canonical(table), canonical(value), BASE_TS_MS))
        self._pending_schemas = []
        return out

    @contextmanager
    def transaction(self) -> Iterator[Transaction]:
        """Collect one transaction's changes and append them as one group at its commit LSN."""
        self.lsn += 0x100
        tx = Transaction(self, self.lsn)
        yield tx
        self.append(tx)

    def append(self, tx: Transaction) -> None:
        self.log.append_group(self._schema_records() + tx.records, "%016X" % tx.lsn)

    def heartbeat(self) -> None:
        self.lsn += 0x10
        self.log.append_group(self._schema_records(), "%016X" % self.lsn)

    def close(self) -> None:
        self.log.close()


def product(
    pid: int,
    name: str = "Lamp",
    *,
    category: int | None = 1,
    price: str = "19.90",
    description: str | None = "a lamp",
    tags: list[str] | None = None,
) -> dict[str, Any]:
    """A products row in event JSON form."""
    return {
        "id": pid,
        "category_id": category,
        "name": name,
        "description": description,
        "price": price,
        "attributes": '{"color":"red"}',
        "tags": tags if tags is not None else ["home"],
        "updated_at": "2026-11-21T12:45:00.123456Z",
    }
