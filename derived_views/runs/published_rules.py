"""What a publication publishes of each table: its column list, row filter and masks, as verify reads them.

A view holds only what capture read, and capture reads only what the publication publishes
(PostgreSQL 15 and later: a column list and a row filter per table, honoured by pgoutput and by
capture's snapshots alike). So the source a view is compared with is the publication's rows and columns,
not the whole table: a row outside the filter, or a column outside the list, found in a view is a leak.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from event_format.masks import COMMENT_QUERY, Mask, from_comment

if TYPE_CHECKING:
    import psycopg


@dataclass(frozen=True)
class PublishedRule:
    """One table's rule: the columns its list names (``None``: every column), its row filter (``None``:
    every row) and the columns it does not publish."""

    column_list: tuple[str, ...] | None
    row_filter: str | None
    unpublished: frozenset[str] = frozenset()
    #: The table's masked columns and their masks (:mod:`event_format.masks`): capture wrote them masked,
    #: so the source is compared masked the same way.
    masks: Mapping[str, Mask] = field(default_factory=dict)
    #: The masks' functions, once given the key (:func:`keyed`).
    mask_functions: Mapping[str, Callable[[str], str]] = field(default_factory=dict)

    def publishes(self, column: str) -> bool:
        return self.column_list is None or column in self.column_list


#: ``(schema, table)`` -> its rule (see :func:`published_rules`).
Rules = dict[tuple[str, str], PublishedRule]
#: A table the publication publishes whole (or a server without column lists and row filters).
WHOLE = PublishedRule(None, None)


def published_rules(conn: psycopg.Connection, publication: str) -> Rules:
    """``(schema, table)`` -> its rule, for every table ``publication`` publishes with a column list, a
    row filter or masks (a table absent is published whole, or not at all)."""
    row = conn.execute(COMMENT_QUERY, (publication,)).fetchone()
    masks = {tuple(name.split(".", 1)): columns for name, columns in from_comment(None if row is None else row[0]).items()}
    rules = {(schema, table): PublishedRule(None, None, masks=columns) for (schema, table), columns in masks.items()}
    if conn.info.server_version < 150000:
        return rules
    rows = conn.execute(
        "SELECT p.schemaname, p.tablename, "
        "CASE WHEN EXISTS (SELECT 1 FROM pg_publication_rel pr WHERE pr.prpubid = pub.oid "
        "AND pr.prrelid = c.oid AND pr.prattrs IS NOT NULL) THEN p.attnames END, p.rowfilter, "
        "(SELECT array_agg(a.attname::text) FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attnum > 0 "
        "AND NOT a.attisdropped) "
        "FROM pg_publication_tables p JOIN pg_publication pub ON pub.pubname = p.pubname "
        "JOIN pg_namespace n ON n.nspname = p.schemaname "
        "JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = p.tablename WHERE p.pubname = %s",
        (publication,),
    ).fetchall()
    for schema, table, column_list, row_filter, columns in rows:
        if column_list is None and row_filter is None:
            continue
        listed = tuple(str(name) for name in column_list) if column_list is not None else None
        unpublished = frozenset(str(c) for c in columns or () if listed is not None and c not in listed)
        name = (str(schema), str(table))
        rules[name] = PublishedRule(listed, row_filter, unpublished, masks.get(name, {}))
    return rules


def keyed(rules: Rules, mask_key: bytes | None) -> Rules:
    """``rules`` with their masks' functions (a hash mask needs ``mask_key``, ``CDC_MASK_KEY``: raises
    :class:`~event_format.masks.MaskError` without it)."""
    return {
        name: dataclasses.replace(rule, mask_functions={c: mask.function(mask_key) for c, mask in rule.masks.items()})
        for name, rule in rules.items()
    }
