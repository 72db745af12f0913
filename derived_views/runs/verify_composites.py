"""Compare a search index's documents or a cache entity's entries with the source, in memory that does not
grow with their size.

The rows the view should hold are computed from the source in the verify's snapshot and streamed, a batch
at a time, through server-side cursors:

- one query joins the root's published rows (its row filter, its column list: a column it does not publish
  is NULL) with each join's, ``LEFT JOIN`` on PostgreSQL's equality of the ``on`` columns and the joined
  table's key (a masked ``on`` column finds no row: the view joins the mask's text);
- for a cache entity, one query per child lists each root's children, both queries in the order of the
  root's key, so the children of a root are gathered as its row comes (one root's children held at a
  time) and sorted by ``order_by``, then the child's key, as the view sorts them;
- a search index's filter is evaluated by Spark over each batch of documents, as the index's sync
  evaluates it.

The view's rows are read with ``deltalake`` (:func:`~derived_views.runs.verify_reads.view_table`): a
document's columns, or an entry's JSON value. Both sides' values are brought to one comparable form
(:func:`~derived_views.runs.verify_values.normalize`, made hashable) and compared as a warehouse table
is (:func:`~derived_views.runs.verify_tables.compare_table`): by bucket hashes first when larger than
it holds at once, then row by row in the buckets that differ, every difference named by the root's key and
the column (and for a child, its position and column).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from derived_views.events.column_names import source_columns
from derived_views.events.schema import TableSchema
from derived_views.runs.published_rules import WHOLE, PublishedRule, Rules
from derived_views.runs.source_relation import relation_sql
from derived_views.runs.verify_hashes import COMPARED
from derived_views.runs.verify_reads import view_table
from derived_views.runs.verify_tables import Layout, Report, Row, batch_rows, compare_table
from derived_views.runs.verify_values import loaded, normalize, quote_identifier
from derived_views.views.composite import Composite, Nested, SourceTable

if TYPE_CHECKING:
    import psycopg

    from derived_views.write.context import ViewContext

#: Rows fetched from a server-side cursor at once, and of the view turned into Python values at once.
_FETCH = 2_000
#: Documents a search index's filter is evaluated over in one Spark job.
FILTERED = 20_000
#: A column's masks by position in a row: the function capture masks its text with.
Masks = list[tuple[int, Callable[[str], str]]]
_NUMBERS = frozenset({"int2", "int4", "int8", "oid", "numeric", "float4", "float8"})
_TEXTS = frozenset({"text", "varchar", "bpchar", "name", "citext"})
_INTEGERS = frozenset({"int2", "int4", "int8", "oid"})
#: Types whose values both sides hold as the text :func:`normalize` leaves as it is.
_PLAIN_TEXT = _TEXTS | {"uuid"}


def compared(value: Any, type_name: str) -> Any:
    """A value of either side (a source value, a document's, a cache entry's JSON value) in its comparable
    form (:func:`normalize`), hashable: arrays as tuples, a JSON document as its canonical text."""
    return _hashable(normalize(value, type_name), type_name)


def compared_form(type_name: str) -> Callable[[Any], Any]:
    """:func:`compared` for one column's values, skipping :func:`normalize` for a value that is its own
    compared form already (an integer, a plain text, a boolean)."""
    if type_name in _INTEGERS:
        return lambda value: value if value.__class__ is int else compared(value, type_name)
    if type_name in _PLAIN_TEXT:
        return lambda value: value if value.__class__ is str else compared(value, type_name)
    if type_name == "bool":
        return lambda value: value if value.__class__ is bool else compared(value, type_name)
    return lambda value: compared(value, type_name)


def _hashable(value: Any, type_name: str) -> Any:
    if value is None:
        return None
    if type_name in ("json", "jsonb"):
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    if isinstance(value, list):
        return tuple(_hashable(element, type_name.lstrip("_")) for element in value)
    return value


def _from_json(value: Any, type_name: str) -> Any:
    """A value of a cache entry's JSON (read with decimals as :class:`~decimal.Decimal`) as the source
    loads it: a float type's numbers as floats."""
    if type_name.lstrip("_") not in ("float4", "float8"):
        return value
    if isinstance(value, list):
        return [_from_json(element, type_name) for element in value]
    return float(value) if isinstance(value, (Decimal, int)) and not isinstance(value, bool) else value


@dataclass(frozen=True)
class CompositeLayout(Layout):
    """A composite's rows as compared: the root's key columns, the output columns, then each child array
    (a tuple of child rows, each a tuple of its columns), every value in its compared form (:func:`compared`)."""

    #: ``(position, alias, columns)`` of each child array.
    children: tuple[tuple[int, str, tuple[str, ...]], ...] = ()

    def key_function(self) -> Callable[[Row], tuple[str, ...]]:
        """The root's key: each key value's ``repr`` (the values are in their compared form already)."""
        key = self.key
        return lambda row: tuple(repr(row[i]) for i in key)

    def differences(self, label: str, source: Mapping[tuple[str, ...], Row], view: Mapping[tuple[str, ...], Row]) -> list[str]:
        """One line per key on one side only, per column whose values differ and, for a child array, its
        length or each child's column that differs, sorted by key."""
        out = [f"{label}: key {key} is in the source but not in the view" for key in sorted(source.keys() - view.keys())]
        out += [f"{label}: key {key} is in the view but not in the source" for key in sorted(view.keys() - source.keys())]
        children = {position: (alias, columns) for position, alias, columns in self.children}
        changed: list[tuple[tuple[str, ...], list[str]]] = []
        for key, left in source.items():
            right = view.get(key)
            if right is None or left == right:
                continue
            lines = []
            for i, name in enumerate(self.names):
                if left[i] == right[i]:
                    continue
                if i in children:
                    lines += _child_lines(f"{label}: key {key} {children[i][0]}", children[i][1], left[i], right[i])
                else:
                    lines.append(f"{label}: key {key} column {name}: source {left[i]!r} != view {right[i]!r}")
            changed.append((key, lines))
        for _, lines in sorted(changed):
            out += lines
        return out


def _child_lines(head: str, columns: tuple[str, ...], source: tuple[Row, ...], view: tuple[Row, ...]) -> list[str]:
    if len(source) != len(view):
        return [f"{head}: {len(source)} in the source, {len(view)} in the view"]
    return [
        f"{head}[{position}] {column}: source {a!r} != view {b!r}"
        for position, (want, have) in enumerate(zip(source, view, strict=True))
        for column, a, b in zip(columns, want, have, strict=True)
        if a != b
    ]


@dataclass(frozen=True)
class _Part:
    """One table as a composite query reads it: its published rows under ``alias``."""

    alias: str
    sql: str
    rule: PublishedRule
    types: Mapping[str, str]
    """The columns read (those the publication publishes), by name: their source types."""

    def column(self, name: str) -> str | None:
        """The column ``name`` as SQL (``None`` when the publication does not publish it)."""
        return f"{self.alias}.{quote_identifier(name)}" if name in self.types else None

    def load(self, name: str) -> str:
        """The column ``name`` as psycopg should load it (masked as capture masks it: the text, masked in
        Python); ``NULL`` when the publication does not publish it (the view holds NULL there)."""
        column = self.column(name)
        return "NULL" if column is None else loaded(column, self.types[name], name in self.rule.masks)

    def joinable(self, name: str) -> str | None:
        """The column ``name`` for a join condition (``None``: it finds no row: not published, or masked)."""
        return None if name in self.rule.masks else self.column(name)


def _part(conn: psycopg.Connection, schema: TableSchema, rule: PublishedRule, alias: str, needed: Iterable[str]) -> _Part:
    """The published rows and the ``needed`` columns of ``schema``'s table as a subquery named ``alias``."""
    wanted = set(needed)
    types = {c.name: c.type_name for c in schema.columns if c.name in wanted and rule.publishes(c.name)}
    table = relation_sql(conn, schema.schema, schema.table)  # its own rows, not its children's
    where = f" WHERE ({rule.row_filter})" if rule.row_filter is not None else ""
    columns = ", ".join(quote_identifier(name) for name in types) or "NULL"
    return _Part(alias, f"(SELECT {columns} FROM {table}{where}) AS {alias}", rule, types)  # noqa: S608 - quoted names


def _equal(left: _Part, left_columns: Iterable[str], right: _Part, right_columns: Iterable[str]) -> str:
    """The SQL condition that each of ``left_columns`` equals its ``right_columns`` counterpart
    (``false`` when one cannot join); columns of types PostgreSQL cannot compare are compared as text."""
    parts = []
    for a, b in zip(left_columns, right_columns, strict=True):
        x, y = left.joinable(a), right.joinable(b)
        if x is None or y is None:
            return "false"
        types = {left.types[a], right.types[b]}
        parts.append(f"{x} = {y}" if len(types) == 1 or types <= _NUMBERS or types <= _TEXTS else f"{x}::text = {y}::text")
    return " AND ".join(parts) or "false"


class CompositeSource:
    """The rows a composite's view should hold, computed from the source in one snapshot (see the module
    docstring); :meth:`batches` reads them again each time it is called."""

    def __init__(
        self,
        conn: psycopg.Connection,
        plan: Composite,
        schemas: Mapping[str, TableSchema],
        rules: Rules,
        passing: Callable[[list[list[Any]]], list[list[Any]]] | None = None,
    ) -> None:
        self.conn = conn
        self.plan = plan
        self.passing = passing
        """The documents a search index's filter keeps (over the key and output columns' source values)."""

        def part(table: SourceTable, alias: str, needed: Iterable[str]) -> _Part:
            schema = schemas[table.log_name]
            return _part(conn, schema, rules.get((schema.schema, schema.table), WHOLE), alias, needed)

        def hanging(owner: str | None) -> set[str]:
            return {c for link in plan.links if link.parent == owner for c in link.on}

        root = part(plan.root, "t0", {*plan.root.key, *plan.columns, *hanging(None)})
        parts: dict[str | None, _Part] = {None: root}
        joins = []
        for index, link in enumerate(plan.links, 1):
            own = {*link.table.key, *(source for _, source in link.columns), *hanging(link.alias)}
            parts[link.alias] = part(link.table, f"t{index}", own)
            condition = _equal(parts[link.parent], link.on, parts[link.alias], link.table.key)
            joins.append(f" LEFT JOIN {parts[link.alias].sql} ON {condition}")
        owners = [(root, c) for c in plan.columns] + [(parts[link.alias], s) for link in plan.links for _, s in link.columns]
        self.masks = [
            (len(plan.root.key) + i, owner.rule.mask_functions[column])
            for i, (owner, column) in enumerate(owners)
            if column in owner.rule.mask_functions
        ]
        self.types = [*(plan.root.columns[c] for c in plan.root.key), *(plan.source_type(c) for c in plan.output_columns)]
        self.forms = [compared_form(t) for t in self.types]
        keys = [root.load(c) for c in plan.root.key]
        texts = [f"{root.column(c) or 'NULL'}::text" for c in plan.root.key]  # how the children find their root
        select = [*keys, *(owner.load(column) for owner, column in owners), *(texts if plan.children else [])]
        order = f" ORDER BY {', '.join(texts)}" if plan.children else ""
        self.root_sql = f"SELECT {', '.join(select)} FROM {root.sql}{''.join(joins)}{order}"  # noqa: S608 - quoted names
        self.children = [self._child(child, part(plan.root, "t0", plan.root.key), part) for child in plan.children]

    def _child(
        self, child: Nested, root: _Part, part: Callable[[SourceTable, str, Iterable[str]], _Part]
    ) -> tuple[Nested, str | None, list[str], Masks]:
        """A child's query (``None``: no child can find its root) listing each root's children in the
        root query's order, its columns read, and its masks by position."""
        columns = list(dict.fromkeys((*child.columns, *child.order_by, *child.table.key)))
        rows = part(child.table, "c", {*columns, *child.on})
        condition = _equal(rows, child.on, root, self.plan.root.key)
        texts = [f"{root.column(c) or 'NULL'}::text" for c in self.plan.root.key]
        masks = [(i, rows.rule.mask_functions[c]) for i, c in enumerate(columns) if c in rows.rule.mask_functions]
        if condition == "false":
            return child, None, columns, masks
        select = ", ".join([*texts, *(rows.load(c) for c in columns)])
        sql = f"SELECT {select} FROM {root.sql} JOIN {rows.sql} ON {condition} ORDER BY {', '.join(texts)}"  # noqa: S608
        return child, sql, columns, masks

    def batches(self) -> Iterator[list[Row]]:
        """The rows, batch by batch, in :func:`composite_layout`'s order and compared forms."""
        width = len(self.types)
        with ExitStack() as stack:
            cursor = stack.enter_context(self.conn.cursor(name="cdc_verify_root"))
            cursor.execute(self.root_sql)
            gathered = [
                _Children(self.plan, child, self._fetched(stack, f"cdc_verify_child{i}", sql), columns, masks)
                for i, (child, sql, columns, masks) in enumerate(self.children)
            ]
            pending: list[list[Any]] = []
            while batch := cursor.fetchmany(_FETCH):
                for row in batch:
                    values = list(row[:width])
                    for i, mask in self.masks:
                        if values[i] is not None:
                            values[i] = mask(values[i])
                    root = row[width:]
                    values += [children.of(root) for children in gathered]
                    pending.append(values)
                    if len(pending) >= (FILTERED if self.passing is not None else _FETCH):
                        yield self._compared(pending)
                        pending = []
            if pending:
                yield self._compared(pending)

    def _fetched(self, stack: ExitStack, name: str, sql: str | None) -> Iterator[Row]:
        if sql is None:
            return iter(())
        cursor = stack.enter_context(self.conn.cursor(name=name))
        cursor.execute(sql)
        return (row for batch in iter(lambda: cursor.fetchmany(_FETCH), []) for row in batch)

    def _compared(self, rows: list[list[Any]]) -> list[Row]:
        if self.passing is not None:
            rows = self.passing(rows)
        forms, width = self.forms, len(self.forms)
        return [(*(form(v) for form, v in zip(forms, row, strict=False)), *row[width:]) for row in rows]


class _Children:
    """One child's rows, in the root query's order: each root's, sorted, in compared form."""

    def __init__(
        self,
        plan: Composite,
        child: Nested,
        rows: Iterator[Row],
        columns: list[str],
        masks: Masks,
    ) -> None:
        self.rows = rows
        self.next: Row | None = next(rows, None)
        self.width = len(plan.root.key)
        self.masks = masks
        at = {c: i for i, c in enumerate(columns)}
        self.order = [(at[c], child.table.columns[c]) for c in (*child.order_by, *child.table.key)]
        self.kept = [(at[c], compared_form(child.table.columns[c])) for c in child.columns]

    def of(self, root: Row) -> tuple[Row, ...]:
        """The children of the root whose key (as text) is ``root``; the next root's are left for it."""
        found = []
        while self.next is not None and tuple(self.next[: self.width]) == tuple(root):
            values = list(self.next[self.width :])
            for i, mask in self.masks:
                if values[i] is not None:
                    values[i] = mask(values[i])
            found.append(values)
            self.next = next(self.rows, None)
        found.sort(key=lambda values: [_order_value(values[i], t) for i, t in self.order])
        return tuple(tuple(form(values[i]) for i, form in self.kept) for values in found)


def _order_value(value: Any, type_name: str) -> tuple[bool, bool, Any]:
    """Where a value sorts among a child column's, as the view sorts them: NULL first, NaN last."""
    if value is None:
        return (False, False, 0)
    value = normalize(value, type_name)
    if value == "NaN" and type_name in _NUMBERS:
        return (True, True, 0)
    return (True, False, 0.0 if value == "-0" and type_name in _NUMBERS else value)


def composite_layout(plan: Composite) -> CompositeLayout:
    """How :class:`CompositeSource` and :func:`view_rows` lay out a composite's rows."""
    key = plan.root.key
    names = (*key, *plan.output_columns, *(child.alias for child in plan.children))
    types = (*(plan.root.columns[c] for c in key), *(COMPARED for _ in names[len(key) :]))
    start = len(key) + len(plan.output_columns)
    children = tuple((start + i, child.alias, child.columns) for i, child in enumerate(plan.children))
    return CompositeLayout(names, types, tuple(range(len(key))), True, children)


def view_rows(path: str, plan: Composite) -> tuple[int, Callable[[], Iterator[list[Row]]]]:
    """The rows of the composite's view table at ``path`` (a search index's documents, a cache entity's
    entries) as :func:`composite_layout` lays them out, and its row count (from its Delta log)."""
    keys = [(c, compared_form(plan.root.columns[c])) for c in plan.root.key]
    types = [plan.source_type(c) for c in plan.output_columns]
    forms = [compared_form(t) for t in types]
    if plan.kind == "search":
        names = ("_cdc_key", *plan.output_columns)
        read = Layout(names, ("text",) * len(names), (0,))
        table = view_table(path, plan.view, read, names)

        def document(row: Row) -> Row:
            key = json.loads(row[0])
            return (*(form(key.get(c)) for c, form in keys), *(form(v) for form, v in zip(forms, row[1:], strict=True)))

        return table.rows, lambda: ([document(row) for row in batch_rows(piece)] for piece in _pieces(table.batches()))
    read = Layout(("_cdc_key", "value"), ("text", "text"), (0,))
    table = view_table(path, plan.view, read, read.names)
    outputs = _forms(dict(zip(plan.output_columns, types, strict=True)), plan.output_columns)
    children = [(child.alias, _forms(child.table.columns, child.columns)) for child in plan.children]

    def entry(row: Row) -> Row:
        key, value = json.loads(row[0]), json.loads(row[1] or "{}", parse_float=Decimal)
        return (
            *(form(key.get(c)) for c, form in keys),
            *(form(_from_json(value.get(c), t)) for c, t, form in outputs),
            *(
                tuple(tuple(form(_from_json(item.get(c), t)) for c, t, form in columns) for item in value.get(alias) or ())
                for alias, columns in children
            ),
        )

    return table.rows, lambda: ([entry(row) for row in batch_rows(piece)] for piece in _pieces(table.batches()))


def _pieces(batches: Iterable[Any]) -> Iterator[Any]:
    """Record batches cut into pieces of at most :data:`_FETCH` rows."""
    for batch in batches:
        for start in range(0, batch.num_rows, _FETCH):
            yield batch.slice(start, _FETCH)


def _forms(types: Mapping[str, str], columns: Iterable[str]) -> list[tuple[str, str, Callable[[Any], Any]]]:
    """Each of ``columns``: its name, its type (in ``types``) and its :func:`compared_form`."""
    return [(c, types[c], compared_form(types[c])) for c in columns]


def search_filter(ctx: ViewContext, plan: Composite, documents: str) -> Callable[[list[list[Any]]], list[list[Any]]] | None:
    """The search index's filter as Spark evaluates it, over rows of the root's key and the output
    columns' source values (``None`` without a filter): the rows it keeps. Each value is given the type
    the index's documents table holds the column in.

    Only the columns the filter names are sent to Spark, and each combination of their values once
    (the answers kept for the next rows, up to :data:`FILTERED` of them): a filter over a few columns of
    few values (``published AND price >= 0``) costs a Spark job for the first batch of rows, and little
    after it."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    condition = plan.filter
    if not condition:
        return None
    fields = {f.name: f for f in ctx.spark.read.format("delta").load(documents).schema.fields}
    held = source_columns(plan.output_columns, fields)
    named = _named(condition, plan.output_columns)
    types = [fields[held[c]].dataType if c in held else StringType() for c in named]
    schema = StructType([StructField("_cdc_row", LongType()), *(StructField(c, t) for c, t in zip(named, types, strict=True))])
    positions = [len(plan.root.key) + plan.output_columns.index(c) for c in named]
    answers: dict[str, bool] = {}

    def cell(value: Any, spark_type: Any) -> Any:
        if value is not None and isinstance(spark_type, StringType) and not isinstance(value, str):
            return json.dumps(value) if isinstance(value, (list, dict)) else str(value)
        return value

    def passing(rows: list[list[Any]]) -> list[list[Any]]:
        if len(answers) > FILTERED:
            answers.clear()
        keys = [repr([row[i] for i in positions]) for row in rows]
        asked = {key: row for key, row in zip(keys, rows, strict=True) if key not in answers}
        if asked:
            order = list(asked)
            data = [(n, *(cell(asked[key][i], t) for i, t in zip(positions, types, strict=True))) for n, key in enumerate(order)]
            frame = ctx.spark.createDataFrame(data, schema).filter(F.expr(condition))
            kept = {row["_cdc_row"] for row in frame.select("_cdc_row").collect()}
            answers.update((key, n in kept) for n, key in enumerate(order))
        return [row for key, row in zip(keys, rows, strict=True) if answers[key]]

    return passing


def _named(condition: str, columns: tuple[str, ...]) -> list[str]:
    """The ``columns`` the Spark SQL ``condition`` names (Spark resolves names without regard to case);
    every one when it does not parse."""
    import sqlglot
    from sqlglot import exp

    try:
        parsed = sqlglot.parse_one(condition, dialect="spark")
    except sqlglot.errors.ParseError:
        return list(columns)
    names = {column.name.casefold() for column in parsed.find_all(exp.Column)}
    return [c for c in columns if c.casefold() in names]


def compare_composite(
    ctx: ViewContext,
    conn: psycopg.Connection,
    plan: Composite,
    schemas: Mapping[str, TableSchema],
    rules: Rules,
    report: Report,
    path: str,
    estimated_rows: float,
) -> None:
    """The composite's view table at ``path`` against the rows computed from the source (see the module
    docstring), every difference added to ``report``; ``estimated_rows``: the root table's rows, as far
    as the source's statistics know them."""
    label = f"{plan.view} {path.rstrip('/').rsplit('/', 1)[-1]}"
    layout = composite_layout(plan)
    rows, view = view_rows(path, plan)
    passing = search_filter(ctx, plan, path) if plan.kind == "search" else None
    source = CompositeSource(conn, plan, schemas, rules, passing)
    report.compared += compare_table(label, layout, source.batches, view, max(float(rows), estimated_rows), report)
