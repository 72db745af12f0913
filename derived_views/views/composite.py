"""Search indexes and cache entities as plans: a definition of the views file checked against the source.

A *composite* is one row per row of a root table, widened by many-to-one joins (``joins`` of a search
index, ``lookups`` of a cache entity: the joined row whose primary key equals a column of the root, or of
an earlier join, a chain) and, for a cache entity, one-to-many children nested as arrays. :func:`plans`
turns the views file into :class:`Composite` plans, checking every name against the captured tables;
each mistake is one :class:`~derived_views.errors.ViewsFileError` naming the file, the view and the key.

A plan's :attr:`Composite.fingerprint` is a hash of its definition; each commit of the view's output
tables records it (:attr:`Composite.stamp`, :class:`~derived_views.engine.progress.Progress`), so a definition
edited between two syncs is found, and the view asks for ``cdc rebuild`` instead of mixing two definitions.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from derived_views.definitions import CacheDefinition, JoinDefinition, SearchDefinition, ViewDefinitions, check
from derived_views.errors import ViewsFileError
from derived_views.events.schema import TableSchema

#: Source types a search index may tokenize (and arrays of them).
TEXT_TYPES = frozenset({"text", "varchar", "bpchar", "name", "citext"})


@dataclass(frozen=True)
class SourceTable:
    """What a plan needs of a captured table: its names, its columns' types and its primary key."""

    dotted_name: str
    """``schema.table`` as the source spells it (how the views file names it)."""
    log_name: str
    """The table's name in the log (:func:`log_store.topic_names.log_name`)."""
    columns: Mapping[str, str]
    """Column name -> source type name (``pg_type.typname``; ``_elem`` for arrays)."""
    key: tuple[str, ...]
    """Primary-key columns (empty: the table has none)."""


@dataclass(frozen=True)
class Link:
    """A many-to-one join: the row of ``table`` whose key equals ``on`` of ``parent`` (``None``: the root)."""

    alias: str
    table: SourceTable
    parent: str | None
    on: tuple[str, ...]
    columns: tuple[tuple[str, str], ...]
    """``(output name, column of table)``."""


@dataclass(frozen=True)
class Nested:
    """One-to-many children: the rows of ``table`` whose ``on`` columns equal the root's key."""

    alias: str
    table: SourceTable
    on: tuple[str, ...]
    order_by: tuple[str, ...]
    columns: tuple[str, ...]


@dataclass(frozen=True)
class Composite:
    """A checked search index (``kind`` ``search``) or cache entity (``kind`` ``cache``)."""

    kind: str
    name: str
    root: SourceTable
    columns: tuple[str, ...]
    """The root's columns kept, in the table's order."""
    links: tuple[Link, ...]
    """Joins, each after the join it hangs off."""
    children: tuple[Nested, ...] = ()
    text: tuple[str, ...] = ()
    stored: tuple[str, ...] = ()
    filter: str | None = None
    fingerprint: str = ""

    @property
    def view(self) -> str:
        """The view's name: ``search.<index>`` or ``cache.<entity>``."""
        return f"{self.kind}.{self.name}"

    @property
    def stamp(self) -> str:
        """What each output commit records (:attr:`~derived_views.engine.progress.Progress.definition`): the
        fingerprint, then a hash of the output's columns. A definition that keeps a table's columns whole
        gains a column when the source adds (or renames) one: the outputs are then recomputed whole
        once, so no document or entry keeps the old set of columns."""
        shape = [self.output_columns, [(child.alias, child.columns) for child in self.children]]
        return f"{self.fingerprint}/{_fingerprint(shape)}"

    @property
    def tables(self) -> tuple[SourceTable, ...]:
        """Every source table the plan reads, once each, root first."""
        seen: dict[str, SourceTable] = {self.root.log_name: self.root}
        for table in [*(link.table for link in self.links), *(child.table for child in self.children)]:
            seen.setdefault(table.log_name, table)
        return tuple(seen.values())

    @property
    def output_columns(self) -> tuple[str, ...]:
        """The document's (or value's) columns: the root's kept columns, then each join's."""
        return self.columns + tuple(name for link in self.links for name, _ in link.columns)

    def source_type(self, column: str) -> str:
        """Source type name of an output column."""
        if column in self.columns:
            return self.root.columns[column]
        for link in self.links:
            for name, source in link.columns:
                if name == column:
                    return link.table.columns[source]
        raise KeyError(column)


class _Checker:
    """Builds one plan, raising one :class:`ViewsFileError` for the first mistake found."""

    def __init__(self, source: str, view: str, tables: Mapping[str, SourceTable]) -> None:
        self.source = source
        self.view = view
        self.tables = tables
        self.joins = "joins" if view.startswith("search.") else "lookups"
        """What the view's file section calls its many-to-one joins."""

    def fail(self, key: str, problem: str) -> ViewsFileError:
        return ViewsFileError(f"{self.source}: [{self.view}] {key}: {problem}")

    def table(self, key: str, name: str) -> SourceTable:
        if name not in self.tables:
            raise self.fail(
                key,
                f"{name} is not a captured table (captured: {', '.join(sorted(self.tables)) or 'none yet'}); "
                "name a table of the publication as schema.table, or add it to the publication first",
            )
        return self.tables[name]

    def keyed(self, key: str, name: str, why: str) -> SourceTable:
        """The captured table ``name``, which must have a primary key (``why`` says what needs it)."""
        table = self.table(key, name)
        if not table.key:
            raise self.fail(key, f"{table.dotted_name} has no primary key{why}")
        return table

    def reference(self, key: str, on: list[str], holder: SourceTable, target: SourceTable) -> None:
        """``on``, columns of ``holder``, can equal ``target``'s primary key: one existing column per key column."""
        for column in on:
            self.column(key, holder, column)
        if len(on) != len(target.key):
            raise self.fail(
                key,
                f"{len(on)} column(s) cannot equal the primary key of {target.dotted_name} "
                f"({', '.join(target.key)}): name one per key column",
            )

    def column(self, key: str, table: SourceTable, name: str) -> str:
        if name not in table.columns:
            raise self.fail(key, f"{name!r} is not a column of {table.dotted_name} (columns: {', '.join(table.columns)})")
        return name

    def kept(self, key: str, table: SourceTable, names: list[str] | None) -> tuple[str, ...]:
        if names is None:
            return tuple(table.columns)
        self.unique(key, names)
        for name in names:
            self.column(key, table, name)
        return tuple(c for c in table.columns if c in names)

    def unique(self, key: str, names: list[str] | tuple[str, ...]) -> None:
        seen: set[str] = set()
        for name in names:
            if name in seen:
                raise self.fail(key, f"{name!r} is named twice")
            seen.add(name)

    def links(self, key: str, root: SourceTable, joins: Mapping[str, JoinDefinition]) -> tuple[Link, ...]:
        """The joins in an order where each comes after the one it hangs off (a cycle is refused)."""
        ordered: list[Link] = []
        placed: dict[str, SourceTable] = {}
        pending = dict(joins)
        while pending:
            ready = [alias for alias, join in pending.items() if join.from_ is None or join.from_ in placed]
            if not ready:
                for alias, join in pending.items():
                    if join.from_ not in joins:
                        raise self.fail(
                            f"{key}.{alias}.from", f"{join.from_!r} is not one of the {key} (defined: {', '.join(joins)})"
                        )
                raise self.fail(
                    key,
                    f"the joins {', '.join(sorted(pending))} form a cycle through `from`; each join must reach the root table",
                )
            for alias in ready:
                join = pending.pop(alias)
                where = f"{key}.{alias}"
                parent = root if join.from_ is None else placed[join.from_]
                target = self.keyed(
                    f"{where}.table", join.table, ", so `on` cannot find one row of it; add a primary key or join another table"
                )
                self.reference(f"{where}.on", join.on, parent, target)
                for name, column in join.columns.items():
                    self.column(f"{where}.columns.{name}", target, column)
                ordered.append(Link(alias, target, join.from_, tuple(join.on), tuple(join.columns.items())))
                placed[alias] = target
        return tuple(ordered)

    def no_duplicate_outputs(self, columns: tuple[str, ...], links: tuple[Link, ...], children: tuple[str, ...]) -> None:
        # Spark resolves column names without regard to case: `Title` and `title` are one name there
        owner: dict[str, str] = {name.casefold(): "a column of the root" for name in columns}
        for link in links:
            for name, _ in link.columns:
                if name.casefold() in owner:
                    raise self.fail(
                        f"{self.joins}.{link.alias}.columns", f"{name!r} is also {owner[name.casefold()]}: give it another name"
                    )
                owner[name.casefold()] = f"contributed by {link.alias}"
        for alias in children:
            if alias.casefold() in owner:
                raise self.fail(f"children.{alias}", f"{alias!r} is also {owner[alias.casefold()]}: name the child otherwise")


def _fingerprint(*parts: object) -> str:
    """A hash of what shapes a view's output as the file defines it (not of the source's columns: a column
    added to a table that a definition keeps whole is schema evolution, not a new definition)."""
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def search_plan(source: str, name: str, definition: SearchDefinition, tables: Mapping[str, SourceTable]) -> Composite:
    """The checked plan of ``[search.<name>]``."""
    check = _Checker(source, f"search.{name}", tables)
    root = check.table("root", definition.root)
    if not root.key:
        raise check.fail("root", f"{root.dotted_name} has no primary key: a document is one row by its key")
    columns = check.kept("columns", root, definition.columns)
    links = check.links("joins", root, definition.joins)
    check.no_duplicate_outputs(columns, links, ())
    plan = Composite("search", name, root, columns, links)
    outputs = plan.output_columns
    for key, names in (("text", definition.text), ("stored", definition.stored)):
        check.unique(key, names)
        for column in names:
            if column not in outputs:
                raise check.fail(key, f"{column!r} is not a column of the document (columns: {', '.join(outputs)})")
    for column in definition.text:
        type_name = plan.source_type(column)
        if type_name.lstrip("_") not in TEXT_TYPES:
            raise check.fail(
                "text",
                f"{column!r} is {type_name}, not text: only text columns (and arrays of text) "
                "are tokenized; list it under `stored` instead",
            )
    if definition.filter is not None:
        _check_filter(check, definition.filter, outputs)
    return Composite(
        "search",
        name,
        root,
        columns,
        links,
        text=tuple(definition.text),
        stored=tuple(definition.stored),
        filter=definition.filter,
        fingerprint=_fingerprint("search", definition.model_dump(exclude={"stored"})),
    )


def _check_filter(check: _Checker, text: str, outputs: tuple[str, ...]) -> None:
    """The filter parses as a Spark SQL boolean and names only document columns."""
    import sqlglot
    from sqlglot import exp

    try:
        parsed = sqlglot.parse_one(text, dialect="spark")
    except sqlglot.errors.ParseError as exc:
        first = str(exc).splitlines()[0]
        raise check.fail("filter", f"{text!r} does not parse as a Spark SQL expression: {first}") from None
    if isinstance(parsed, (exp.Select, exp.Query)) or parsed.find(exp.Select) is not None:
        raise check.fail("filter", f"{text!r} is a query: write a boolean over the document's columns")
    for column in parsed.find_all(exp.Column):
        if column.table or column.name not in outputs:
            raise check.fail(
                "filter", f"{column.sql(dialect='spark')} is not a column of the document (columns: {', '.join(outputs)})"
            )


def cache_plan(source: str, name: str, definition: CacheDefinition, tables: Mapping[str, SourceTable]) -> Composite:
    """The checked plan of ``[cache.<name>]``."""
    check = _Checker(source, f"cache.{name}", tables)
    root = check.table("root", definition.root)
    if not root.key:
        raise check.fail("root", f"{root.dotted_name} has no primary key: an entry is one row by its key")
    if definition.key is not None and tuple(definition.key) != root.key:
        raise check.fail(
            "key",
            f"{', '.join(definition.key)} is not the primary key of {root.dotted_name} "
            f"({', '.join(root.key)}): an entry is found by the primary key; leave `key` out or name it",
        )
    columns = check.kept("columns", root, definition.columns)
    links = check.links("lookups", root, definition.lookups)
    nested = []
    for alias, child in definition.children.items():
        where = f"children.{alias}"
        table = check.keyed(
            f"{where}.table", child.table, ": a child must be found again when it changes or moves to another parent"
        )
        check.reference(f"{where}.on", child.on, table, root)
        order = tuple(child.order_by) if child.order_by is not None else table.key
        for column in order:
            check.column(f"{where}.order_by", table, column)
        nested.append(Nested(alias, table, tuple(child.on), order, check.kept(f"{where}.columns", table, child.columns)))
    check.no_duplicate_outputs(columns, links, tuple(n.alias for n in nested))
    return Composite(
        "cache", name, root, columns, links, tuple(nested), fingerprint=_fingerprint("cache", definition.model_dump())
    )


def plan_for(definitions: ViewDefinitions, view: str, tables: Mapping[str, SourceTable]) -> Composite:
    """The checked plan of the view ``search.<index>`` or ``cache.<entity>``."""
    kind, name = view.split(".", 1)
    if kind == "search":
        return search_plan(definitions.source, name, definitions.search[name], tables)
    return cache_plan(definitions.source, name, definitions.cache[name], tables)


def plans(definitions: ViewDefinitions, tables: Mapping[str, SourceTable]) -> list[Composite]:
    """Every search index and cache entity of ``definitions``, checked against ``tables`` (by dotted name)."""
    return [plan_for(definitions, view, tables) for view in definitions.view_names() if view != "warehouse"]


def source_tables(schemas: Iterable[TableSchema]) -> dict[str, SourceTable]:
    """What the plans need of each captured table, by ``schema.table``."""
    return {
        schema.dotted_name: SourceTable(
            schema.dotted_name,
            schema.log_name,
            {c.name: c.type_name for c in schema.columns},
            tuple(c.name for c in schema.key_columns),
        )
        for schema in schemas
    }


def checked(definitions: ViewDefinitions, tables: Mapping[str, SourceTable]) -> list[Composite]:
    """Check the whole views file against the captured ``tables`` (by ``schema.table``) and return the
    plans of its search indexes and cache entities; the first mistake raises :class:`ViewsFileError`."""
    check(definitions, list(tables))
    return plans(definitions, tables)
