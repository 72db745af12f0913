"""The condition of a partial read (``cdc snapshot TABLE --where "..."``): what it may say, as SQL capture can run.

A condition selects the rows of one table to read again. Capture runs it, with its own privileges, ANDed
with the publication's row filter, inside the read's ``READ ONLY`` snapshot transaction; so it is held to
what cannot reach further than the rows the publication already publishes:

- one boolean expression (parsed by PostgreSQL's own parser, :mod:`pglast`, and printed back from the
  parse tree, so no text can close the parentheses it is put in, add a clause or a statement);
- over the table's published columns only: a column the publication's column list leaves out could
  otherwise pick rows by a value the log must never reveal, not even by which rows are read again;
- no subquery (``EXISTS``, ``IN (SELECT ...)``, a scalar subquery) and no parameter: nothing but the row
  itself is looked at;
- functions, operators, types and collations of ``pg_catalog`` only: functions, types and the operators
  the printer can qualify are printed qualified with it, and the sessions that run a condition (the
  read's, ``cdc snapshot``'s ``EXPLAIN``) set ``search_path`` to ``pg_catalog`` alone, so the operators
  behind ``LIKE``, ``IN``, ``BETWEEN`` resolve there too: an object of the same name elsewhere is never
  the one called;
- only functions that just compute from their arguments (:func:`checked_condition`): immutable ones, and
  a few stable ones of time (:data:`STABLE_ALLOWED`: ``now()``, ``date_trunc()``...). Stable is not
  enough in general: ``table_to_xml()`` reads whole tables and ``txid_current()`` gives the read's
  transaction an ID (a read holds none); volatile ones act
  (``pg_terminate_backend()``, ``nextval()``). A condition reads the row, it never acts.

Whether it is a valid expression for the table (types, names) PostgreSQL says when ``cdc snapshot`` asks
it to plan the read (``EXPLAIN``), before the request is sent.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cdc.errors import ConfigError

if TYPE_CHECKING:
    from cdc.capture.catalog import Catalog
    from cdc.capture.published_tables import PublishedTable

#: The schema every function and operator of a condition resolves in.
CATALOG = "pg_catalog"
#: ``A_Expr`` kinds whose operator name the printer can print qualified (``OPERATOR(pg_catalog.=)``);
#: the others (LIKE, IN, BETWEEN, DISTINCT...) are SQL syntax over built-in operators.
_QUALIFIABLE_KINDS = frozenset({0, 1, 2})  # AEXPR_OP, AEXPR_OP_ANY, AEXPR_OP_ALL
#: Stable ``pg_catalog`` functions a condition may call: time arithmetic and formatting (stable only because
#: they depend on the session's time zone or the transaction's start).
STABLE_ALLOWED = frozenset({
    "now", "statement_timestamp", "transaction_timestamp", "date_trunc", "date_part", "extract", "date_bin",
    "to_char", "to_date", "to_timestamp", "age", "timezone", "make_timestamptz", "isfinite",
})  # fmt: skip
#: The setting every session that runs a condition has (see the module docstring).
SEARCH_PATH_OPTION = "-c search_path=pg_catalog"
#: Parse-tree nodes a condition may not hold, and why.
_REFUSED = {
    "SubLink": "a subquery",
    "ParamRef": "a parameter",
    "CurrentOfExpr": "CURRENT OF",
    "GroupingFunc": "GROUPING",
    "MultiAssignRef": "a multiple assignment",
}


@dataclass(frozen=True)
class ReadCondition:
    """A checked condition: ``sql``, the expression as PostgreSQL's printer writes it (functions and
    operators qualified), to be put in parentheses; ``functions``, the names of the functions it calls."""

    sql: str
    functions: tuple[str, ...]


class ConditionError(ConfigError):
    """A ``--where`` condition capture will not run."""


def read_condition(text: str, columns: Collection[str]) -> ReadCondition:
    """The condition ``text`` checked against the table's published ``columns`` (module docstring says
    what it may hold); a :class:`ConditionError` saying what is wrong otherwise."""
    from pglast import ast, parse_sql
    from pglast.parser import ParseError
    from pglast.stream import RawStream
    from pglast.visitors import Visitor

    if not text.strip():
        raise ConditionError('--where needs a condition, such as "id % 10 = 0"')
    try:
        statements = parse_sql(f"SELECT 1 WHERE {text}")
    except ParseError as exc:
        raise ConditionError(f"--where {text!r} is not an SQL condition: {exc}") from None
    statement = statements[0].stmt if len(statements) == 1 else None
    if not _only_where(statement):
        raise ConditionError(f"--where {text!r} must be one condition on the table's columns, without other clauses")
    assert isinstance(statement, ast.SelectStmt) and statement.whereClause is not None
    where = statement.whereClause
    functions: list[str] = []
    problems: list[str] = []

    class _Check(Visitor):  # type: ignore[misc]
        def visit(self, _ancestors: object, node: ast.Node) -> None:
            kind = type(node).__name__
            if kind in _REFUSED:
                problems.append(f"it holds {_REFUSED[kind]}")
            elif isinstance(node, ast.ColumnRef):
                names = [getattr(field, "sval", None) for field in node.fields or ()]
                if len(names) != 1 or names[0] is None:
                    problems.append("name columns by their own name alone (no table or schema before it, no *)")
                elif names[0] not in columns:
                    problems.append(f"{names[0]} is not a column the publication publishes of the table")
            elif isinstance(node, ast.FuncCall):
                name = _qualified(node.funcname, problems, "function")
                if name is not None:
                    functions.append(name)
                    node.funcname = (ast.String(sval=CATALOG), ast.String(sval=name))
                if node.over is not None or node.agg_star or node.agg_order or node.agg_filter is not None:
                    problems.append("it holds an aggregate or window function")
            elif isinstance(node, ast.A_Expr) and node.name:
                name = _qualified(node.name, problems, "operator")
                if name is not None and node.kind in _QUALIFIABLE_KINDS:
                    node.name = (ast.String(sval=CATALOG), ast.String(sval=name))
            elif isinstance(node, ast.TypeName):
                name = _qualified(node.names, problems, "type")
                if name is not None:
                    node.names = (ast.String(sval=CATALOG), ast.String(sval=name))
            elif isinstance(node, ast.CollateClause):
                _qualified(node.collname, problems, "collation")

    _Check()(where)
    if problems:
        raise ConditionError(f"--where {text!r} cannot be run: {'; '.join(dict.fromkeys(problems))}")
    return ReadCondition(RawStream()(where), tuple(sorted(set(functions))))


def _only_where(statement: object) -> bool:
    """Whether ``statement`` is ``SELECT 1 WHERE <expression>`` and nothing more."""
    from pglast import ast

    if not isinstance(statement, ast.SelectStmt) or statement.whereClause is None:
        return False
    others = (
        "distinctClause", "intoClause", "fromClause", "groupClause", "havingClause", "windowClause", "valuesLists",
        "sortClause", "limitOffset", "limitCount", "lockingClause", "withClause", "larg", "rarg",
    )  # fmt: skip
    return (
        not any(getattr(statement, name, None) for name in others)
        and len(statement.targetList or ()) == 1
        and getattr(statement.op, "value", statement.op) == 0
    )


def _qualified(names: object, problems: list[str], what: str) -> str | None:
    """The bare name of a function, operator or type named ``names`` (a tuple of ``String`` nodes), when it
    is unqualified or qualified with ``pg_catalog``; else ``None``, with the problem noted."""
    parts = [getattr(part, "sval", None) for part in names or ()]  # type: ignore[attr-defined]
    if len(parts) == 2 and parts[0] == CATALOG:
        parts = parts[1:]
    if len(parts) != 1 or parts[0] is None:
        article = "an" if what[0] in "aeiou" else "a"
        problems.append(f"{article} {what} outside pg_catalog ({'.'.join(str(p) for p in parts)})")
        return None
    return str(parts[0])


def checked_condition(text: str, table: PublishedTable, catalog: Catalog) -> ReadCondition:
    """``text`` as :func:`read_condition` checks it over ``table``'s published columns, calling only
    functions every form of which in ``pg_catalog`` is immutable
    (:meth:`~cdc.capture.catalog.Catalog.not_immutable_functions`), or of :data:`STABLE_ALLOWED`."""
    columns = [name for name, _, _ in table.published_columns(catalog.table(table.relid))]
    condition = read_condition(text, columns)
    refused = [name for name in catalog.not_immutable_functions(condition.functions) if name not in STABLE_ALLOWED]
    if refused:
        raise ConditionError(
            f"--where {text!r} calls {', '.join(refused)}, which may read beyond the row, act, or differ from call to "
            "call (not an immutable function); a condition may only compute from the row's columns"
        )
    return condition


def with_row_filter(row_filter: str | None, condition: str | None) -> str | None:
    """The rows a read selects: the publication's row filter AND the condition (each in its own parentheses)."""
    if condition is None:
        return row_filter
    return f"({row_filter}) AND ({condition})" if row_filter is not None else condition
