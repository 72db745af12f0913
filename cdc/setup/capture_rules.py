"""Declared capture rules (the views file's ``[capture."<schema>.<table>"]``) made the publication's own.

A rule names the columns capture reads of a table (``columns``, or every column but those it excludes,
``exclude``) and the rows (``where``, a SQL boolean). ``cdc setup`` writes them into the publication as
column lists and row filters (PostgreSQL 15 and later), so that the server sends nothing else and every
read of the table (snapshot, re-read, stream, verify) honours them the same way
(:mod:`cdc.capture.catalog`). A rule changed later is applied by the next ``cdc setup``; capture
notices the publication's new rule and reads the table again.

Each rule is checked before anything is created or altered, one error line each: a table that does
not exist or that capture does not publish, a column it does not have, and whatever PostgreSQL refuses
of the rule (a filter that does not parse or uses what a filter may not), found by creating the
publication of that table alone in a transaction that is rolled back; in that transaction
:func:`cdc.setup.publication_rule_checks.rule_problems` also judges the rule against the table's replica
identity (a filter on another column, a list leaving a key column out), as for any publication. The
same transaction gives the server's own form of the rule, which tells whether the publication already
has it.

A rule may also ``mask`` columns (:mod:`event_format.masks`): capture writes them hashed, replaced or
truncated. Masks need no column list, so they work on every supported version; they are refused on a
key column (the key identifies the row in the log and the views) and, for ``hash``, without
``CDC_MASK_KEY``. ``cdc setup`` keeps them in the publication's comment (:func:`apply_masks`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

import psycopg
from psycopg import sql

from cdc.capture.catalog import PUBLISHED_FROM, RULE_OF_TABLE
from cdc.capture.coverage import Connection, entry_name, sql_name
from cdc.setup.publication_rule_checks import rule_problems
from derived_views.definitions import CaptureRule
from event_format.masks import COMMENT_QUERY, MESSAGE_PREFIX, Mask, comment_text, from_comment, message_content


@dataclass(frozen=True)
class Clause:
    """One table's entry of a publication: its column list (``None``: every column) and row filter."""

    name: str  #: ``schema.table`` as the views file names it
    columns: tuple[str, ...] | None
    where: str | None

    def entry(self) -> sql.Composed:
        """The table as ``CREATE PUBLICATION ... FOR TABLE`` and ``ALTER PUBLICATION ... ADD TABLE`` take it."""
        parts: list[sql.Composable] = [sql.Identifier(*entry_name(self.name))]
        if self.columns is not None:
            parts.append(sql.SQL(" ({})").format(sql.SQL(", ").join(map(sql.Identifier, self.columns))))
        if self.where is not None:
            parts.append(sql.SQL(" WHERE ({})").format(sql.SQL(self.where)))  # type: ignore[arg-type]
        return sql.Composed(parts)


@dataclass(frozen=True)
class Checked:
    """The rules that passed, by table, each with the server's form of it (attnames, rowfilter), the
    masks declared (by table, then column), and the problems of the others."""

    clauses: dict[str, tuple[Clause, tuple[tuple[str, ...] | None, str | None]]]
    problems: list[str]
    masks: dict[str, dict[str, Mask]] = field(default_factory=dict)


def _filters(rule: CaptureRule) -> bool:
    """Whether ``rule`` needs a column list or a row filter (not masks alone)."""
    return rule.columns is not None or rule.exclude is not None or rule.where is not None


def check_rules(
    conn: Connection, rules: Mapping[str, CaptureRule], tables: list[str], source: str, *, mask_key: bytes | None = None
) -> Checked:
    """Check every declared rule (``tables``: those capture publishes or will, as ``schema.table``;
    ``source``: the views file, for messages; ``mask_key``: ``CDC_MASK_KEY``, which hash masks need)."""
    if any(map(_filters, rules.values())) and int(conn.info.server_version) < 150000:
        return Checked(
            {},
            [
                f"{source}: [capture] `columns`, `exclude` and `where` need PostgreSQL 15 or later (column lists and "
                "row filters); remove them (masks alone work on any version), or upgrade the source"
            ],
        )
    checked: dict[str, tuple[Clause, tuple[tuple[str, ...] | None, str | None]]] = {}
    masks: dict[str, dict[str, Mask]] = {}
    problems: list[str] = []
    for name, rule in sorted(rules.items()):
        where = f'{source}: [capture."{name}"]'
        if name not in tables:
            problems.append(
                f"{where}: {name} is not a table capture publishes; add it to CDC_TABLES (or the publication), or remove the rule"
            )
            continue
        columns = _columns(conn, name)
        named = [*(rule.columns if rule.columns is not None else rule.exclude or []), *rule.mask]
        unknown = [column for column in dict.fromkeys(named) if column not in columns]
        if unknown:
            problems.append(
                f"{where}: {', '.join(unknown)} {'is not a column' if len(unknown) == 1 else 'are not columns'} of "
                f"{name} (its columns: {', '.join(columns)})"
            )
            continue
        mask_problems = _mask_problems(conn, name, rule, mask_key)
        problems += [f"{where}: {problem}" for problem in mask_problems]
        if rule.mask and not mask_problems:
            masks[name] = rule.masks()
        if not _filters(rule):
            continue
        listed = tuple(rule.columns) if rule.columns is not None else None
        if rule.exclude is not None:
            listed = tuple(column for column in columns if column not in rule.exclude)
        clause = Clause(name, listed, rule.where)
        refused, server_form = _probe(conn, clause)
        problems += [f"{where}: {problem}" for problem in refused]
        if not refused:
            checked[name] = (clause, server_form)
    return Checked(checked, problems, masks)


def _mask_problems(conn: Connection, name: str, rule: CaptureRule, mask_key: bytes | None) -> list[str]:
    """What is wrong with ``rule``'s masks: a key column masked, a hash without its key."""
    problems = []
    keys = set(_key_columns(conn, name))
    masked_keys = [column for column in rule.mask if column in keys]
    if masked_keys:
        problems.append(
            f"mask on key column {', '.join(masked_keys)}: the key identifies each row in the log and the views, "
            "so it stays clear; remove the mask (or key the table by another column)"
        )
    if any(mask == "hash" for mask in rule.mask.values()) and not mask_key:
        problems.append("hash masks need CDC_MASK_KEY: set it to a secret of at least 16 bytes (it is never written to the log)")
    return problems


def _key_columns(conn: Connection, name: str) -> list[str]:
    """The columns of the table's primary key and of the index its replica identity names."""
    rows = conn.execute(
        "SELECT DISTINCT a.attname FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid "
        "JOIN pg_namespace n ON n.oid = c.relnamespace JOIN pg_attribute a ON a.attrelid = c.oid "
        "AND a.attnum = ANY (i.indkey) WHERE n.nspname = %s AND c.relname = %s AND (i.indisprimary OR i.indisreplident)",
        entry_name(name),
    ).fetchall()
    return [str(row[0]) for row in rows]


def _columns(conn: Connection, name: str) -> list[str]:
    """The table's columns a publication may list (neither dropped nor generated), in order."""
    rows = conn.execute(
        "SELECT a.attname FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid "
        "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s "
        "AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = '' ORDER BY a.attnum",
        entry_name(name),
    ).fetchall()
    return [str(row[0]) for row in rows]


def _probe(conn: Connection, clause: Clause) -> tuple[list[str], tuple[tuple[str, ...] | None, str | None]]:
    """What PostgreSQL refuses of ``clause`` and what the rule breaks, from a publication of it alone made in
    a transaction that is rolled back; and the server's form of the rule."""
    probe = f"cdc_rule_check_{os.getpid()}"
    problems: list[str] = []
    form: tuple[tuple[str, ...] | None, str | None] = (None, None)
    try:
        with conn.transaction():
            conn.execute(sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(sql.Identifier(probe), clause.entry()))
            problems = [p.replace(f"publication {probe} ", "the rule ") for p in rule_problems(conn, probe)]
            row = conn.execute(f"SELECT {RULE_OF_TABLE} FROM {PUBLISHED_FROM} WHERE p.pubname = %s", (probe,)).fetchone()
            if row is not None:
                form = (tuple(str(c) for c in row[0]) if row[0] is not None else None, _text(row[1]))  # type: ignore[attr-defined]
            raise psycopg.Rollback
    except psycopg.Error as exc:
        message = str(exc).strip().splitlines()[0]
        return [
            f"PostgreSQL refuses the rule: {message}; `where` is a boolean SQL expression over the table's own "
            "columns (no subqueries, no user-defined functions), `columns` and `exclude` name its columns"
        ], form
    return problems, form


def _text(value: object) -> str | None:
    return None if value is None else str(value)


def published_forms(conn: Connection, publication: str) -> dict[str, tuple[tuple[str, ...] | None, str | None]]:
    """The rule each table of ``publication`` has now, in the server's form, by ``schema.table``."""
    rows = conn.execute(
        f"SELECT p.schemaname || '.' || p.tablename, {RULE_OF_TABLE} FROM {PUBLISHED_FROM} WHERE p.pubname = %s",
        (publication,),
    ).fetchall()
    return {
        str(r[0]): (tuple(str(c) for c in r[1]) if r[1] is not None else None, _text(r[2]))  # type: ignore[attr-defined]
        for r in rows
    }


def apply_rules(conn: Connection, publication: str, checked: Checked) -> list[str]:
    """Give each table of the existing ``publication`` its declared rule where it has another (dropped and
    added again in one transaction); the tables changed, as SQL names."""
    now = published_forms(conn, publication)
    changed = [name for name, (_, form) in sorted(checked.clauses.items()) if now.get(name) != form]
    if not changed:
        return []
    with conn.transaction():
        for name in changed:
            clause = checked.clauses[name][0]
            conn.execute(
                sql.SQL("ALTER PUBLICATION {} DROP TABLE {}").format(
                    sql.Identifier(publication), sql.Identifier(*entry_name(name))
                )
            )
            conn.execute(sql.SQL("ALTER PUBLICATION {} ADD TABLE {}").format(sql.Identifier(publication), clause.entry()))
    return [sql_name(entry_name(name)) for name in changed]


def published_masks(conn: Connection, publication: str) -> dict[str, dict[str, Mask]]:
    """The masks ``publication``'s comment holds now (:mod:`event_format.masks`)."""
    row = conn.execute(COMMENT_QUERY, (publication,)).fetchone()
    return from_comment(None if row is None else _text(row[0]))


def apply_masks(conn: Connection, publication: str, masks: dict[str, dict[str, Mask]]) -> list[str]:
    """Give ``publication`` the declared ``masks`` where they differ from what it holds: its comment and,
    in the same transaction, a logical message announcing them, so that a running capture switches at
    exactly that position (see :mod:`event_format.masks`); the tables whose masks changed, as SQL names."""
    now = published_masks(conn, publication)
    changed = sorted(name for name in set(now) | set(masks) if now.get(name, {}) != masks.get(name, {}))
    if not changed:
        return []
    with conn.transaction():
        comment = sql.Literal(comment_text(masks))
        conn.execute(sql.SQL("COMMENT ON PUBLICATION {} IS {}").format(sql.Identifier(publication), comment))
        conn.execute("SELECT pg_logical_emit_message(true, %s, %s::bytea)", (MESSAGE_PREFIX, message_content(publication, masks)))
    return [sql_name(entry_name(name)) for name in changed]
